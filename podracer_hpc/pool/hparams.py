"""The hyperparameters PBT explores: the default PPO space, a run's effective space, the
explore step (perturb or resample within bounds), DexPBT's mutation, and a draw from the prior
(random search). Pure; rules.py's PBT rules and the study's random search use them."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from podracer_hpc.config import EXPLORING_MODES, MUTABLE_BY_ALGO, HParamRange, TournamentConfig, normalize_space

__all__ = [
    "DEFAULT_PBT_SPACE",
    "DEFAULT_SPACES",
    "check_hparams",
    "declared_space",
    "describe_space",
    "effective_space",
    "explore",
    "is_finite",
    "mutate",
    "prior_draw",
]


def is_finite(x: Any) -> bool:
    """Whether ``x`` reads as a finite number (a fitness or a hyperparameter value)."""
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


# What PBT explores when tournament.hparam_space is empty: the PPO settings that matter most and
# are safe to change while a pod trains (names as in config.MUTABLE_HPARAMS). Ray Tune and Isaac
# Gym's PBT ship default mutation sets too; these bounds are the usual tuned ranges of PPO.
DEFAULT_PBT_SPACE: dict[str, HParamRange] = {
    "learning_rate": HParamRange(1e-5, 1e-2, True),
    "ent_coef": HParamRange(0.0, 0.02),
    "clip_coef": HParamRange(0.05, 0.4),
    "gae_lambda": HParamRange(0.8, 0.99),
}


# SAC and TD3: the step sizes (CleanRL's defaults 3e-4/1e-3 sit inside) and TD3's exploration
# noise; tau and SAC's temperature are left alone by default (the temperature is learned).
DEFAULT_SPACES: dict[str, dict[str, HParamRange]] = {
    "ppo": DEFAULT_PBT_SPACE,
    "sac": {"actor_lr": HParamRange(3e-5, 3e-3, True), "critic_lr": HParamRange(1e-4, 1e-2, True)},
    "td3": {
        "actor_lr": HParamRange(3e-5, 3e-3, True),
        "critic_lr": HParamRange(3e-5, 3e-3, True),
        "exploration_noise": HParamRange(0.05, 0.5),
    },
}


def effective_space(cfg: TournamentConfig, algo: str = "ppo") -> dict[str, HParamRange]:
    """The hyperparameter space pods of learner ``algo`` explore: the configured one's names that
    this learner has (a mixed pool's space may name several learners'), or its PBT default."""
    if cfg.hparam_space or cfg.mode not in EXPLORING_MODES:
        return {k: r for k, r in cfg.hparam_space.items() if k in MUTABLE_BY_ALGO[algo]}
    return dict(DEFAULT_SPACES[algo])


def declared_space(
    cfg: TournamentConfig, algo: str = "ppo", own: Mapping[str, float] | None = None
) -> dict[str, HParamRange]:
    """The ranges hyperparameters taken from another agent (a leaderboard entry, a population
    entry) must lie in: ``tournament.hparam_space``'s names this learner has, or, when it names
    none, the learner's default space (:data:`DEFAULT_SPACES`), whatever the tournament mode;
    each widened to hold the pod's ``own`` value (a run configured outside the default range
    takes its peers' agents)."""
    mine = {k: r for k, r in cfg.hparam_space.items() if k in MUTABLE_BY_ALGO[algo]} or dict(DEFAULT_SPACES[algo])
    for k, v in (own or {}).items():
        if k in mine and is_finite(v):
            r = mine[k]
            mine[k] = HParamRange(min(r.low, float(v)), max(r.high, float(v)), r.log_scale)
    return mine


def check_hparams(values: Mapping[str, Any], space: Mapping[str, HParamRange], algo: str = "ppo") -> list[str]:
    """What forbids a pod of learner ``algo`` to take the hyperparameters ``values`` of another
    agent: names its learner does not have, values that are not finite numbers, values outside
    their range in ``space`` (:func:`declared_space`). Empty when they may be taken."""
    bad = []
    for name, v in sorted(values.items(), key=lambda kv: str(kv[0])):
        if name not in MUTABLE_BY_ALGO[algo]:
            bad.append(f"{name!r} is not a hyperparameter of a {algo} agent")
        elif isinstance(v, bool) or not is_finite(v):
            bad.append(f"{name} = {v!r} is not a finite number")
        elif name in space and not space[name].low <= float(v) <= space[name].high:
            bad.append(f"{name} = {float(v):g} is outside its range [{space[name].low:g}, {space[name].high:g}]")
    return bad


def describe_space(space: Mapping[str, HParamRange]) -> str:
    """One line: ``learning_rate [1e-05, 0.01] log, ent_coef [0, 0.02], ...``."""
    return (
        ", ".join(f"{k} [{r.low:g}, {r.high:g}]{' log' if r.log_scale else ''}" for k, r in space.items()) or "(none)"
    )


