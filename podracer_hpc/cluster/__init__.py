"""What a cluster gives a rank: MPI (``mpi``, the only mpi4py user), the PyPI mpich wheel's needs
(``mpich``), the ``podracer mpirun`` signal relay (``mpirun``), device and CPU binding
(``device``), warning signals (``signals``) and what Slurm says about jobs (``jobstate``)."""
