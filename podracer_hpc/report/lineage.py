"""The tournament lineage figure: who took which agent, round by round (``plots.lineage`` names it
too). A row per pod up to LINEAGE_FULL_PODS pods; beyond, the ancestry of the top final pods
over the pool's copy flow, so that a 512-pod pool stays readable."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from podracer_hpc.report.style import ACTION_MARKERS, COLORS, empty_panel, series_color
from podracer_hpc.report.tables import Table

__all__ = ["LINEAGE_FULL_PODS", "LINEAGE_ROWS", "LINEAGE_TOP", "ancestry", "lineage"]


def lineage_parent(row: dict[str, Any]) -> tuple[int, int] | None:
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


def lineage(
    tour: Table, run: str, evals: Table | None = None, width: float | None = None, height: float | None = None
) -> Figure:
    """Lineage of one run's tournament: x = round, y = pod. A grey line continues a pod's own
    agent; a coloured arrow shows an agent taken from another pod or an earlier entry (the
    source's colour); the marker shape is the action and its colour the fitness at that round.
    Thick black: the ancestry of the pod with the best last evaluation.

    Beyond LINEAGE_FULL_PODS pods a row per pod is unreadable: the figure draws the ancestry of
    the top final pods only (at most LINEAGE_ROWS rows: the pods their agents passed through),
    over the pool's copy flow per round (:func:`_lineage_at_scale`)."""
    t = tour.where(run=run)
    rows = list(t.rows())
    pods = int(t["pods"][0]) if len(t) else 1
    rounds = int(t["round"].max()) + 1 if len(t) else 0
    if pods > LINEAGE_FULL_PODS and rows:
        return _lineage_at_scale(t, rows, run, evals, pods, rounds, width, height)
    fig = Figure(
        figsize=(width or min(14.0, max(7.0, 2.2 + 0.55 * rounds)), height or min(12.0, max(3.6, 1.9 + 0.42 * pods))),
        layout="constrained",
    )
    ax = fig.add_subplot()
    if not rows:
        empty_panel(ax, f"{run}: no tournament rounds logged")
        return fig
    by_node = {(int(r["round"]), int(r["pod"])): r for r in rows}
    parent = {node: lineage_parent(r) for node, r in by_node.items()}
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
            ax.annotate(
                "",
                xy=(r1, p),
                xytext=(r0, q),
                zorder=2,
                arrowprops=dict(
                    arrowstyle="-|>",
                    color="black" if on_path else series_color(q),
                    lw=2.6 if on_path else 1.4,
                    shrinkA=4,
                    shrinkB=6,
                    mutation_scale=10,
                    connectionstyle="arc3,rad=0.12",
                ),
            )
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
        sc = ax.scatter(
            xs,
            ys,
            c=cs,
            cmap="viridis",
            vmin=vmin,
            vmax=vmax,
            marker=marker,
            s=ms,
            edgecolors="0.2",
            linewidths=0.6,
            zorder=3,
            plotnonfinite=True,
        )
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
    algo = {int(r["pod"]): str(r.get("algo") or "") for r in rows}
    if len(set(algo.values())) > 1:  # a mixed pool: name each pod's learner
        ax.set_yticklabels([f"{p} {algo.get(p, '')}".strip() for p in range(0, pods, pstep)])
    if pods <= len(COLORS):  # the arrows carry the source pod's colour: so do the pod labels
        for lab, p in zip(ax.get_yticklabels(), range(0, pods, pstep)):
            lab.set_color(series_color(p))
    ax.set_xlabel("tournament round")
    ax.set_ylabel("pod (MPI rank" + (", learner)" if len(set(algo.values())) > 1 else ")"))
    system = t["system"][0]
    ax.set_title(f"tournament lineage: {run} ({system}, {t['mode'][0]}, {pods} pods)", fontsize=11)
    legend = [
        Line2D([], [], ls="", marker=ACTION_MARKERS[k][0], color="0.5", mec="0.2", ms=7, label=ACTION_MARKERS[k][1])
        for k in kinds_present
    ]
    legend.append(
        Line2D(
            [],
            [],
            color="0.5",
            lw=1.4,
            marker=">",
            ms=5,
            label="agent taken from" + (" (colour: source pod)" if pods <= len(COLORS) else ""),
        )
    )
    if winner is not None:
        legend.append(Line2D([], [], color="black", lw=2.6, label=f"ancestry of the final best pod ({winner})"))
    fig.legend(
        handles=legend,
        loc="outside lower center",
        ncols=min(2 if fig.get_figwidth() < 9 else 3, len(legend)),
        frameon=False,
        fontsize=9,
    )
    return fig


LINEAGE_FULL_PODS = 32  # up to this many pods, a row per pod; beyond, the ancestry of the top final pods
LINEAGE_TOP = 8  # final pods whose ancestry is drawn at scale (fewer if their ancestors need more rows)
LINEAGE_ROWS = 40  # rows (pods) drawn at most at scale


def _final_scores(rows: list[dict[str, Any]], run: str, evals: Table | None, rounds: int) -> dict[int, float]:
    """Each pod's final score: its last evaluation, else its fitness at the last round."""
    if evals is not None and len(evals.where(run=run)):
        e = evals.where(run=run)
        last = {int(p): float(e.where(pod=p)["return_mean"][-1]) for p in e.unique("pod")}
        fin = {p: v for p, v in last.items() if math.isfinite(v)}
        if fin:
            return fin
    return {
        int(r["pod"]): float(r["fitness"])
        for r in rows
        if int(r["round"]) == rounds - 1 and math.isfinite(r["fitness"])
    }


def ancestry(parent: dict[tuple[int, int], tuple[int, int] | None], node: tuple[int, int]) -> list[tuple[int, int]]:
    """The nodes (round, pod) an agent descends through, from ``node`` back to its origin (a
    start, another job's entry or a re-initialization), latest first."""
    path = [node]
    while path[-1] in parent and parent[path[-1]] is not None:
        path.append(parent[path[-1]])
    return path


def _lineage_at_scale(
    t: Table,
    rows: list[dict[str, Any]],
    run: str,
    evals: Table | None,
    pods: int,
    rounds: int,
    width: float | None,
    height: float | None,
) -> Figure:
    """A large pool's lineage. Top: the ancestry of the top ``k`` final pods (k <= LINEAGE_TOP,
    as many as fit in LINEAGE_ROWS rows), y = only the pods their agents passed through, one
    colour per final pod. Bottom: the copy flow of the whole pool per round (pods that took
    another's agent, and how many of the starting agents still have a living descendant)."""
    by_node = {(int(r["round"]), int(r["pod"])): r for r in rows}
    parent = {node: lineage_parent(r) for node, r in by_node.items()}
    scores = _final_scores(rows, run, evals, rounds)
    top = sorted(scores, key=lambda p: (-scores[p], p))[:LINEAGE_TOP]
    paths = {p: ancestry(parent, (rounds - 1, p)) for p in top}
    k, drawn, cut = len(top), set(), False
    while k > 0:
        drawn = {q for p in top[:k] for (_, q) in paths[p]}
        if len(drawn) <= LINEAGE_ROWS:
            break
        k -= 1
    if k == 0:  # even the best pod's agent passed through more pods than fit: its latest ancestors only
        k, cut, drawn = 1, True, set()
        kept = []
        for node in paths[top[0]]:
            if node[1] not in drawn and len(drawn) == LINEAGE_ROWS:
                break
            drawn.add(node[1])
            kept.append(node)
        paths[top[0]] = kept
    top = top[:k]
    ys = sorted(drawn)
    y_of = {q: i for i, q in enumerate(ys)}
    n = len(ys)
    fig = Figure(
        figsize=(width or min(14.0, max(8.0, 2.2 + 0.35 * rounds)), height or min(14.0, max(5.5, 3.8 + 0.2 * n))),
        layout="constrained",
    )
    ax, flow = fig.subplots(2, 1, height_ratios=[max(2.0, 0.2 * n), 1.6], sharex=True)
    edges: dict[tuple[tuple[int, int], tuple[int, int]], int] = {}
    for i in reversed(range(k)):  # an edge shared by several ancestries: the best pod's colour
        path = paths[top[i]]
        for child, par in zip(path, path[1:]):
            edges[(par, child)] = i
    for ((r0, q), (r1, p)), i in edges.items():
        if q == p and r0 == r1 - 1:
            ax.plot([r0, r1], [y_of[q], y_of[p]], color=series_color(i), lw=2.0, zorder=1)
        else:
            ax.annotate(
                "",
                xy=(r1, y_of[p]),
                xytext=(r0, y_of[q]),
                zorder=2,
                arrowprops=dict(
                    arrowstyle="-|>",
                    color=series_color(i),
                    lw=1.6,
                    shrinkA=3,
                    shrinkB=4,
                    mutation_scale=9,
                    connectionstyle="arc3,rad=0.12",
                ),
            )
    nodes = {node for p in top for node in paths[p] if node in by_node}
    fit = np.array([r["fitness"] for r in rows], dtype=float)
    finite = fit[np.isfinite(fit)]
    vmin, vmax = (finite.min(), finite.max()) if len(finite) else (0.0, 1.0)
    sc, kinds_present = None, []
    for kind, (marker, _) in ACTION_MARKERS.items():
        sel = [by_node[nd] for nd in sorted(nodes) if _action_kind(by_node[nd]) == kind]
        if not sel:
            continue
        kinds_present.append(kind)
        sc = ax.scatter(
            [int(r["round"]) for r in sel],
            [y_of[int(r["pod"])] for r in sel],
            c=[r["fitness"] if math.isfinite(r["fitness"]) else np.nan for r in sel],
            cmap="viridis",
            vmin=vmin,
            vmax=vmax,
            marker=marker,
            s=30,
            edgecolors="0.2",
            linewidths=0.5,
            zorder=3,
            plotnonfinite=True,
        )
    starts = sorted({q for p in top for (r, q) in paths[p] if r == -1})
    ax.scatter(
        [-1] * len(starts), [y_of[q] for q in starts], marker="o", s=18, color="white", edgecolors="0.3", zorder=3
    )
    if sc is not None:
        cb = fig.colorbar(sc, ax=ax, shrink=0.9, pad=0.01)
        cb.set_label("fitness at the round", fontsize=9)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n), [str(q) for q in ys], fontsize=7 if n > 24 else 9)
    ax.set_ylabel(f"pod (MPI rank): {n} of {pods}")
    what = f"ancestry of the top {k} final pod{'s' * (k != 1)}" + (" (latest ancestors only)" if cut else "")
    ax.set_title(f"tournament lineage: {run} ({t['system'][0]}, {t['mode'][0]}, {pods} pods): {what}", fontsize=11)
    # the whole pool: copies per round, and the starting agents that still have a descendant
    founder: dict[tuple[int, int], tuple[int, int]] = {}
    copies, alive = np.zeros(rounds, int), np.zeros(rounds, int)
    for node in sorted(by_node):
        par = parent[node]
        founder[node] = node if par is None else founder.get(par, par)
        r = by_node[node]
        if r["action"] in ("copy_pod", "load_entry"):
            copies[node[0]] += 1
    for rd in range(rounds):
        alive[rd] = len({founder[nd] for nd in by_node if nd[0] == rd})
    xs = np.arange(rounds)
    flow.bar(xs, copies, color="0.6", width=0.8, label="pods that took another's agent")
    flow.plot(xs, alive, color="black", marker=".", lw=1.4, label="lineages alive (agents with a living descendant)")
    flow.set_ylim(0, pods * 1.05)
    flow.set_ylabel("pods")
    flow.set_xlabel("tournament round")
    step = max(1, math.ceil(rounds / 12))
    flow.set_xticks([-1, *range(0, rounds, step)], ["start", *(str(r) for r in range(0, rounds, step))])
    flow.set_xlim(-1.5, rounds - 0.5)
    legend = [
        Line2D([], [], ls="", marker=ACTION_MARKERS[kd][0], color="0.5", mec="0.2", ms=6, label=ACTION_MARKERS[kd][1])
        for kd in kinds_present
    ]
    legend += [
        Line2D([], [], color=series_color(i), lw=2.0, label=f"pod {p}" + (" (final best)" if i == 0 else ""))
        for i, p in enumerate(top)
    ]
    legend += [
        Patch(color="0.6", label="pods that took another's agent"),
        Line2D([], [], color="black", marker=".", label="lineages alive"),
    ]
    fig.legend(handles=legend, loc="outside lower center", ncols=4, frameon=False, fontsize=8)
    return fig
