"""Tournament selection rules: from the gathered fitness table to one decision per pod.

Pure functions: no I/O, no MPI, no torch. Given the same table, leaderboard listing, round and
seed, every rank computes the same decisions (all randomness comes from numpy Generators seeded
by ``(seed, round, rank, rule)``, and ties are broken by rank, then entry id).

One round, as the rank program runs it::

    reports = comm.allgather(PodReport(rank, fitness, env_steps, hparams))
    entries = comm.bcast(leaderboard.list() if comm.rank == 0 else None)  # one view for all
    decisions = decide(reports, entries, round, seed, cfg)
    d = decisions[comm.rank]
    my_entry = leaderboard.publish(...) if d.publish else None
    entry_of_rank = comm.allgather(my_entry)      # also a barrier: sources are on disk now
    if d.action == "load_entry":  state = leaderboard.load(d.source_entry)
    elif d.action == "copy_pod":  state = leaderboard.load(entry_of_rank[d.source_rank])
    elif d.action == "reset":     re-initialize the agent (no finite source exists anywhere)
    if d.new_hparams is not None: use d.new_hparams
    comm.barrier(); if comm.rank == 0: leaderboard.prune(cfg.top_k)   # after everyone loaded

A source that has vanished anyway (another job's prune) raises ``EntryGone``: keep, and log it.

Rules (``TournamentConfig.mode``):

- ``"elegantrl"`` (ElegantRL-Podracer): the candidate pool is the leaderboard plus this round's
  pods (equivalent to "every pod publishes, the leaderboard keeps the top K", without writing
  entries a prune would delete at once). Each pod samples one of the top-K candidates by a
  softmax over z-scored scores and takes its weights, optimizer and normalizer state only if the
  candidate's score is strictly better than its own fitness. Hyperparameters stay the pod's own.
- ``"pbt"`` (Jaderberg et al. 2017, truncation selection): pods in the bottom quantile copy the
  state and hyperparameters of a pod drawn uniformly from the top quantile (exploit), then
  perturb the hyperparameters (explore).
- ``"dexpbt"`` (DexPBT, Petrenko et al. 2023; the rule of Isaac Lab's PBT): with ``m`` and ``s``
  the mean and standard deviation of the pool's finite fitness, leaders score above
  ``max(m + k s, m + threshold_abs)`` and underperformers below ``min(m - k s, m - threshold_abs)``
  (``k`` = ``threshold_std``). Only underperformers act: one copies a leader drawn uniformly and
  mutates the copied hyperparameters; with no leader it keeps its agent and mutates its own.
  Everybody else keeps training untouched.
- ``"none"``: every pod keeps; nobody publishes.

NaN (or infinite) fitness: such a pod is never a source and never published, and it is always
replaced (by a sampled candidate, a top pod, the best finite pod, the best leaderboard entry, or
if none exists anywhere, ``"reset"``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from podracer_hpc.config import HParamRange, TournamentConfig, normalize_space
from podracer_hpc.pool.entry import Entry, entries_of
from podracer_hpc.pool.fitness import better
from podracer_hpc.pool.hparams import (
    DEFAULT_PBT_SPACE,
    describe_space,
    draw_eligible,
    effective_space,
    explore,
    is_finite,
    mutate,
)

__all__ = [
    "ACTIONS",
    "ACTION_CODES",
    "DEFAULT_PBT_SPACE",
    "Decision",
    "HParamRange",
    "PodReport",
    "TournamentConfig",
    "decide",
    "describe_space",
    "dexpbt_cuts",
    "dexpbt_select",
    "effective_space",
    "elegantrl_select",
    "explore",
    "make_rng",
    "normalize_space",
    "pbt_select",
    "quantile_size",
    "round_env_steps",
    "intervals_to_next_round",
    "softmax_zscore",
]

ACTIONS = ("keep", "load_entry", "copy_pod", "reset")
ACTION_CODES = {a: i for i, a in enumerate(ACTIONS)}  # integer codes for the HDF5 log

# Stream tags keep the rules' random streams apart for the same (seed, round, rank).
_STREAM_ELEGANTRL = 1
_STREAM_PBT = 2
_STREAM_DEXPBT = 3


def _changed(last_copy_round: int) -> str:
    return f"changed at round {last_copy_round}" if last_copy_round >= 0 else "started at round -1"


@dataclass(frozen=True)
class PodReport:
    """What one pod tells the others at a tournament round (small and picklable)."""

    rank: int  # MPI rank of the pod
    fitness: float  # evaluation return of the deterministic policy; NaN if evaluation failed
    env_steps: int  # environment steps this pod's agent has been trained on
    hparams: dict[str, float] = field(default_factory=dict)  # current hyperparameters
    last_copy_round: int = -1  # the last round this pod took another agent or mutated its own values (-1: the start)
    returns: tuple[float, ...] = ()  # the episodes behind ``fitness``, on the round's common start states
    kind: str = ""  # the agent's kind (agents.settings.agent_kind: learner and network); pods take only their own


@dataclass(frozen=True)
class Decision:
    """What one pod does after a tournament round.

    ``action`` is one of:

    - ``"keep"``: continue with its own state;
    - ``"load_entry"``: load leaderboard entry ``source_entry`` (weights, optimizer, normalizers);
    - ``"copy_pod"``: load the entry that pod ``source_rank`` publishes this round;
    - ``"reset"``: re-initialize the agent (its fitness is NaN and no finite source exists).

    ``new_hparams`` is None when the pod keeps its own hyperparameters, else the full dict to use.
    ``publish`` says whether this pod writes its state to the leaderboard this round (before
    anyone loads). If a source entry has vanished when loading it, keep (and log it).
    """

    rank: int  # the pod this decision is for
    action: str  # "keep" | "load_entry" | "copy_pod" | "reset"
    publish: bool  # write this pod's state to the leaderboard this round
    fitness: float  # the pod's own fitness this round (NaN allowed)
    source_rank: int | None = None  # copy_pod: the pod to copy
    source_entry: str | None = None  # load_entry: the leaderboard entry id to load
    source_score: float | None = None  # fitness/score of the source
    old_hparams: dict[str, float] | None = None  # hyperparameters before the decision
    new_hparams: dict[str, float] | None = None  # hyperparameters after (None: unchanged)
    reason: str = ""  # one line for the log
    verify: bool = False  # load_entry: the entry's score is from other start states; the pod evaluates
    #                       it on its own set and takes it only if it is better there by the margin
    diff_mean: float | None = None  # paired mean return difference source - own on common start states
    diff_se: float | None = None  # its standard error

    @property
    def action_code(self) -> int:
        return ACTION_CODES[self.action]

    @property
    def replaces(self) -> bool:
        """Whether the pod's weights change."""
        return self.action != "keep"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (for logs)."""
        return asdict(self)


def round_env_steps(cfg: TournamentConfig, index: int) -> int:
    """Env steps of a pod at which round ``index`` (0-based) takes place.

    The first round comes after ``max(interval_env_steps, warmup_env_steps)`` steps, the next ones
    every ``interval_env_steps``. A warm-up keeps early, noisy evaluations from deciding which
    lineages survive (Jaderberg et al.'s "ready" criterion, for every pod at once).
    """
    return max(cfg.interval_env_steps, cfg.warmup_env_steps) + index * cfg.interval_env_steps


def intervals_to_next_round(cfg: TournamentConfig, steps_per_s: float, min_interval_s: float) -> int:
    """Whole ``interval_env_steps`` to the next round: 1, or as many as ``min_interval_s`` takes at
    ``steps_per_s`` (on the interval's grid: every pod of a pool, whatever its batch, passes them)."""
    if not min_interval_s > 0 or not (math.isfinite(steps_per_s) and steps_per_s > 0):
        return 1
    return max(1, math.ceil(min_interval_s * steps_per_s / cfg.interval_env_steps))


# ----------------------------------------------------------------------------- helpers


def make_rng(seed: int, round: int, rank: int, stream: int) -> np.random.Generator:
    """The Generator of one pod at one round for one rule: identical on every rank."""
    for name, v in (("seed", seed), ("round", round), ("rank", rank)):
        if int(v) < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(round), int(rank), int(stream)]))


