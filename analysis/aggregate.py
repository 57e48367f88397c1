"""`analysis.aggregate` is `podracer_hpc.report.aggregate` (see analysis/__init__.py)."""

from analysis._alias import alias

alias(__name__, "aggregate")