def explore(
    hparams: Mapping[str, float],
    space: Mapping[str, Any],
    rng: np.random.Generator,
    resample_prob: float = 0.25,
    perturb_factors: Sequence[float] = (0.8, 1.2),
) -> dict[str, float]:
    """PBT explore step: each hyperparameter in ``space`` is resampled from its prior (uniform,
    or log-uniform for log-scale ranges) with probability ``resample_prob``, else multiplied by a
    factor drawn uniformly from ``perturb_factors``; then clipped to its bounds. A value outside
    its range (a run started elsewhere, e.g. a learning rate of 3e-6 against [1e-5, 1e-2]) is
    always resampled: nudging it by x1.2 would only pin it to the bound. Names outside the space
    are copied unchanged; names in the space missing from ``hparams`` are sampled."""
    space = normalize_space(space)
    out = {k: float(v) for k, v in hparams.items()}
    for name in sorted(space):  # fixed order: identical draws on every rank
        r = space[name]
        u = rng.random()
        factor = float(perturb_factors[int(rng.integers(len(perturb_factors)))])
        outside = name in out and is_finite(out[name]) and not r.low <= out[name] <= r.high
        if name not in out or not is_finite(out[name]) or u < resample_prob or outside:
            if r.log_scale:
                v = math.exp(rng.uniform(math.log(r.low), math.log(r.high)))
            else:
                v = float(rng.uniform(r.low, r.high))
        else:
            v = out[name] * factor
        out[name] = float(min(max(v, r.low), r.high))
    return out


def _from_prior(r: HParamRange, rng: np.random.Generator) -> float:
    """One draw from a range's prior: uniform, or log-uniform for a log-scale range."""
    if r.log_scale:
        return math.exp(rng.uniform(math.log(r.low), math.log(r.high)))
    return float(rng.uniform(r.low, r.high))


def mutate(
    hparams: Mapping[str, float],
    space: Mapping[str, Any],
    rng: np.random.Generator,
    rate: float = 0.25,
    change_range: Sequence[float] = (1.1, 1.5),
) -> dict[str, float]:
    """DexPBT's mutation (Isaac Lab's PBT): each hyperparameter in ``space`` changes with
    probability ``rate``, multiplied or divided (even odds) by a factor drawn uniformly in
    ``change_range``, then clipped to its bounds; the others stay. A value that is missing, not
    finite or outside its range is drawn from the prior instead. Every name consumes the same
    draws whatever happens, so every rank computes the same result."""
    space = normalize_space(space)
    out = {k: float(v) for k, v in hparams.items()}
    lo, hi = float(min(change_range)), float(max(change_range))
    for name in sorted(space):
        r = space[name]
        u, factor, up = rng.random(), float(rng.uniform(lo, hi)), rng.random() < 0.5
        prior = _from_prior(r, rng)
        x = out.get(name)
        if x is None or not is_finite(x) or not r.low <= x <= r.high:
            v = prior
        elif u < rate:
            v = x * factor if up else x / factor
        else:
            continue
        out[name] = float(min(max(v, r.low), r.high))
    return out


def prior_draw(space: Mapping[str, Any], seed: int) -> dict[str, float]:
    """Random search's draw for the pod of seed ``seed``: every hyperparameter of ``space`` from
    its prior (uniform, or log-uniform on a log scale), from a Generator seeded by ``seed`` alone,
    so a pod's draw does not depend on the pool it is in."""
    if int(seed) < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5EA2C4]))
    space = normalize_space(space)
    return {name: _from_prior(space[name], rng) for name in sorted(space)}


def first_draw(space: Mapping[str, Any], seed: int, index: int) -> dict[str, float] | None:
    """Where pod ``index`` (seed ``seed``) of a fresh search starts: pod 0 keeps the job's values
    (None), every other pod its :func:`prior_draw`. A PBT or DexPBT pool's first population
    (``tournament.initial_hparams``) and random search's pods both start here, so the two searches
    differ only in what they do after the start."""
    return None if index == 0 else prior_draw(space, seed)


def draw_eligible(rng: Any, items: Sequence[int], ok: Callable[[int], bool], tries: int = 16) -> int | None:
    """One of ``items`` that passes ``ok``, uniformly at random (None if none does): first by
    rejection (a uniform draw from all, kept if it passes: expected O(1) checks when most pass,
    as PBT's top-quantile sources mostly beat a bottom-quantile target), after ``tries`` draws
    from the whole list. Either way uniform over the passing items, so the pool's PBT round is
    linear in the pool instead of (N/4)^2 paired comparisons."""
    tried: set[int] = set()
    for _ in range(min(len(items), tries)):
        x = items[int(rng.integers(len(items)))]
        if x not in tried:
            tried.add(x)
            if ok(x):
                return x
    passing = [x for x in items if x not in tried and ok(x)]
    return passing[int(rng.integers(len(passing)))] if passing else None
