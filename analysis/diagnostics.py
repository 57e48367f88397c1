"""`analysis.diagnostics` is `podracer_hpc.report.diagnostics` (see analysis/__init__.py)."""

from analysis._alias import alias

alias(__name__, "diagnostics")
