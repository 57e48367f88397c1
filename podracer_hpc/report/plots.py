"""Figures from the tables of :mod:`analysis.aggregate`.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (no global
state; it displays in a notebook and saves with ``fig.savefig``) and laid out with
``constrained_layout`` so that no text overlaps:

- :func:`learning_curves`: evaluation return vs env steps and vs wall time, one row per task;
  per system (x resource point in a scaling study) the mean over its runs (seeds; each run's pods
  reduced first) and a 95% t-interval over runs, or the runs themselves when fewer than 3;
- :func:`scaling`: per system (the ``--label`` names), time to a target vs resources (median and
  band over seeds, ideal scaling), throughput vs resources, and scaling efficiency, and (when the
  run table has it) device-equivalent time to the target;
- :func:`device_time`: the paper's figure: device-equivalent time to the target against pods,
  log-log, the ideal line, one line per system, censored seeds drawn at their bound;
- :func:`lineage`: which pod took which agent at each tournament round, the winner's ancestry;
- :func:`hparam_trajectories`: hyperparameters of each pod over env steps (PBT).
"""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

from podracer_hpc.report.aggregate import Targets, target_for
from podracer_hpc.report.curves import MIN_RUNS_FOR_BAND, REDUCERS, mean_curve
from podracer_hpc.report.lineage import ancestry, lineage
from podracer_hpc.report.style import empty_panel, series_color
from podracer_hpc.report.tables import Table

__all__ = [
    "learning_curves",
    "scaling",
    "device_time",
    "lineage",
    "ancestry",
    "hparam_trajectories",
    "fmt_steps",
    "text_overlaps",
]


def fmt_steps(x: float, _pos: Any = None) -> str:
    """Tick label for step counts: 0, 500, 50k, 1M, 1.5M, 2B."""
    a = abs(x)
    for div, suf in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{x / div:.3g}{suf}"
    return f"{x:.0f}"


STEPS = FuncFormatter(fmt_steps)


