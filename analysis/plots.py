"""Figures from the tables of :mod:`analysis.aggregate`.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (no global
state; it displays in a notebook and saves with ``fig.savefig``) and laid out with
``constrained_layout`` so that no text overlaps:

- :func:`learning_curves`: evaluation return vs env steps and vs wall time; per system the mean
  over its pods/seeds and a 95% confidence band; one row per task;
- :func:`scaling`: pool throughput vs number of pods with the ideal (linear) line, and the wall
  time to a target return vs number of pods;
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
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

from .aggregate import Table, Targets, mean_curve, target_for, time_to_target

__all__ = ["learning_curves", "scaling", "lineage", "hparam_trajectories", "fmt_steps", "text_overlaps"]

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
          "#bcbd22")
ACTION_MARKERS = {"keep": ("o", "kept its agent"), "copy_pod": ("^", "copied a pod of this round"),
                  "load_entry": ("s", "loaded a leaderboard entry"), "reset": ("X", "re-initialized (NaN)"),
                  "external": ("D", "loaded another job's entry")}


def fmt_steps(x: float, _pos: Any = None) -> str:
    """Tick label for step counts: 0, 500, 50k, 1M, 1.5M, 2B."""
    a = abs(x)
    for div, suf in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{x / div:.3g}{suf}"
    return f"{x:.0f}"


STEPS = FuncFormatter(fmt_steps)


def _color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def _empty(ax: Any, msg: str) -> None:
    ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes, wrap=True, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def learning_curves(evals: Table, target: Targets = None, systems: Sequence[str] | None = None,
                    width: float = 11.0, row_height: float = 4.2) -> Figure:
    """Evaluation return vs env steps (left) and vs wall-clock seconds (right), one row per task.

    Per system: the mean over its units (pods of all its runs) and a shaded 95% t-interval
    (:func:`analysis.aggregate.mean_curve`). A dashed line marks the task's target (``target``:
    one number, or ``{task: number}``).
    """
    tasks = evals.unique("task") if len(evals) else [""]
    systems = list(systems) if systems is not None else (evals.unique("system") if len(evals) else [])
    fig = Figure(figsize=(width, row_height * len(tasks) + 0.6 + 0.25 * math.ceil(len(systems) / 3)),
                 layout="constrained")
    axes = fig.subplots(len(tasks), 2, squeeze=False)
    handles: dict[str, Any] = {}
    for row, task in enumerate(tasks):
        t = evals.where(task=task) if len(evals) else evals
        for col, (x, xlabel) in enumerate((("env_steps", "environment steps per pod"),
                                           ("wall_s", "wall-clock training time per pod (s)"))):
            ax = axes[row, col]
            if not len(t):
                _empty(ax, "no evaluations in these runs yet")
                continue
            for i, system in enumerate(systems):
                s = t.where(system=system)
                if not len(s):
                    continue
                c = mean_curve(s, x=x)
                color = _color(i)
                n_units, n_runs = int(c["n"].max()) if len(c["n"]) else 0, len(s.unique("run"))
                label = f"{system} ({n_units} pod{'s' * (n_units != 1)}, {n_runs} run{'s' * (n_runs != 1)})"
                (line,) = ax.plot(c["x"], c["mean"], color=color, lw=1.8, marker="o" if len(c["x"]) < 30 else None,
                                  ms=3)
                band = np.isfinite(c["lo"])
                if band.any():
                    ax.fill_between(c["x"], c["lo"], c["hi"], where=band, color=color, alpha=0.18, lw=0)
                handles.setdefault(label, line)
            goal = target_for(target, task)
            if goal is not None:
                tl = ax.axhline(goal, color="0.3", ls="--", lw=1)
                handles.setdefault("target return", tl)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("evaluation return (mean of episodes)")
            ax.set_title(f"{task}: return vs {'env steps' if col == 0 else 'wall time'}", fontsize=11)
            if x == "env_steps":
                ax.xaxis.set_major_formatter(STEPS)
            ax.xaxis.set_major_locator(MaxNLocator(6))
            ax.grid(alpha=0.3)
    if handles:
        band_note = Line2D([], [], color="0.5", lw=6, alpha=0.3)
        labels = [*handles, "shaded: 95% confidence interval of the mean over pods"]
        fig.legend([*handles.values(), band_note], labels, loc="outside lower center",
                   ncols=min(3, len(labels)), frameon=False, fontsize=9)
    return fig


def scaling(runs: Table, evals: Table | None = None, target: Targets = None,
            width: float = 11.0, height: float = 4.4) -> Figure:
    """Throughput vs pods (log2-log axes, with the ideal linear line from the fewest pods), and,
    when ``target`` is given (one number, or ``{task: number}``), wall-clock seconds to the
    task's target return vs pods.

    ``runs`` is :func:`analysis.aggregate.run_table`; series are (task, envs per pod): scaling of
    pods at a fixed per-pod workload. Each run is a point; the line joins the means per pod count.
    """
    tasks = sorted({str(r["task"]) for r in runs.rows()})
    goals = {task: target_for(target, task) for task in tasks}
    panels = 2 if any(g is not None for g in goals.values()) else 1
    fig = Figure(figsize=(width if panels == 2 else width * 0.55, height), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    series = []
    for task, envs in sorted({(r["task"], int(r["num_envs"])) for r in runs.rows()}):
        several = len({g for g in goals.values() if g is not None}) > 1  # else the panel title names it
        goal = f", target {goals[task]:g}" if several and goals.get(task) is not None else ""
        series.append((f"{task}, {envs} envs/pod{goal}", runs.where(task=task, num_envs=envs)))
    ttt = None
    if panels == 2 and evals is not None:
        ttt = time_to_target(evals, target, "wall_s")
    all_pods: set[int] = set()
    handles, labels = [], []
    for i, (name, s) in enumerate(series):
        color = _color(i)
        pods = np.asarray(s["pods"], dtype=int)
        all_pods |= set(pods.tolist())
        ks = sorted(set(pods.tolist()))
        # throughput
        ax = axes[0]
        thr = np.asarray(s["steps_per_s"], dtype=float)
        ax.scatter(pods, thr, color=color, alpha=0.45, s=18, lw=0)
        means = np.array([np.nanmean(thr[pods == k]) for k in ks])
        (h,) = ax.plot(ks, means, color=color, marker="o", lw=1.8)
        handles.append(h)
        labels.append(f"{name}: measured")
        if len(ks) > 1 and np.isfinite(means[0]):
            ideal = means[0] / ks[0] * np.asarray(ks)
            (hi,) = ax.plot(ks, ideal, color=color, ls=":", lw=1.5)
            handles.append(hi)
            labels.append(f"{name}: ideal (linear from {ks[0]} pod{'s' * (ks[0] != 1)})")
        # time to target
        if panels == 2:
            ax = axes[1]
            runs_here = set(s["run"].tolist())
            tt = ttt.take(np.array([r in runs_here for r in ttt["run"].tolist()], dtype=bool)) if ttt is not None and len(ttt) else None
            if tt is None or not len(tt):
                continue
            tp = np.asarray(tt["pods"], dtype=int)
            tv = np.asarray(tt["wall_s_to_target"], dtype=float)
            ax.scatter(tp, tv, color=color, alpha=0.45, s=18, lw=0)
            ok = [(k, np.nanmean(tv[tp == k])) for k in ks if np.isfinite(tv[tp == k]).any()]
            if ok:
                ax.plot([k for k, _ in ok], [v for _, v in ok], color=color, marker="o", lw=1.8)
            missed = [int(k) for k in ks if not np.isfinite(tv[tp == k]).any()]
            for k in missed:
                ax.annotate("not\nreached", (k, 0.97), xycoords=("data", "axes fraction"), ha="center", va="top",
                            fontsize=8, color=color)
    ticks = sorted(all_pods)
    for j, ax in enumerate(axes):
        ax.set_xscale("log", base=2)
        if ticks:
            ax.set_xticks(ticks, [str(k) for k in ticks])
            ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
        ax.set_xlabel("pods (one per MPI rank / GPU)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_yscale("log")
    axes[0].yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # labels within a decade too
    axes[0].yaxis.set_major_formatter(STEPS)
    axes[0].yaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    axes[0].set_ylabel("throughput (env steps/s, all pods)")
    axes[0].set_title("throughput vs pods", fontsize=11)
    if panels == 2:
        named = [f"{g:g}" for g in goals.values() if g is not None]
        what = f"return {named[0]}" if len(set(named)) == 1 else "the target return"
        axes[1].set_ylabel(f"wall-clock time to {what} (s)")
        axes[1].set_title(f"time to {what} (first pod to reach it)", fontsize=11)
        axes[1].set_ylim(bottom=0)
    if not len(runs):
        _empty(axes[0], "no runs")
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=2, frameon=False, fontsize=9)
    return fig


def _lineage_parent(row: dict[str, Any]) -> tuple[int, int] | None:
    """The node (round, pod) whose agent a pod's agent after this round descends from; None when
    the agent came from outside this run (another job's entry) or was re-initialized.

    Node (r, p) is pod p's agent after round r's decision (r = -1: the start). An entry published
    by pod q at round r' holds q's agent before that round's decision: it descends from (r'-1, q).
    """
    r, p = int(row["round"]), int(row["pod"])
    action = row["action"]
    if action == "reset":
        return None
    if action in ("copy_pod", "load_entry"):
        if not row["source_internal"]:
            return None
        q = int(row["source_pod"])
        rs = int(row["source_round"]) if int(row["source_round"]) >= 0 else r
        return (rs - 1, q)
    return (r - 1, p)


def _action_kind(row: dict[str, Any]) -> str:
    if row["action"] in ("copy_pod", "load_entry") and not row["source_internal"]:
        return "external"
    return row["action"] if row["action"] in ACTION_MARKERS else "keep"


def lineage(tour: Table, run: str, evals: Table | None = None, width: float | None = None,
            height: float | None = None) -> Figure:
    """Lineage of one run's tournament: x = round, y = pod. A grey line continues a pod's own
    agent; a coloured arrow shows an agent taken from another pod or an earlier entry (the
    source's colour); the marker shape is the action and its colour the fitness at that round.
    Thick black: the ancestry of the pod with the best last evaluation."""
    t = tour.where(run=run)
    rows = list(t.rows())
    pods = int(t["pods"][0]) if len(t) else 1
    rounds = int(t["round"].max()) + 1 if len(t) else 0
    fig = Figure(figsize=(width or min(14.0, max(7.0, 2.2 + 0.55 * rounds)),
                      height or min(12.0, max(3.6, 1.9 + 0.42 * pods))), layout="constrained")
    ax = fig.add_subplot()
    if not rows:
        _empty(ax, f"{run}: no tournament rounds logged")
        return fig
    by_node = {(int(r["round"]), int(r["pod"])): r for r in rows}
    parent = {node: _lineage_parent(r) for node, r in by_node.items()}
    # winner: best last evaluation (else best fitness in the last round)
    winner = None
    if evals is not None and len(evals.where(run=run)):
        e = evals.where(run=run)
        last = {int(p): float(e.where(pod=p)["return_mean"][-1]) for p in e.unique("pod")}
        fin = {p: v for p, v in last.items() if math.isfinite(v)}
        winner = max(fin, key=fin.get) if fin else None
    if winner is None:
        lr = [r for r in rows if int(r["round"]) == rounds - 1 and math.isfinite(r["fitness"])]
        winner = int(max(lr, key=lambda r: r["fitness"])["pod"]) if lr else None
    ancestry: set[tuple[tuple[int, int], tuple[int, int]]] = set()
    node = (rounds - 1, winner) if winner is not None else None
    while node is not None and node in parent and parent[node] is not None:
        ancestry.add((parent[node], node))
        node = parent[node]
    ms = max(18.0, min(70.0, 900.0 / max(pods, rounds, 1)))
    for node, par in parent.items():
        if par is None:
            continue
        (r0, q), (r1, p) = par, node
        on_path = (par, node) in ancestry
        if q == p and r0 == r1 - 1:
            ax.plot([r0, r1], [q, p], color="black" if on_path else "0.75", lw=2.6 if on_path else 1.0, zorder=1)
        else:
            ax.annotate("", xy=(r1, p), xytext=(r0, q), zorder=2,
                        arrowprops=dict(arrowstyle="-|>", color="black" if on_path else _color(q),
                                        lw=2.6 if on_path else 1.4, shrinkA=4, shrinkB=6, mutation_scale=10,
                                        connectionstyle="arc3,rad=0.12"))
    fit = np.array([r["fitness"] for r in rows], dtype=float)
    finite = fit[np.isfinite(fit)]
    vmin, vmax = (finite.min(), finite.max()) if len(finite) else (0.0, 1.0)
    sc = None
    kinds_present = []
    for kind, (marker, _) in ACTION_MARKERS.items():
        sel = [r for r in rows if _action_kind(r) == kind]
        if not sel:
            continue
        kinds_present.append(kind)
        xs = [int(r["round"]) for r in sel]
        ys = [int(r["pod"]) for r in sel]
        cs = [r["fitness"] if math.isfinite(r["fitness"]) else np.nan for r in sel]
        sc = ax.scatter(xs, ys, c=cs, cmap="viridis", vmin=vmin, vmax=vmax, marker=marker, s=ms,
                        edgecolors="0.2", linewidths=0.6, zorder=3, plotnonfinite=True)
    ax.scatter([-1] * pods, list(range(pods)), marker="o", s=ms * 0.6, color="white", edgecolors="0.3", zorder=3)
    if sc is not None:
        cb = fig.colorbar(sc, ax=ax, shrink=0.9, pad=0.01)
        cb.set_label("fitness at the round (eval return)", fontsize=9)
    ax.set_xlim(-1.5, rounds - 0.5)
    ax.set_ylim(pods - 0.5, -0.5)
    step = max(1, math.ceil(rounds / 12))
    ax.set_xticks([-1, *range(0, rounds, step)], ["start", *(str(r) for r in range(0, rounds, step))])
    pstep = max(1, math.ceil(pods / 16))
    ax.set_yticks(range(0, pods, pstep))
    if pods <= len(COLORS):  # the arrows carry the source pod's colour: so do the pod labels
        for lab, p in zip(ax.get_yticklabels(), range(0, pods, pstep)):
            lab.set_color(_color(p))
    ax.set_xlabel("tournament round")
    ax.set_ylabel("pod (MPI rank)")
    system = t["system"][0]
    ax.set_title(f"tournament lineage: {run} ({system}, {t['mode'][0]}, {pods} pods)", fontsize=11)
    legend = [Line2D([], [], ls="", marker=ACTION_MARKERS[k][0], color="0.5", mec="0.2", ms=7,
                     label=ACTION_MARKERS[k][1]) for k in kinds_present]
    legend.append(Line2D([], [], color="0.5", lw=1.4, marker=">", ms=5,
                         label="agent taken from" + (" (colour: source pod)" if pods <= len(COLORS) else "")))
    if winner is not None:
        legend.append(Line2D([], [], color="black", lw=2.6, label=f"ancestry of the final best pod ({winner})"))
    fig.legend(handles=legend, loc="outside lower center", ncols=min(2 if fig.get_figwidth() < 9 else 3, len(legend)),
               frameon=False, fontsize=9)
    return fig


def hparam_trajectories(tour: Table, run: str, space: dict[str, Any] | None = None,
                        only_changing: bool = True, width: float = 11.0) -> Figure | None:
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
    names = [n for n in traj if not only_changing or
             len({v for xs_ys in traj[n].values() for v in xs_ys[1] if math.isfinite(v)}) > 1]
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
            ax.step(xs, ys, where="post", color=_color(p), lw=1.5, alpha=0.9, label=f"pod {p}")
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
    for ax in axes[len(names):]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=_color(p), lw=1.5) for p in pods]
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
        if bb.x0 < edge.x0 - tolerance_px or bb.y0 < edge.y0 - tolerance_px or bb.x1 > edge.x1 + tolerance_px \
                or bb.y1 > edge.y1 + tolerance_px:
            out.append((text, "<figure edge>"))
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            a, b = boxes[i][1], boxes[j][1]
            if min(a.x1, b.x1) - max(a.x0, b.x0) > tolerance_px and min(a.y1, b.y1) - max(a.y0, b.y0) > tolerance_px:
                out.append((boxes[i][0], boxes[j][0]))
    return out
