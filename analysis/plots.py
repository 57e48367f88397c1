"""`analysis.plots` is `podracer_hpc.report.plots` (see analysis/__init__.py)."""

from analysis._alias import alias

alias(__name__, "plots")