def _series(evals: Table, systems: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """The learning-curve series: one per system, or, for a system whose runs are at several
    resource points (a scaling study's ``pods``), one per system x point: runs at different
    points are different experiments, the runs at one point its seeds. ``(name, where)`` each."""
    out: list[tuple[str, dict[str, Any]]] = []
    for system in systems:
        s = evals.where(system=system)
        points = sorted({int(p) for p in s["pods"].tolist()}) if "pods" in s and len(s) else []
        if len(points) > 1:
            out += [(f"{system}, {p} pod{'s' * (p != 1)}", {"system": system, "pods": p}) for p in points]
        else:
            out.append((str(system), {"system": system}))
    return out


def _runs_label(counts: set[int]) -> str:
    """``3 runs``, or ``2-3 runs per task`` when the tasks differ."""
    lo, hi = min(counts), max(counts)
    return f"{lo} run{'s' * (lo != 1)}" if lo == hi else f"{lo}-{hi} runs per task"


def _draw_series(ax: Any, c: dict[str, Any], color: str) -> tuple[str, Any]:
    """One series on one panel: with at least :data:`MIN_RUNS_FOR_BAND` runs the mean over runs
    and its t-interval where that many have data; with fewer each run's (reduced) curve.
    Returns what was drawn (``"band"``, ``"mean"`` or ``"runs"``) and a line for the legend."""
    marker = "o" if len(c["x"]) < 30 else None
    if len(c["runs"]) < MIN_RUNS_FOR_BAND:
        lines = [ax.plot(c["x"], row, color=color, lw=1.1, alpha=0.9, marker=marker, ms=2.5)[0] for row in c["curves"]]
        return "runs", lines[0]
    (line,) = ax.plot(c["x"], c["mean"], color=color, lw=1.8, marker=marker, ms=3)
    band = np.isfinite(c["lo"])
    if not band.any():
        return "mean", line
    ax.fill_between(c["x"], c["lo"], c["hi"], where=band, color=color, alpha=0.18, lw=0)
    return "band", line


def _drawn_notes(drawn: set[str], reduce: str) -> list[tuple[str, Any]]:
    """Legend entries saying what the curves are: only for what some panel drew."""
    each = REDUCERS[reduce]
    notes = []
    if drawn & {"band", "mean"}:
        notes.append((f"thick line: mean over runs (each run: {each})", Line2D([], [], color="0.4", lw=1.8)))
    if "band" in drawn:
        notes.append(
            (
                f"shaded: its 95% t-interval over runs, within the runs' range (where ≥ {MIN_RUNS_FOR_BAND} have data)",
                Patch(color="0.5", alpha=0.3, lw=0),
            )
        )
    if "runs" in drawn:
        notes.append(
            (f"thin lines: each run ({each}); < {MIN_RUNS_FOR_BAND} runs, no band", Line2D([], [], color="0.4", lw=1.1))
        )
    return notes


def _legend_columns(labels: Sequence[str], width_in: float, fontsize: float = 9.0) -> int:
    """As many columns (at most 3) as the longest label lets fit across the figure."""
    per_label_pt = 0.55 * fontsize * max(len(s) for s in labels) + 45  # characters, handle and gap
    return max(1, min(3, len(labels), int(width_in * 72 * 0.95 // per_label_pt)))


def learning_curves(
    evals: Table,
    target: Targets = None,
    systems: Sequence[str] | None = None,
    width: float = 11.0,
    row_height: float = 4.2,
    reduce: str = "mean",
) -> Figure:
    """Evaluation return vs env steps (left) and vs wall-clock seconds (right), one row per task.

    The samples are runs (seeds), not pods: a tournament's pods copy each other. Each run's pods
    are reduced to one curve first (``reduce``: ``"mean"`` of its pods, or ``"best"`` pod at each
    point; :func:`analysis.aggregate.run_curves`). Per series (a system; a system x resource
    point when its runs are at several, as in a scaling study) with at least 3 runs: the mean
    over runs and a shaded 95% t-interval over runs (:func:`analysis.aggregate.mean_curve`); with
    fewer, each run's curve as a thin line and no band. The legend names each series with its
    number of runs and says only what is drawn. A dashed line marks the task's target
    (``target``: one number, or ``{task: number}``).
    """
    tasks = evals.unique("task") if len(evals) else [""]
    systems = list(systems) if systems is not None else (evals.unique("system") if len(evals) else [])
    series = _series(evals, systems) if len(evals) else []
    fig = Figure(
        figsize=(width, row_height * len(tasks) + 0.9 + 0.25 * math.ceil(len(series) / 2)), layout="constrained"
    )
    axes = fig.subplots(len(tasks), 2, squeeze=False)
    entries: dict[str, dict[str, Any]] = {}  # series name -> its legend line and run counts (per task)
    drawn: set[str] = set()
    target_line = None
    for row, task in enumerate(tasks):
        t = evals.where(task=task) if len(evals) else evals
        for col, (x, xlabel) in enumerate(
            (("env_steps", "environment steps per pod"), ("wall_s", "wall-clock training time per pod (s)"))
        ):
            ax = axes[row, col]
            if not len(t):
                empty_panel(ax, "no evaluations in these runs yet")
                continue
            for i, (name, where) in enumerate(series):
                s = t.where(**where)
                c = mean_curve(s, x=x, reduce=reduce) if len(s) else None
                if c is None or not len(c["runs"]):
                    continue
                kind, line = _draw_series(ax, c, series_color(i))
                drawn.add(kind)
                e = entries.setdefault(name, {"line": line, "counts": set()})
                e["counts"].add(len(c["runs"]))
            goal = target_for(target, task)
            if goal is not None:
                target_line = ax.axhline(goal, color="0.3", ls="--", lw=1)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("evaluation return (mean of episodes)")
            ax.set_title(f"{task}: return vs {'env steps' if col == 0 else 'wall time'}", fontsize=11)
            if x == "env_steps":
                ax.xaxis.set_major_formatter(STEPS)
            ax.xaxis.set_major_locator(MaxNLocator(6))
            ax.grid(alpha=0.3)
    items = [(f"{name} ({_runs_label(e['counts'])})", e["line"]) for name, e in entries.items()]
    if target_line is not None:
        items.append(("target return", target_line))
    items += _drawn_notes(drawn, reduce)
    if items:
        labels = [k for k, _ in items]
        fig.legend(
            [h for _, h in items],
            labels,
            loc="outside lower center",
            ncols=_legend_columns(labels, width),
            frameon=False,
            fontsize=9,
        )
    return fig


def scaling(
    runs: Table,
    evals: Table | None = None,
    target: Targets = None,
    reference: str | None = None,
    width: float = 14.0,
    height: float = 4.8,
) -> Figure:
    """The scaling figure, one series per system (the ``--label`` names; ``system (task)`` when
    the runs hold several tasks), against resources (pods; RLlib's pods-equivalent: learners on
    the same allocation; log2 axis):

    - time to the target (when the run table has one, i.e. ``run_table(..., target=...)``):
      median over seeds (a seed that did not reach it counts as never), the band spans the seeds
      that reached it, each seed a dot (an open triangle at its training time when it did not
      reach it), the dotted ideal ``T(p0) x p0 / p`` from the fewest pods that reached it;
    - throughput (env steps/s of the whole pool): median, range band, the dotted ideal
      (linear from the fewest pods);
    - efficiency: speed-up / resource ratio against the same system's fewest pods, time to
      target solid, throughput dashed; 1 is ideal.

    ``runs`` is :func:`analysis.aggregate.run_table` (``evals`` and ``target`` are accepted for
    the older call form; the target is the table's). The table behind it is
    :func:`analysis.aggregate.scaling_table`. Each median line carries its series name as its
    label (``ax.lines``), the ideal lines ``"<name> ideal"``.
    """
    from podracer_hpc.report.aggregate import scaling_table

    sc = scaling_table(runs, reference) if len(runs) else scaling_table(runs)
    has_target = len(sc) > 0 and bool(np.isfinite(np.asarray(sc["target"], dtype=float)).any())
    device = has_target and _has_device_time(runs)
    panels = (3 if has_target else 2) + device
    fig = Figure(figsize=(width * panels / 3 if panels != 2 else width * 0.7, height), layout="constrained")
    axes = list(fig.subplots(1, panels, squeeze=False)[0])
    ax_t = axes[0] if has_target else None
    ax_d = axes.pop() if device else None
    ax_s, ax_e = axes[-2], axes[-1]
    tasks = sc.unique("task") if len(sc) else []
    keys = [(task, system) for task in tasks for system in sc.where(task=task).unique("system")]
    all_pods: set[int] = set()
    handles: dict[str, Any] = {}
    missed_any = ideal_drawn = False
    not_reached_notes = 0  # rows of "median not reached" notes at the panel's foot
    for i, (task, system) in enumerate(keys):
        name = system if len(tasks) == 1 else f"{system} ({task})"
        color = series_color(i)
        s = sc.where(task=task, system=system)
        ks = [int(k) for k in s["pods"].tolist()]
        all_pods |= set(ks)
        r = runs.where(task=task, system=system)
        rp = np.asarray(r["pods"], dtype=int)
        # throughput
        med, lo, hi = (
            np.asarray(s[c], dtype=float) for c in ("steps_per_s_median", "steps_per_s_min", "steps_per_s_max")
        )
        ax_s.scatter(rp, np.asarray(r["steps_per_s"], dtype=float), color=color, alpha=0.45, s=16, lw=0)
        if len(ks) > 1:
            ax_s.fill_between(ks, lo, hi, color=color, alpha=0.15, lw=0)
        (h,) = ax_s.plot(ks, med, color=color, marker="o", lw=1.8, label=name)
        # the range band is drawn only between points: say so only where it is; a series with nothing
        # drawn (an RLlib system whose runs logged no throughput, no time) is not in the legend
        series_label = f"{name}: median over seeds" + (" (band: their range)" if len(ks) > 1 else "")
        if np.isfinite(med).any():
            handles.setdefault(series_label, h)
        if len(ks) > 1 and np.isfinite(med[0]):
            ideal_drawn = True
            ax_s.plot(
                ks, med[0] / ks[0] * np.asarray(ks, dtype=float), color=color, ls=":", lw=1.5, label=f"{name} ideal"
            )
        # efficiency
        ax_e.plot(
            ks,
            np.asarray(s["throughput_efficiency"], dtype=float),
            color=color,
            ls="--",
            marker="s",
            ms=4,
            lw=1.4,
            label=f"{name} throughput",
        )
        if has_target:
            ax_e.plot(ks, np.asarray(s["efficiency"], dtype=float), color=color, marker="o", lw=1.8, label=name)
        # time to target
        if ax_t is None:
            continue
        tm = np.asarray(s["time_to_target_median"], dtype=float)
        ok = np.isfinite(tm)
        tt = np.asarray(r["wall_s_to_target"], dtype=float)
        reached = np.isfinite(tt)
        ax_t.scatter(rp[reached], tt[reached], color=color, alpha=0.5, s=16, lw=0)
        if reached.any() or np.isfinite(np.asarray(r["wall_s"], dtype=float)).any():
            handles.setdefault(series_label, h)
        if (~reached).any():
            missed_any = True
            ax_t.scatter(
                rp[~reached],
                np.asarray(r["wall_s"], dtype=float)[~reached],
                marker="^",
                s=30,
                facecolors="none",
                edgecolors=color,
                lw=1.2,
            )
        band_lo = [min(tt[(rp == k) & reached], default=np.nan) for k in ks]
        band_hi = [max(tt[(rp == k) & reached], default=np.nan) for k in ks]
        if len(ks) > 1:
            ax_t.fill_between(ks, band_lo, band_hi, color=color, alpha=0.15, lw=0)
        if ok.any():
            ax_t.plot(np.asarray(ks)[ok], tm[ok], color=color, marker="o", lw=1.8, label=name)
            k0, t0 = np.asarray(ks)[ok][0], tm[ok][0]
            kk = np.asarray([k for k in ks if k >= k0], dtype=float)
            if len(kk) > 1:
                ideal_drawn = True
                ax_t.plot(kk, t0 * k0 / kk, color=color, ls=":", lw=1.5, label=f"{name} ideal")
        for k, v in zip(ks, tm):
            if not math.isfinite(v):
                not_reached_notes = max(not_reached_notes, i + 1)
                ax_t.annotate(
                    "median\nnot reached",
                    (k, 0.03 + 0.1 * i),
                    xycoords=("data", "axes fraction"),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    color=color,
                )
    ticks = sorted(all_pods)
    schemes = set(runs["scheme"].tolist()) if len(runs) and "scheme" in runs else set()
    xlabel = (  # RLlib is named only where a data-parallel system is drawn
        "pods (data-parallel, e.g. RLlib: learners on the same allocation)"
        if "data_parallel" in schemes
        else "pods (MPI ranks)"
    )
    for ax in axes:
        ax.set_xscale("log", base=2)
        if ticks:
            ax.set_xticks(ticks, [str(k) for k in ticks])
            ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3, which="both")
    ax_s.set_yscale("log")
    ax_s.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax_s.yaxis.set_major_formatter(STEPS)
    ax_s.yaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    ax_s.set_ylabel("throughput (env steps/s, all pods)")
    ax_s.set_title("throughput vs resources", fontsize=11)
    ax_e.axhline(1.0, color="0.3", ls="-", lw=0.8)
    ax_e.set_ylim(
        0,
        max(
            1.25,
            float(
                np.nanmax(
                    np.concatenate(
                        [
                            np.asarray(sc["efficiency"], dtype=float),
                            np.asarray(sc["throughput_efficiency"], dtype=float),
                            [1.0],
                        ]
                    )
                )
            )
            * 1.1,
        )
        if len(sc)
        else 1.25,
    )
    ax_e.set_ylabel("efficiency (speed-up / resources)")
    ax_e.set_title("scaling efficiency (1 = ideal)", fontsize=11)
    if ax_t is not None:
        goals = sorted({float(g) for g in sc["target"].tolist() if math.isfinite(float(g))})
        metric = str(sc["metric"][0]) if "metric" in sc else "return"
        what = ("cumulative return" if metric == "cumulative_return" else "return") + (
            f" {goals[0]:g}" if len(goals) == 1 else " target"
        )
        ax_t.set_yscale("log")
        # a short run's times span less than a decade: labels within one, so the axis always has numbers
        ax_t.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
        ax_t.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax_t.yaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        if not_reached_notes:  # room below the data for the "median not reached" notes
            lo, hi = ax_t.get_ylim()
            ax_t.set_ylim(lo / (hi / lo) ** (0.12 * not_reached_notes), hi)
        ax_t.set_ylabel(f"training time to {what} (s)")
        ax_t.set_title(f"time to {what} vs resources", fontsize=11)
        if missed_any:
            handles.setdefault(
                "open triangle: a seed that did not reach it (its training time)",
                Line2D([], [], ls="", marker="^", mfc="none", mec="0.3", ms=6),
            )
    if ideal_drawn:
        handles.setdefault("dotted: ideal scaling from the fewest pods", Line2D([], [], color="0.4", ls=":", lw=1.5))
    if len(sc):
        timed = has_target and bool(np.isfinite(np.asarray(sc["efficiency"], dtype=float)).any())
        handles.setdefault(  # the solid line only where a time-to-target efficiency is drawn
            "efficiency: solid time to target, dashed throughput" if timed else "efficiency: throughput",
            Line2D([], [], color="0.4", ls="--", marker="s", ms=4),
        )
    if ax_d is not None:
        for k, v in _device_panel(ax_d, runs, sc)[1].items():  # its series are the other panels' (same colours)
            handles.setdefault(f"device-equivalent: {k}", v)
    if not len(sc):
        empty_panel(axes[0], "no runs")
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=3, frameon=False, fontsize=9)
    return fig


def _has_device_time(runs: Table) -> bool:
    """Whether a run table holds device-equivalent times (a target, and step seconds from a source)."""
    return (
        len(runs) > 0
        and "device_s_to_target" in runs
        and bool(
            np.isfinite(np.asarray(runs["device_s_to_target"], dtype=float)).any()
            or np.isfinite(np.asarray(runs["device_s_bound"], dtype=float)).any()
        )
    )


def _device_panel(ax: Any, runs: Table, sc: Table) -> tuple[dict[str, Any], dict[str, Any]]:
    """Device-equivalent time to the target vs pods on ``ax`` (log-log), one series per system:
    each seed a dot, a censored seed an open triangle at its bound (label ``censored``), the mean
    over seeds where none is censored (its 95% t band with 3 seeds or more), an open triangle at a
    mean that is a lower bound, and the dotted ideal ``T(p0) x p0 / p`` from the fewest pods with a
    mean. Returns legend entries: one per series (drawn or not: a series of censored seeds only
    has no line), and notes for what it drew."""
    tasks = sc.unique("task") if len(sc) else []
    notes: dict[str, Any] = {}
    series: dict[str, Any] = {}
    pods_seen: set[int] = set()
    for i, (task, system) in enumerate((t, s) for t in tasks for s in sc.where(task=t).unique("system")):
        name, color = (system if len(tasks) == 1 else f"{system} ({task})"), series_color(i)
        series[name] = Line2D([], [], color=color, marker="o", lw=1.8)
        s, r = sc.where(task=task, system=system), runs.where(task=task, system=system)
        rp = np.asarray(r["pods"], dtype=float)
        pods_seen |= {int(p) for p in rp}
        t, bound = np.asarray(r["device_s_to_target"], dtype=float), np.asarray(r["device_s_bound"], dtype=float)
        ax.scatter(rp[np.isfinite(t)], t[np.isfinite(t)], color=color, alpha=0.5, s=16, lw=0)
        miss = ~np.isfinite(t) & np.isfinite(bound)
        if miss.any():
            ax.scatter(
                rp[miss], bound[miss], marker="^", s=34, facecolors="none", edgecolors=color, lw=1.2, label="censored"
            )
            notes["open triangle: a seed that did not reach it, at its budget (censored: at least that)"] = Line2D(
                [], [], ls="", marker="^", mfc="none", mec="0.3", ms=6
            )
        ks = np.asarray(s["pods"], dtype=float)
        mean, ci = np.asarray(s["device_s_mean"], dtype=float), np.asarray(s["device_s_ci"], dtype=float)
        whole = np.isfinite(mean) & (np.asarray(s["device_s_censored"], dtype=int) == 0)
        if not whole.any():  # no mean line: its legend entry is its colour on what is drawn, a triangle
            series[name] = Line2D([], [], ls="", marker="^", mfc="none", mec=color, ms=7)
        if whole.any():
            ax.plot(ks[whole], mean[whole], color=color, marker="o", lw=1.8, label=name)
            band = whole & np.isfinite(ci)
            if band.sum() > 1:
                ax.fill_between(ks[band], (mean - ci)[band], (mean + ci)[band], color=color, alpha=0.15, lw=0)
                notes["shaded: 95% t-interval of the mean over seeds (≥ 3 seeds, all reached)"] = Patch(
                    color="0.5", alpha=0.3, lw=0
                )
            k0, t0 = ks[whole][0], mean[whole][0]
            kk = ks[ks >= k0]
            if len(kk) > 1:
                ax.plot(kk, t0 * k0 / kk, color=color, ls=":", lw=1.5, label=f"{name} ideal")
                notes["dotted: ideal (time x fewest devices / devices)"] = Line2D([], [], color="0.4", ls=":", lw=1.5)
        low = np.isfinite(mean) & ~whole
        if low.any():
            ax.scatter(ks[low], mean[low], marker="^", s=60, facecolors="none", edgecolors=color, lw=1.8)
            notes["large open triangle: a mean with censored seeds (a lower bound)"] = Line2D(
                [], [], ls="", marker="^", mfc="none", mec="0.3", ms=8
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))  # labels within a decade
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    if pods_seen:
        ticks = sorted(pods_seen)
        ax.set_xticks(ticks, [str(k) for k in ticks])
        ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
    goals = sorted({float(g) for g in sc["target"].tolist() if math.isfinite(float(g))}) if len(sc) else []
    metric = str(sc["metric"][0]) if len(sc) and "metric" in sc else "return"
    what = ("cumulative return" if metric == "cumulative_return" else "return") + (
        f" {goals[0]:g}" if len(goals) == 1 else " target"
    )
    ax.set_xlabel("devices")
    ax.set_ylabel(f"device-equivalent time to {what} (s)")
    ax.set_title("device-equivalent time vs devices", fontsize=11)
    ax.grid(alpha=0.3, which="both")
    if not len(sc) or not _has_device_time(runs):
        empty_panel(ax, "no device-equivalent time (no target, or no seconds per env step)")
    return series, notes


def device_time(runs: Table, reference: str | None = None, width: float = 7.5, height: float = 5.2) -> Figure:
    """The paper's figure: device-equivalent time to the target against pods (log-log, the ideal
    line drawn), one line per system, from a :func:`analysis.aggregate.run_table` (its
    ``device_*`` columns: ``docs/studies.md``). The mean line of a series carries its name as
    its label (``ax.lines``), the ideal ``"<name> ideal"``; censored seeds are the scatter
    collections labelled ``censored``."""
    from podracer_hpc.report.aggregate import scaling_table

    sc = scaling_table(runs, reference) if len(runs) else scaling_table(runs)
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.subplots()
    series, notes = _device_panel(ax, runs, sc)
    handles = {**series, **notes}
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="outside lower center",
            ncols=_legend_columns(list(handles), width),
            frameon=False,
            fontsize=9,
        )
    return fig


