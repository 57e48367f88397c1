"""What a run leaves on disk: the run directory (``rundir``, the one module that knows its
layout), checksummed tensor files (``safeio``), atomic writes (``atomic``), the per-rank HDF5 logs
(``h5log``, ``h5recover``, ``h5arrays``: the only h5py users), typed tournament records
(``records``), the run's summary (``summary``) and the files the project ships (``shipped``)."""
