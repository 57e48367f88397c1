"""`analysis.make_figures` is `podracer_hpc.report.figures` (see analysis/__init__.py)."""

from analysis._alias import alias

alias(__name__, "figures")
