"""Analysis of podracer-hpc runs: tidy tables from the per-rank HDF5 logs, and figures.

The code lives in the package (``podracer_hpc.report``: what the package itself imports must be
inside it, and the wheel installs no top-level ``analysis``); the modules here are its names for
scripts, the notebook and users of a checkout.

- :mod:`analysis.aggregate`: load run directories, build tables (one row per run x pod x
  evaluation; per run; per tournament decision), time to a target return, mean curves over runs
  with t-intervals (each run's pods reduced first), CSV/Parquet output;
- :mod:`analysis.plots`: learning curves, scaling, tournament lineage, PBT hyperparameters
  (matplotlib ``Figure`` objects, no pyplot state);
- :mod:`analysis.make_figures`: ``python -m analysis.make_figures RUN_DIR ... --out figures/``.
"""

from podracer_hpc.report.aggregate import (
    Run,
    Table,
    eval_table,
    expand_run_dirs,
    load_runs,
    read_csv,
    run_table,
    time_to_target,
    tournament_table,
)

__all__ = [
    "Run",
    "Table",
    "eval_table",
    "expand_run_dirs",
    "load_runs",
    "read_csv",
    "run_table",
    "time_to_target",
    "tournament_table",
]
