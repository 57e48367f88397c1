"""The rank program: what one MPI rank runs, as a short loop of named steps (``program``), which
checkpoint it resumes from (``resume``), the loop's own state in a checkpoint (``state``), and the
faults a test may inject (``faults``)."""
