"""Tables and figures of run directories in one command.

    python -m analysis.make_figures RUN_DIR [RUN_DIR ...] --out figures/ \\
        [--label NAME=RUN_DIR ...] [--target -250 | --target TASK=RETURN ...] [--formats png pdf] \\
        [--metric return|cumulative_return] [--reference SYSTEM] [--reduce mean|best]

A RUN_DIR may also be a folder of run directories (e.g. ``runs/bench-learning``). A labelled
run directory (``--label``) need not be repeated as a RUN_DIR; its curves carry NAME (else the
run's config name). Writes into ``--out``:

- ``evals.csv`` (and ``evals.parquet`` if pyarrow is installed): one row per run x pod x evaluation;
- ``runs.csv``: one row per run (resources, throughput, best/final return, time to ``--target``);
- ``scaling.csv`` and ``scaling.md``: one row per system x task x pods (time to target over seeds,
  throughput, speed-up, efficiency, ratio to ``--reference``, default the first system);
  ``device.md``: the same target in device-equivalent time (``docs/studies.md``);
- ``tournament.csv``: one row per run x pod x tournament round (when a run has a tournament);
- ``experiments.md``: one row per series with its runs (its seeds), and why runs of one system
  were not pooled (their configs differ in more than the seed: report/runs.py);
- ``learning_curves.{png,pdf}`` (mean and 95% t-interval over runs, each run's pods reduced by
  ``--reduce``: their mean, default, or the best pod; the runs themselves with fewer than 3),
  ``scaling.{png,pdf}``, ``device_time.{png,pdf}`` (device-equivalent time vs pods, log-log, when
  the runs have it);
- ``lineage_<run>.{png,pdf}`` per tournament run, ``hparams_<run>.{png,pdf}`` per run whose
  hyperparameters changed (PBT).

Prints the paths it wrote; exit code 2 (with a message) for a path that is not a run directory.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from podracer_hpc.report.aggregate import (
    METRICS,
    DeviceModel,
    Targets,
    device_markdown,
    eval_table,
    parse_targets,
    run_table,
    scaling_markdown,
    scaling_table,
    tournament_table,
)
from podracer_hpc.report.curves import REDUCERS
from podracer_hpc.report.runs import Run, RunDirError, load_runs

__all__ = ["experiments_markdown", "make_figures", "main"]


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("_") or "run"


def make_figures(
    run_dirs: Iterable[str | Path],
    out: str | Path,
    labels: Mapping[str, str | Path] | Sequence[str] | None = None,
    target: Targets = None,
    formats: Sequence[str] = ("png", "pdf"),
    dpi: int = 150,
    metric: str = "return",
    reference: str | None = None,
    per_run: bool = True,
    reduce: str = "mean",
    device: DeviceModel | None = None,
) -> list[Path]:
    """Write the tables and figures of the given runs into ``out``; returns the written paths.

    ``target``: a value of ``metric`` for every task, or ``{task: value}``; ``metric``: ``return``
    (evaluation return) or ``cumulative_return`` (stock trading: the evaluation episodes'
    cumulative return on the training window, a fraction). ``reference``: the system the
    scaling table's ``time_ratio`` divides by (default: the first). ``per_run=False`` leaves out
    the per-run figures (lineage, hyperparameters): a study's report has many runs. ``reduce``:
    how the learning curves make one curve of a run's pods (``"mean"`` or ``"best"``). ``device``:
    the constants of device-equivalent time (a study's; default :class:`DeviceModel`'s: each
    system's own one-pod runs)."""
    from podracer_hpc.report import plots  # matplotlib only when drawing

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(list(run_dirs), labels)
    evals, table, tour = eval_table(runs), run_table(runs, target, metric, device), tournament_table(runs)
    sc = scaling_table(table, reference)
    written = [evals.to_csv(out / "evals.csv")]
    pq = evals.to_parquet(out / "evals.parquet")
    if pq is not None:
        written.append(pq)
    written.append(table.to_csv(out / "runs.csv"))
    written.append(sc.to_csv(out / "scaling.csv"))
    (out / "scaling.md").write_text(scaling_markdown(sc))
    written.append(out / "scaling.md")
    if target is not None:
        (out / "device.md").write_text(device_markdown(sc))
        written.append(out / "device.md")
    if len(tour):
        written.append(tour.to_csv(out / "tournament.csv"))
    (out / "experiments.md").write_text(experiments_markdown(runs))
    written.append(out / "experiments.md")

    def save(fig, stem: str) -> None:
        for fmt in formats:
            path = out / f"{stem}.{fmt}"
            fig.savefig(path, dpi=dpi)
            written.append(path)

    save(plots.learning_curves(evals, target=target if metric == "return" else None, reduce=reduce), "learning_curves")
    save(plots.scaling(table, evals, target=target, reference=reference), "scaling")
    if target is not None:
        save(plots.device_time(table, reference), "device_time")
    for run in runs if per_run else []:
        if run.mode == "none" or not len(tour) or not (tour["run"] == run.run).any():
            continue
        save(plots.lineage(tour, run.run, evals), f"lineage_{_slug(run.run)}")
        space = (run.config.get("tournament") or {}).get("hparam_space") or {}
        fig = plots.hparam_trajectories(tour, run.run, space)
        if fig is not None:
            save(fig, f"hparams_{_slug(run.run)}")
    return written


def experiments_markdown(runs: Sequence[Run]) -> str:
    """One row per series (task x system x pods): how many runs it pools (its seeds) and which;
    then why runs of one system were not pooled (report/runs.py: split_experiments)."""
    rows: dict[tuple[str, str, int], list[Run]] = {}
    for r in runs:
        rows.setdefault((r.task, r.system, r.pods), []).append(r)
    lines = [
        "Runs are pooled as seeds only when their configs differ in nothing but the seed (and how they log).",
        "",
        "| task | series | pods | runs | seeds | run directories |",
        "|---|---|---:|---:|---|---|",
    ]
    for (task, system, pods), rs in sorted(rows.items()):
        seeds = ", ".join(str(r.config.get("seed", "?")) for r in rs)
        lines.append(f"| {task} | {system} | {pods} | {len(rs)} | {seeds} | {', '.join(r.run for r in rs)} |")
    reasons = sorted({r.not_pooled for r in runs if r.not_pooled})
    if reasons:
        lines += ["", *(f"- {x}" for x in reasons)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m analysis.make_figures",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="A RUN_DIR may be a folder of run directories.",
    )
    p.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="run directories (podracer train --run-dir)")
    p.add_argument("--out", default="figures", help="output folder (default: figures)")
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME=RUN_DIR",
        help="name the curves of RUN_DIR (repeatable; default: the run's config name)",
    )
    p.add_argument(
        "--target",
        action="append",
        default=None,
        metavar="RETURN|TASK=RETURN",
        help="target evaluation return for the time-to-target columns and panel: one number for "
        "every task, or TASK=RETURN (repeatable), e.g. --target pendulum=-250 --target cartpole=475",
    )
    p.add_argument(
        "--metric",
        default="return",
        choices=list(METRICS),
        help="what --target is a value of: the evaluation return, or (stock trading) the evaluation "
        "episodes' cumulative return on the training window, as a fraction (0.5 = +50%%)",
    )
    p.add_argument(
        "--reference",
        default=None,
        metavar="SYSTEM",
        help="the system the scaling table's time ratio divides by (default: the first)",
    )
    p.add_argument(
        "--reduce",
        default="mean",
        choices=list(REDUCERS),
        help="learning curves: one curve per run from its pods' mean (default) or its best pod at each "
        "point; the band is then over runs",
    )
    p.add_argument("--formats", nargs="+", default=["png", "pdf"], help="figure formats (default: png pdf)")
    p.add_argument("--dpi", type=int, default=150)
    a = p.parse_args(argv)
    if not a.run_dirs and not a.label:
        p.error("give at least one RUN_DIR (or --label NAME=RUN_DIR)")
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    try:
        paths = make_figures(
            a.run_dirs,
            a.out,
            a.label,
            parse_targets(a.target),
            a.formats,
            a.dpi,
            a.metric,
            a.reference,
            reduce=a.reduce,
        )
    except (RunDirError, ValueError) as e:
        print(f"make_figures: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
