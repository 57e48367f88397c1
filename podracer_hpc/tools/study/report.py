"""The report of a study: tables and figures of its finished runs (each system's runs labelled
by its name), the scaling table, a summary."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from podracer_hpc.tools.study.execute import is_done
from podracer_hpc.tools.study.schema import ROOT, Study, load_study

__all__ = ["report", "study_runs"]


def report(study: Study, out: Any = None) -> dict[str, Any]:
    """Tables and figures of the study's finished runs into ``<out>/results``; prints the scaling
    table. Returns a summary (the JSON line)."""
    import matplotlib

    matplotlib.use("Agg")
    from podracer_hpc.report.aggregate import device_markdown, scaling_markdown
    from podracer_hpc.report.figures import make_figures
    from podracer_hpc.report.tables import read_csv

    out = out or sys.stdout
    done = [pt for pt in study.runs() if is_done(pt)]
    results = study.out / "results"
    summary: dict[str, Any] = {
        "study": study.name,
        "task": study.task,
        "metric": study.metric,
        "target": study.target,
        "runs": len(study.runs()),
        "done": len(done),
        "results": str(results),
    }
    if not done:
        print(f"study {study.name}: no finished runs yet in {study.out / 'runs'}", file=sys.stderr)
        summary["rows"] = []
        return summary
    labels = [f"{pt.system.name}={pt.run_dir}" for pt in done]
    make_figures(
        [],
        results,
        labels=labels,
        target={study.task: study.target},
        metric=study.metric,
        reference=study.systems[0].name,
        formats=("png", "pdf"),
        dpi=130,
        per_run=False,
        device=study.device,
    )
    sc = read_csv(results / "scaling.csv")
    md = scaling_markdown(sc)
    (results / "scaling.md").write_text(md)
    print(
        f"{study.task}: time to {study.metric} {study.target:g} (training seconds, median [min, max] over seeds); "
        f"{len(done)} of {len(study.runs())} runs done",
        file=out,
    )
    print(md, file=out, end="")
    print(
        f"{study.task}: device-equivalent time to {study.metric} {study.target:g} (one device per pod; "
        "docs/studies.md; ≥: a seed that never reached it, at its budget)",
        file=out,
    )
    print(device_markdown(sc), file=out, end="")
    keep = (
        "system",
        "pods",
        "seeds",
        "reached",
        "time_to_target_median",
        "time_to_target_bound",
        "steps_per_s_median",
        "speedup",
        "efficiency",
        "time_ratio",
        "time_ratio_bound",
        "env_steps_per_pod_to_target_median",
        "device_s_mean",
        "device_s_ci",
        "device_s_censored",
        "device_s_bound",
        "device_step_s",
        "device_step_source",
    )
    summary["rows"] = [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items() if k in keep}
        for r in sc.rows()
    ]
    (results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def study_runs(path: Any) -> dict[str, Any]:
    """What the analysis needs to draw a study folder (or file): ``labels`` (``NAME=RUN_DIR`` of
    every finished run), ``target`` (``{task: value}``), ``metric``, ``reference`` (the first
    system), and the ``study`` itself. Used by the notebook (``PODRACER_STUDY``)."""
    study = load_study(path)
    done = [pt for pt in study.runs() if is_done(pt)]
    return {
        "labels": [f"{pt.system.name}={pt.run_dir}" for pt in done],
        "target": {study.task: study.target},
        "metric": study.metric,
        "reference": study.systems[0].name,
        "study": study,
        "root": str(ROOT),
    }
