"""Tables and figures from run directories: the analysis the package itself needs (``podracer
study``'s report) and that ``analysis/`` (scripts, notebooks) names for a checkout.

- :mod:`.runs`: run directories read (config, rank logs, summary, resources), labels;
- :mod:`.tables`: named numpy columns, CSV;
- :mod:`.aggregate`: the tidy tables (evaluations, runs, tournament decisions, scaling) and time
  to a target;
- :mod:`.curves`: learning curves over runs (each run's pods reduced first), exact t-bands;
- :mod:`.plots`, :mod:`.figures` (``python -m analysis.make_figures``), :mod:`.diagnostics`.
"""