def hparam_trajectories(
    tour: Table, run: str, space: dict[str, Any] | None = None, only_changing: bool = True, width: float = 11.0
) -> Figure | None:
    """Each pod's hyperparameters over its env steps (step plots; the value at 0 is the one it
    started the first round with). One panel per hyperparameter that changes (all of them if
    ``only_changing`` is False); None when none changes. ``space``: the run's
    ``tournament.hparam_space`` (log-scale axes for log-scale ranges, the range as dashed lines)."""
    t = tour.where(run=run)
    if not len(t):
        return None
    space = space or {}
    traj: dict[str, dict[int, tuple[list[float], list[float]]]] = {}
    for p in t.unique("pod"):
        u = t.where(pod=p)
        o = np.argsort(u["round"], kind="stable")
        first_old = _json(u["old_hparams"][o[0]])
        for name in _json(u["new_hparams"][o[0]]):
            xs, ys = [0.0], [first_old.get(name, math.nan)]
            for i in o:
                xs.append(float(u["env_steps"][i]))
                ys.append(_json(u["new_hparams"][i]).get(name, math.nan))
            traj.setdefault(name, {})[int(p)] = (xs, ys)
    names = [
        n
        for n in traj
        if not only_changing or len({v for xs_ys in traj[n].values() for v in xs_ys[1] if math.isfinite(v)}) > 1
    ]
    if not names:
        return None
    ncols = min(2, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig = Figure(figsize=(width, 3.4 * nrows + 0.7), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    pods = sorted({p for n in names for p in traj[n]})
    for ax, name in zip(axes, names):
        vals = []
        for p in pods:
            xs, ys = traj[name].get(p, ([], []))
            ax.step(xs, ys, where="post", color=series_color(p), lw=1.5, alpha=0.9, label=f"pod {p}")
            vals += [v for v in ys if math.isfinite(v)]
        rng = _space_range(space.get(name))
        if rng is not None:
            for v in rng[:2]:
                ax.axhline(v, color="0.4", ls="--", lw=0.8)
        log = (rng is not None and rng[2]) or (vals and min(vals) > 0 and max(vals) / min(vals) > 20)
        if log:
            ax.set_yscale("log")
        ax.set_title(name, fontsize=11)
        ax.set_xlabel("environment steps per pod")
        ax.set_ylabel(f"{name}{' (log scale)' if log else ''}")
        ax.xaxis.set_major_formatter(STEPS)
        ax.xaxis.set_major_locator(MaxNLocator(6))
        ax.grid(alpha=0.3, which="both")
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=series_color(p), lw=1.5) for p in pods]
    labels = [f"pod {p}" for p in pods]
    if any(_space_range(space.get(n)) is not None for n in names):
        handles.append(Line2D([], [], color="0.4", ls="--", lw=0.8))
        labels.append("hparam_space range")
    fig.suptitle(f"hyperparameters under {t['mode'][0]}: {run} ({t['system'][0]})", fontsize=12)
    if len(pods) <= 24:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(8, len(labels)), frameon=False, fontsize=9)
    return fig