def softmax_zscore(scores: Sequence[float], temperature: float = 1.0) -> np.ndarray:
    """Probabilities ``softmax(z / temperature)`` with ``z`` the z-scores of ``scores``.

    Equal scores (zero spread) or ``temperature=inf`` give the uniform distribution.
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError("softmax_zscore needs a non-empty 1-D sequence of scores")
    if not np.all(np.isfinite(s)):
        raise ValueError("softmax_zscore needs finite scores")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    std = s.std()
    z = (s - s.mean()) / std if std > 0 else np.zeros_like(s)
    logits = z / temperature
    logits -= logits.max()
    p = np.exp(logits)
    return p / p.sum()


def quantile_size(n: int, quantile: float) -> int:
    """Number of pods in each of the bottom and top groups of a pool of ``n``.

    ``ceil(n * quantile)``, capped at ``floor(n / 2)`` so the groups never overlap (as Ray Tune
    does): n=1 -> 0, n=2..4 -> 1, n=5..8 -> 2 for quantile 0.25.
    """
    if n <= 0 or quantile <= 0:
        return 0
    k = math.ceil(n * quantile - 1e-9)
    return min(k, n // 2)


def _ranking(fitness: Sequence[float]) -> list[int]:
    """Ranks ordered best first: finite fitness descending, ties by rank; non-finite last."""
    return sorted(
        range(len(fitness)), key=lambda r: (0, -float(fitness[r]), r) if is_finite(fitness[r]) else (1, 0.0, r)
    )


def _compare(
    own_fit: float, own_ret: Sequence[float], score: float, cand_ret: Sequence[float] | None, margin_se: float
) -> tuple[str, float | None, float | None]:
    """Whether a pod takes a candidate: ``"take"``, ``"keep"`` or ``"verify"``, and the paired
    difference used. A pod with NaN fitness takes anything. With the pod's episodes and the
    candidate's on the same start states: better by ``margin_se`` standard errors of the paired
    difference. A candidate scored on other start states (``cand_ret`` None) whose score looks
    better is ``"verify"``: the pod evaluates it on its own set first. Without the pod's episodes
    (a caller with scores only): strictly better score."""
    if not is_finite(own_fit):
        return "take", None, None
    if own_ret and cand_ret is not None and len(cand_ret) == len(own_ret):
        ok, m, se = better(own_ret, cand_ret, margin_se)
        return ("take" if ok else "keep"), m, se
    if not score > own_fit:
        return "keep", None, None
    return ("verify" if own_ret else "take"), None, None


# ----------------------------------------------------------------------------- elegantrl


def elegantrl_select(
    own_fitness: Sequence[float],
    entries: Iterable[Entry | tuple],
    round: int,
    seed: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    include_pods: bool = True,
    hparams: Sequence[Mapping[str, float]] | None = None,
    env_steps: Sequence[int | None] | None = None,
    steps_tolerance: float | None = None,
    rng_ranks: Sequence[int] | None = None,
    returns: Sequence[Sequence[float]] | None = None,
    margin_se: float = 0.0,
    labels: Sequence[int] | None = None,
) -> list[Decision]:
    """ElegantRL-Podracer rule; returns one decision per rank (index = rank).

    Candidates: the finite-score ``entries`` (a leaderboard listing of
    :class:`~podracer_hpc.pool.entry.Entry`, or tuples as :func:`decide` takes; an entry's
    ``returns``: its episodes when they are on this round's start states, else None)
    plus, if ``include_pods``, this round's finite-fitness pods; ordered by score descending
    (ties: pods by rank, then entries by id) and cut to ``top_k``. Each pod draws one candidate
    with probabilities :func:`softmax_zscore` (Generator seeded by (seed, round, rank)) and
    replaces its state only if the candidate is better (:func:`_compare`): with ``returns`` (each
    pod's episodes on the round's common start states), by ``margin_se`` standard errors of the
    paired difference; an entry scored on other start states whose score is better is taken
    with ``verify`` (the pod evaluates it on its own set first). A NaN pod always takes its draw.
    A pod publishes when it is in the candidate pool. ``labels``: the pods' names in the reasons
    (their world ranks when the table is one kind's pods of a mixed pool; default the index).

    Freshness (when ``steps_tolerance`` is given with the pods' ``env_steps``): a pod never goes
    back in time. An entry trained on fewer than ``env_steps[r] * (1 - steps_tolerance)`` steps is
    not a candidate for pod ``r`` (its score was measured earlier in training, so it does not
    compare with the pod's current fitness, and loading it would discard the pod's training
    since). Entries stale for every pod leave the pool before the ``top_k`` cut; each pod draws
    among the pool's candidates that are fresh for it. Unknown steps count as fresh.
    """
    n = len(own_fitness)
    fit = [float(f) if is_finite(f) else float("nan") for f in own_fitness]
    hp = [dict(h) for h in hparams] if hparams is not None else [None] * n
    if len(hp) != n:
        raise ValueError(f"hparams has {len(hp)} rows for {n} pods")
    steps = list(env_steps) if env_steps is not None else [None] * n
    if len(steps) != n:
        raise ValueError(f"env_steps has {len(steps)} rows for {n} pods")
    rets = [tuple(x) for x in returns] if returns is not None else [()] * n
    if len(rets) != n:
        raise ValueError(f"returns has {len(rets)} rows for {n} pods")

    def min_steps(r: int) -> float | None:
        """Fewest env steps a candidate may have to be fresh for pod r (None: no limit)."""
        if steps_tolerance is None or steps[r] is None:
            return None
        return float(steps[r]) * (1.0 - float(steps_tolerance))

    def fresh(c_steps: int | None, limit: float | None) -> bool:
        return limit is None or c_steps is None or c_steps >= limit

    # (score, tiebreak key, kind, ref, env_steps, returns on this round's start states or None):
    # kind "pod" refs a rank, "entry" an entry id.
    cands: list[tuple[float, tuple, str, Any, int | None, tuple | None]] = []
    if include_pods:
        cands += [(f, (0, r, ""), "pod", r, steps[r], rets[r]) for r, f in enumerate(fit) if is_finite(f)]
    seen: set[str] = set()
    limits = [min_steps(r) for r in range(n)]
    loosest = None if any(x is None for x in limits) or not limits else min(limits)
    for e in entries_of(entries):
        eid, score, e_steps = e.id, e.score, e.env_steps
        e_rets = tuple(e.returns) if e.returns is not None else None
        if eid in seen or not is_finite(score) or not fresh(e_steps, loosest):
            continue
        seen.add(eid)
        cands.append((float(score), (1, 0, eid), "entry", eid, e_steps, e_rets))
    cands.sort(key=lambda c: (-c[0], c[1]))
    if top_k is not None:
        cands = cands[: max(int(top_k), 0)]
    pool_pods = {c[3] for c in cands if c[2] == "pod"}

    out: list[Decision] = []
    for r in range(n):
        base = dict(rank=r, publish=r in pool_pods, fitness=fit[r], old_hparams=hp[r])
        mine = [c for c in cands if fresh(c[4], limits[r])]
        if not mine:
            if is_finite(fit[r]):
                out.append(Decision(action="keep", reason="no candidates", **base))
            else:
                out.append(Decision(action="reset", reason="fitness is NaN and no finite source exists", **base))
            continue
        probs = softmax_zscore([c[0] for c in mine], temperature)
        i = int(make_rng(seed, round, rng_ranks[r] if rng_ranks else r, _STREAM_ELEGANTRL).choice(len(mine), p=probs))
        score, _, kind, ref, _, c_rets = mine[i]
        what = f"pod {labels[ref] if labels else ref}" if kind == "pod" else f"entry {ref}"
        verdict, dm, dse = _compare(fit[r], rets[r], score, c_rets, margin_se)
        diff = f" (paired difference {dm:+.4g} +- {dse:.3g})" if dm is not None else ""
        if verdict == "keep":
            out.append(
                Decision(
                    action="keep",
                    source_score=score,
                    diff_mean=dm,
                    diff_se=dse,
                    reason=f"drew {what} ({score:.6g}), not better than own {fit[r]:.6g}"
                    + (f" by {margin_se:g} standard errors" if dm is not None else "")
                    + diff,
                    **base,
                )
            )
            continue
        if verdict == "verify":
            why = f"scored {score:.6g} on other start states: evaluated on this round's first"
        else:
            why = "own fitness is NaN" if not is_finite(fit[r]) else f"better than own {fit[r]:.6g}{diff}"
        out.append(
            Decision(
                action="copy_pod" if kind == "pod" else "load_entry",
                source_rank=ref if kind == "pod" else None,
                source_entry=ref if kind == "entry" else None,
                source_score=score,
                reason=f"drew {what} ({score:.6g}), {why}",
                verify=verdict == "verify",
                diff_mean=dm,
                diff_se=dse,
                **base,
            )
        )
    return out


# ----------------------------------------------------------------------------- pbt


def pbt_select(
    reports: Sequence[PodReport],
    round: int,
    seed: int,
    space: Mapping[str, Any],
    quantile: float = 0.25,
    resample_prob: float = 0.25,
    perturb_factors: Sequence[float] = (0.8, 1.2),
    steps_tolerance: float = 0.25,
    entries: Iterable[Entry | tuple] = (),
    top_k: int | None = None,
    ready_rounds: int = 0,
    rng_ranks: Sequence[int] | None = None,
    labels: Sequence[int] | None = None,
    reserve: int = 0,
) -> list[Decision]:
    """PBT truncation selection (exploit) plus perturbation (explore); one decision per rank.

    - Ranking: finite fitness descending, ties by rank; non-finite fitness last.
    - ``k = quantile_size(n, quantile)``. The last ``k`` of the ranking, and every non-finite
      pod, are targets; the first ``k`` finite pods are sources.
    - Experience: a source must have ``env_steps >= target.env_steps * (1 - steps_tolerance)``
      (never copy a less-trained agent over a more-trained one; a late joiner may copy from
      older pods), and a finite target copies only from a strictly better source.
    - Ready (Jaderberg et al.): a pod that took another agent fewer than ``ready_rounds`` rounds
      ago is not a target (it keeps, so that a hyperparameter it just drew can show), and the
      next worst ready pod outside the sources is replaced in its place.
    - Reserve: a pod of rank below ``reserve`` (its MPI rank: ``rng_ranks`` when given) with
      finite fitness is never a target either, and the next worst pod is replaced in its place:
      it trains as an independent pod would, and can still be a source.
    - A target draws its source uniformly among the eligible ones (Generator seeded by
      (seed, round, rank)) and gets ``explore(source.hparams)`` as its new hyperparameters.
    - A NaN target with no eligible source copies the best finite pod; with no finite pod, the
      best finite ``entries`` item (hyperparameters kept); else it resets.
    - ``labels``: the pods' names in the reasons (as :func:`elegantrl_select`).
    - Publish: sources that are drawn, plus pods that would enter the top ``top_k`` of
      ``entries`` plus this round's pods (when ``top_k`` is given).
    """
    reports, entries = _check_reports(reports), entries_of(entries)
    n = len(reports)
    fit = [float(p.fitness) if is_finite(p.fitness) else float("nan") for p in reports]
    order = _ranking(fit)
    finite = [r for r in order if is_finite(fit[r])]
    k = quantile_size(n, quantile)
    sources = finite[:k]
    # The k worst pods that are ready (a pod that copied another, or started, fewer than
    # ready_rounds rounds ago is skipped, and the next worst ready pod outside the sources takes
    # its place), plus every non-finite pod.
    targets = {r for r in range(n) if not is_finite(fit[r])}
    not_ready: set[int] = set()
    reserved = _reserved(n, reserve, rng_ranks)
    source_set, finite_targets = set(sources), 0  # a set and a count: linear in the pool
    for r in reversed([r for r in finite if r not in source_set and r not in reserved]):
        if finite_targets >= k:
            break
        last = reports[r].last_copy_round
        if round - last < ready_rounds:
            not_ready.add(r)
        else:
            targets.add(r)
            finite_targets += 1

    decisions: dict[int, Decision] = {}
    drawn: set[int] = set()
    for r in range(n):
        me = reports[r]
        base = dict(rank=r, publish=False, fitness=fit[r], old_hparams=dict(me.hparams))
        if r in not_ready:
            decisions[r] = Decision(
                action="keep", reason=f"bottom of the pool, not ready ({_changed(me.last_copy_round)})", **base
            )
            continue
        if r not in targets:
            why = (
                "top quantile" if r in sources else "reserve: never replaced" if r in reserved else "middle of the pool"
            )
            decisions[r] = Decision(action="keep", reason=why if n > 1 else "world of one", **base)
            continue
        rng = make_rng(seed, round, rng_ranks[r] if rng_ranks else r, _STREAM_PBT)
        min_steps = me.env_steps * (1.0 - steps_tolerance)
        s = draw_eligible(
            rng,
            sources,
            lambda s, r=r, me=me: (
                reports[s].env_steps >= min_steps
                and (  # on common
                    not is_finite(fit[r])
                    or _compare(fit[r], me.returns, fit[s], reports[s].returns or None, 0.0)[0] == "take"
                )
            ),
        )
        if s is None and not is_finite(fit[r]) and finite:  # start states: better in the paired sense (any margin > 0)
            s = finite[0]
        if s is not None:
            drawn.add(s)
            new = explore(reports[s].hparams, space, rng, resample_prob, perturb_factors)
            why = "fitness is NaN" if not is_finite(fit[r]) else "bottom quantile"
            _, dm, dse = _compare(fit[r], me.returns, fit[s], reports[s].returns or None, 0.0)
            decisions[r] = Decision(
                action="copy_pod",
                source_rank=s,
                source_score=fit[s],
                new_hparams=new,
                reason=f"{why}: copy pod {labels[s] if labels else s} ({fit[s]:.6g}) and explore",
                diff_mean=dm,
                diff_se=dse,
                **base,
            )
            continue
        if is_finite(fit[r]):
            reason = "bottom quantile, but no better source with comparable experience"
            decisions[r] = Decision(action="keep", reason=reason, **base)
            continue
        best = _best_entry(entries)
        if best is not None:
            decisions[r] = Decision(
                action="load_entry",
                source_entry=best[0],
                source_score=best[1],
                reason="fitness is NaN and no finite pod: load the best leaderboard entry",
                **base,
            )
        else:
            decisions[r] = Decision(action="reset", reason="fitness is NaN and no finite source exists", **base)

    return _with_publishers(decisions, drawn | _in_board(fit, finite, entries, top_k))


def _in_board(fit: Sequence[float], finite: Sequence[int], entries: list[Entry], top_k: int | None) -> set[int]:
    """The pods that would enter the top ``top_k`` of ``entries`` plus this round's finite pods."""
    if top_k is None:
        return set()
    cands = [(fit[r], (0, r, ""), r) for r in finite]
    cands += [(float(e.score), (1, 0, e.id), None) for e in entries if is_finite(e.score)]
    cands.sort(key=lambda c: (-c[0], c[1]))
    return {c[2] for c in cands[: max(int(top_k), 0)] if c[2] is not None}


def _reserved(n: int, reserve: int, rng_ranks: Sequence[int] | None) -> set[int]:
    """The indices of the table whose pods are in the reserve (MPI rank below ``reserve``)."""
    return {r for r in range(n) if (rng_ranks[r] if rng_ranks else r) < reserve}


def _with_publishers(decisions: Mapping[int, Decision], publishers: set[int]) -> list[Decision]:
    """The decisions in rank order, ``publish`` set for ``publishers``."""
    return [replace(decisions[r], publish=True) if r in publishers else decisions[r] for r in range(len(decisions))]


# ----------------------------------------------------------------------------- dexpbt


def dexpbt_cuts(fitness: Sequence[float], threshold_std: float, threshold_abs: float = 0.0) -> tuple[float, float]:
    """DexPBT's cuts ``(upper, lower)`` of a pool's finite fitness: ``max(m + k s, m + a)`` and
    ``min(m - k s, m - a)`` (``m``, ``s``: mean and population standard deviation; ``k``:
    ``threshold_std``, ``a``: ``threshold_abs``). NaN both when no pod has a finite fitness."""
    f = np.asarray([float(x) for x in fitness if is_finite(x)], dtype=np.float64)
    if not len(f):
        return math.nan, math.nan
    m, s = float(f.mean()), float(f.std())
    return max(m + threshold_std * s, m + threshold_abs), min(m - threshold_std * s, m - threshold_abs)


def dexpbt_select(
    reports: Sequence[PodReport],
    round: int,
    seed: int,
    space: Mapping[str, Any],
    threshold_std: float = 0.1,
    threshold_abs: float = 0.0,
    mutation_rate: float = 0.25,
    change_range: Sequence[float] = (1.1, 1.5),
    steps_tolerance: float = 0.25,
    entries: Iterable[Entry | tuple] = (),
    top_k: int | None = None,
    ready_rounds: int = 0,
    rng_ranks: Sequence[int] | None = None,
    labels: Sequence[int] | None = None,
    reserve: int = 0,
) -> list[Decision]:
    """DexPBT's natural selection (Isaac Lab's PBT); one decision per rank.

    - Cuts (:func:`dexpbt_cuts`) from the pool's finite fitness: leaders strictly above the
      upper cut, underperformers strictly below the lower one; every non-finite pod is an
      underperformer too. Equal fitness everywhere (no spread) leaves nobody on either side.
    - Only underperformers act. Each draws a leader uniformly among those with
      ``env_steps >= its own x (1 - steps_tolerance)`` (Generator seeded by (seed, round, rank)),
      copies it and takes the leader's hyperparameters through :func:`mutate`; with no such
      leader a finite underperformer keeps its agent and mutates its own hyperparameters
      (action ``keep`` with ``new_hparams``).
    - Ready (as :func:`pbt_select`): a finite underperformer that took another agent, or started,
      fewer than ``ready_rounds`` rounds ago keeps its agent and its hyperparameters, so that the
      first rounds do not act on agents that have not learned yet.
    - Reserve (as :func:`pbt_select`): a finite underperformer of rank below ``reserve`` keeps its
      agent and its hyperparameters.
    - A NaN pod with no leader copies the best finite pod; with no finite pod, the best finite
      ``entries`` item; else it resets.
    - Publish: drawn sources, plus pods that would enter the top ``top_k`` (as :func:`pbt_select`).
    """
    reports, entries = _check_reports(reports), entries_of(entries)
    n = len(reports)
    fit = [float(p.fitness) if is_finite(p.fitness) else float("nan") for p in reports]
    finite = [r for r in _ranking(fit) if is_finite(fit[r])]
    upper, lower = dexpbt_cuts(fit, threshold_std, threshold_abs)
    leaders = [r for r in finite if fit[r] > upper]
    reserved = _reserved(n, reserve, rng_ranks)
    cuts = f"cuts {lower:.6g} / {upper:.6g}" if finite else "no finite fitness"
    decisions: dict[int, Decision] = {}
    drawn: set[int] = set()
    for r in range(n):
        me = reports[r]
        base = dict(rank=r, publish=False, fitness=fit[r], old_hparams=dict(me.hparams))
        nan = not is_finite(fit[r])
        if not nan and not fit[r] < lower:
            why = "leader" if r in leaders else "between the cuts"
            decisions[r] = Decision(action="keep", reason=f"{why} ({cuts})" if n > 1 else "world of one", **base)
            continue
        if not nan and round - me.last_copy_round < ready_rounds:
            decisions[r] = Decision(
                action="keep", reason=f"underperformer ({cuts}), not ready ({_changed(me.last_copy_round)})", **base
            )
            continue
        if not nan and r in reserved:
            decisions[r] = Decision(action="keep", reason=f"underperformer ({cuts}), reserve: never replaced", **base)
            continue
        rng = make_rng(seed, round, rng_ranks[r] if rng_ranks else r, _STREAM_DEXPBT)
        min_steps = me.env_steps * (1.0 - steps_tolerance)
        mine = [s for s in leaders if reports[s].env_steps >= min_steps]
        s = mine[int(rng.integers(len(mine)))] if mine else (finite[0] if nan and finite else None)
        if s is not None:
            drawn.add(s)
            _, dm, dse = _compare(fit[r], me.returns, fit[s], reports[s].returns or None, 0.0)
            what = "a leader" if s in leaders else "the best finite pod (no leader)"
            decisions[r] = Decision(
                action="copy_pod",
                source_rank=s,
                source_score=fit[s],
                new_hparams=mutate(reports[s].hparams, space, rng, mutation_rate, change_range),
                reason=f"{'fitness is NaN' if nan else 'underperformer'} ({cuts}): copy {what}, pod "
                f"{labels[s] if labels else s} ({fit[s]:.6g}), and mutate",
                diff_mean=dm,
                diff_se=dse,
                **base,
            )
        elif not nan:
            decisions[r] = Decision(
                action="keep",
                new_hparams=mutate(me.hparams, space, rng, mutation_rate, change_range),
                reason=f"underperformer ({cuts}), no leader with comparable experience: mutate own hyperparameters",
                **base,
            )
        else:
            best = _best_entry(entries)
            if best is not None:
                decisions[r] = Decision(
                    action="load_entry",
                    source_entry=best[0],
                    source_score=best[1],
                    reason="fitness is NaN and no finite pod: load the best leaderboard entry",
                    **base,
                )
            else:
                decisions[r] = Decision(action="reset", reason="fitness is NaN and no finite source exists", **base)
    return _with_publishers(decisions, drawn | _in_board(fit, finite, entries, top_k))


def _best_entry(entries: list[Entry]) -> tuple[str, float] | None:
    best = sorted(((-float(e.score), e.id) for e in entries if is_finite(e.score)))
    return (best[0][1], -best[0][0]) if best else None


def _check_reports(reports: Sequence[PodReport]) -> list[PodReport]:
    reports = sorted(reports, key=lambda p: p.rank)
    if [p.rank for p in reports] != list(range(len(reports))):
        raise ValueError(f"reports must cover ranks 0..n-1 exactly once, got {[p.rank for p in reports]}")
    return reports


# ----------------------------------------------------------------------------- dispatch


def decide(
    reports: Sequence[PodReport],
    entries: Iterable[Entry | tuple],
    round: int,
    seed: int,
    cfg: TournamentConfig,
    rng_ranks: Sequence[int] | None = None,
) -> list[Decision]:
    """All pods' decisions for one round (index = rank), by ``cfg.mode``.

    ``entries`` are the leaderboard's :class:`~podracer_hpc.pool.entry.Entry` items before this
    round's publications, or tuples ``(entry_id, score[, env_steps[, returns[, kind]]])``
    (``returns``: the entry's episodes if they were on this round's start states, else None);
    pass the same list on every rank (list on rank 0, then broadcast). The reports' ``returns``
    are each pod's episodes on the round's common start states: comparisons are paired.

    ``rng_ranks``: the MPI rank of each report's pod, when the reports are not ranks 0..n-1 of
    one world (an asynchronous pod deciding alone: it is index 0 of its own table, and its
    random draws must still be its own).

    Mixed pools (reports of several kinds, e.g. PPO and SAC pods): each kind holds its own
    round with the same rule, among its own pods and the entries of its kind (or of unknown
    kind), so a pod is only ever offered an agent it can load; PBT explores each learner's own
    space (:func:`effective_space`). Fitness is the common evaluation either way, so scores and
    the leaderboard compare across kinds.
    """
    reports = _check_reports(reports)
    entries = entries_of(entries)
    kinds = sorted({p.kind for p in reports})
    if len(kinds) == 1:
        return _decide_kind(reports, [e for e in entries if e.kind in (None, kinds[0])], round, seed, cfg, rng_ranks)
    # A mixed pool: each kind of agent holds its own round on its own entries (a pod never takes
    # an agent it cannot load), ranks renumbered within the kind, random streams kept per rank.
    out: dict[int, Decision] = {}
    for kind in kinds:
        ranks = [p.rank for p in reports if p.kind == kind]
        sub = [replace(reports[r], rank=i) for i, r in enumerate(ranks)]
        mine = [e for e in entries if e.kind in (None, kind)]
        streams = [rng_ranks[r] if rng_ranks else r for r in ranks]
        for d in _decide_kind(sub, mine, round, seed, cfg, streams, labels=ranks):
            out[ranks[d.rank]] = replace(
                d, rank=ranks[d.rank], source_rank=None if d.source_rank is None else ranks[d.source_rank]
            )
    return [out[r] for r in range(len(reports))]


def _decide_kind(
    reports: list[PodReport],
    entries: list[Entry],
    round: int,
    seed: int,
    cfg: TournamentConfig,
    rng_ranks: Sequence[int] | None,
    labels: Sequence[int] | None = None,
) -> list[Decision]:
    """:func:`decide` for pods of one kind (``labels``: their ranks in the reasons)."""
    if cfg.mode == "elegantrl":
        return elegantrl_select(
            [p.fitness for p in reports],
            entries,
            round,
            seed,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            hparams=[p.hparams for p in reports],
            env_steps=[p.env_steps for p in reports],
            steps_tolerance=cfg.steps_tolerance,
            rng_ranks=rng_ranks,
            returns=[p.returns for p in reports],
            margin_se=cfg.margin_se,
            labels=labels,
        )
    if cfg.mode == "pbt":
        return pbt_select(
            reports,
            round,
            seed,
            effective_space(cfg, reports[0].kind.split(" ")[0] or "ppo"),  # a kind begins with its learner
            quantile=cfg.quantile,
            resample_prob=cfg.resample_prob,
            perturb_factors=cfg.perturb_factors,
            steps_tolerance=cfg.steps_tolerance,
            entries=entries,
            top_k=cfg.top_k,
            ready_rounds=cfg.ready_rounds,
            rng_ranks=rng_ranks,
            labels=labels,
            reserve=cfg.reserve,
        )
    if cfg.mode == "dexpbt":
        return dexpbt_select(
            reports,
            round,
            seed,
            effective_space(cfg, reports[0].kind.split(" ")[0] or "ppo"),
            threshold_std=cfg.threshold_std,
            threshold_abs=cfg.threshold_abs,
            mutation_rate=cfg.mutation_rate,
            change_range=cfg.change_range,
            steps_tolerance=cfg.steps_tolerance,
            entries=entries,
            top_k=cfg.top_k,
            ready_rounds=cfg.ready_rounds,
            rng_ranks=rng_ranks,
            labels=labels,
            reserve=cfg.reserve,
        )
    if cfg.mode == "none":
        return [
            Decision(
                rank=p.rank,
                action="keep",
                publish=False,
                fitness=float(p.fitness),
                old_hparams=dict(p.hparams),
                reason="tournament disabled",
            )
            for p in reports
        ]
    raise ValueError(f"unknown tournament mode {cfg.mode!r}")
