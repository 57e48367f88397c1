"""The training-diagnostics figure of one run: how PPO's updates went, pod by pod.

    python -m analysis.diagnostics RUN_DIR [--out diagnostics.png] [--dpi 150]

One panel per quantity of the rank logs' ``/train`` group (one row per PPO update,
docs/hdf5-schema.md) against the pod's environment steps, one line per pod (MPI rank):

- ``approx_kl``: the approximate KL divergence between the policy before and after an update
  (a mean over its minibatches): large values mean steps too big for the clip to hold;
- ``clipfrac``: the fraction of samples whose probability ratio the clip cut;
- ``entropy``: the policy's entropy (exploration left);
- ``explained_variance``: how much of the returns' variance the value function explains (1 is
  perfect, 0 no better than a constant, below 0 worse);
- ``learning_rate``: the step size of each update (annealing; PBT's changes).

:func:`training_diagnostics` returns a :class:`matplotlib.figure.Figure` built without pyplot,
like :mod:`analysis.plots`. Exit code 2 (with a message) for a path that is not a run directory.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from podracer_hpc.report.plots import STEPS
from podracer_hpc.report.runs import Run, RunDirError, load_run
from podracer_hpc.report.style import empty_panel, series_color

__all__ = ["DIAGNOSTICS", "main", "training_diagnostics"]

DIAGNOSTICS = (
    ("approx_kl", "approximate KL (before || after an update)"),
    ("clipfrac", "clip fraction"),
    ("entropy", "policy entropy"),
    ("explained_variance", "explained variance of the returns"),
    ("learning_rate", "learning rate"),
)


def training_diagnostics(run: Run | str | Path, width: float = 13.0, height: float = 7.4) -> Figure:
    """KL, clip fraction, entropy, explained variance and learning rate over env steps, one line
    per pod, for one run (a :class:`analysis.aggregate.Run` or its directory). Each panel's lines
    (``ax.lines``) are its pods, in rank order, labelled ``pod <r>``; the sixth cell holds the legend."""
    if not isinstance(run, Run):
        run = load_run(run)
    pods = sorted(run.logs)
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(2, 3, squeeze=False).ravel()
    for ax, (col, title) in zip(axes, DIAGNOSTICS):
        vals: list[float] = []
        for r in pods:
            train = run.logs[r].get("train") or {}
            if col not in train or "env_steps" not in train or not len(train["env_steps"]):
                continue
            x = np.asarray(train["env_steps"], dtype=float)
            y = np.asarray(train[col], dtype=float)
            ax.plot(
                x,
                y,
                color=series_color(r),
                lw=1.2,
                alpha=0.9,
                marker="o" if len(x) < 30 else None,
                ms=2.5,
                label=f"pod {r}",
            )
            vals += [v for v in y.tolist() if math.isfinite(v)]
        if not ax.lines:
            empty_panel(ax, "no updates logged")
            ax.set_title(title, fontsize=11)
            continue
        log = col == "learning_rate" and vals and min(vals) > 0 and max(vals) / min(vals) > 20  # PBT's jumps
        if log:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("environment steps per pod")
        ax.set_ylabel(col + (" (log scale)" if log else ""))
        ax.xaxis.set_major_formatter(STEPS)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.grid(alpha=0.3)
    legend_ax = axes[len(DIAGNOSTICS)]
    legend_ax.axis("off")
    shown = pods[:24]
    if shown:
        handles = [Line2D([], [], color=series_color(r), lw=1.5) for r in shown]
        more = len(pods) - len(shown)
        labels = [f"pod {r}" for r in shown] + ([f"... {more} more"] if more > 0 else [])
        if len(labels) > len(handles):
            handles.append(Line2D([], [], color="none"))
        legend_ax.legend(
            handles,
            labels,
            loc="center",
            ncols=max(1, min(3, math.ceil(len(labels) / 8))),
            frameon=False,
            fontsize=9,
            title=f"{len(pods)} pod{'s' * (len(pods) != 1)}",
        )
    fig.suptitle(f"training diagnostics: {run.run} ({run.task or 'unknown task'}, {run.system})", fontsize=12)
    return fig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.diagnostics", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (podracer train --run-dir)")
    p.add_argument("--out", default="diagnostics.png", help="the figure file (default diagnostics.png; .pdf, .svg too)")
    p.add_argument("--dpi", type=int, default=150)
    a = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    try:
        fig = training_diagnostics(a.run_dir)
    except RunDirError as e:
        print(f"diagnostics: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=a.dpi)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