def _json(s: str) -> dict[str, float]:
    try:
        d = json.loads(s) if s else {}
    except json.JSONDecodeError:
        return {}
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float))} if isinstance(d, dict) else {}


def _space_range(spec: Any) -> tuple[float, float, bool] | None:
    if spec is None:
        return None
    if isinstance(spec, dict):
        return float(spec["low"]), float(spec["high"]), bool(spec.get("log_scale", spec.get("log", False)))
    spec = list(spec)
    return float(spec[0]), float(spec[1]), bool(spec[2]) if len(spec) > 2 else False


def text_overlaps(fig: Figure, tolerance_px: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of texts that ``fig`` actually draws (tick labels, labels, titles, legend entries,
    annotations) whose boxes overlap by more than ``tolerance_px`` pixels each way, and
    ``(text, "<figure edge>")`` for a text that the figure's edge cuts."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # the layout settles on the first draw
    renderer = canvas.get_renderer()
    drawn: dict[int, Any] = {}
    original = renderer.draw_text

    def record(gc: Any, x: float, y: float, s: str, prop: Any, angle: float, ismath: Any = False, mtext: Any = None):
        if mtext is not None and s.strip():
            drawn[id(mtext)] = mtext
        return original(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    renderer.draw_text = record
    try:
        fig.draw(renderer)
    finally:
        del renderer.draw_text
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in drawn.values()]
    out = []
    edge = fig.bbox
    for text, bb in boxes:  # cut by the figure's edge
        if (
            bb.x0 < edge.x0 - tolerance_px
            or bb.y0 < edge.y0 - tolerance_px
            or bb.x1 > edge.x1 + tolerance_px
            or bb.y1 > edge.y1 + tolerance_px
        ):
            out.append((text, "<figure edge>"))
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            a, b = boxes[i][1], boxes[j][1]
            if min(a.x1, b.x1) - max(a.x0, b.x0) > tolerance_px and min(a.y1, b.y1) - max(a.y0, b.y0) > tolerance_px:
                out.append((boxes[i][0], boxes[j][0]))
    return out
