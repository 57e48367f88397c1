"""The training pool: tournament rounds on a rank (``rounds``), the pure selection rules
(``rules``: no I/O, no MPI), what PBT explores (``hparams``), fitness on common start states
(``fitness``), the shared-filesystem leaderboard and its entry files (``leaderboard``,
``entryfiles``), and asynchronous PBT's population (``population``)."""
