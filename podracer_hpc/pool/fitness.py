"""Fitness on common start states, and comparisons that carry their error (common random numbers).

An agent's fitness is the mean return of deterministic episodes from a set of start states. Two
agents compared on *different* start states differ by the states' luck as much as by skill
(a Pendulum agent scored 31 apart on two pods' states, several times the gap between agents);
on the *same* states the luck cancels in each episode's difference. So:

- an evaluation set is ``(seed, episodes)``: episode i starts from the state the task draws for
  ``seed`` and index i, whatever the batch and whoever evaluates. :func:`eval_seed` derives the
  seeds of a run from the run's seed alone (never from the rank), one per purpose and index: the
  periodic evaluation at env step x uses ``eval_seed(seed, "eval", x)``, and every pod of a
  collective round the set of the round's env-step point (new states each round: no selection
  tuned to one set; and the states an independent pod of the same run meets at that point, so
  that a tournament and independent pods reach a target on the same evaluations, not on luckier
  or unluckier start states), asynchronous rounds one set for the whole tournament
  (``"async"``: every entry of the run compares with every pod), the final verdict ``"final"``
  (``"round"``, the sets collective rounds once had, stays in :data:`EVAL_KINDS` so that every
  other kind keeps its seeds);
- a comparison of two agents on one set is paired: ``d_i = b_i - a_i``, its mean and standard
  error (:func:`paired`); ``b`` is better by a margin of ``k`` standard errors when
  ``mean(d) > max(k * se(d), 0)`` (:func:`better`). Two copies of one agent get ``d = 0``: never
  "better", bit for bit on a CPU;
- a score measured on another set (an entry of an earlier round, another job) is not compared:
  the candidate is evaluated again on the deciding pod's set first (``Decision.verify``).

Pure (numpy only; scipy for the t quantile of an interval, imported on first use): the rank
program, the tournament rules and ``podracer evaluate`` share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

__all__ = ["EVAL_KINDS", "Fitness", "better", "eval_seed", "paired", "t_quantile", "t_interval"]

# What an evaluation set is for; each kind gets its own stream of seeds.
EVAL_KINDS = ("round", "async", "eval", "final", "evaluate", "join")
_EVAL_STREAM = 0xE7A1


def eval_seed(seed: int, kind: str, index: int = 0) -> int:
    """The seed of the start states of evaluation ``index`` of ``kind`` in a run of ``seed`` (the
    run's seed, not a pod's: every pod of the run draws the same states). In [0, 2**31)."""
    if kind not in EVAL_KINDS:
        raise ValueError(f"eval kind must be one of {EVAL_KINDS}, got {kind!r}")
    if int(seed) < 0 or int(index) < 0:
        raise ValueError(f"seed and index must be >= 0, got {seed}, {index}")
    ss = np.random.SeedSequence([int(seed), _EVAL_STREAM, EVAL_KINDS.index(kind), int(index)])
    return int(ss.generate_state(1, dtype=np.uint32)[0] >> 1)


@dataclass(frozen=True)
class Fitness:
    """One evaluation of one agent: its episodes' returns on the set ``(seed, episodes)``."""

    returns: tuple[float, ...]
    seed: int = -1  # the set's seed (-1: unknown, e.g. an entry of an older version)
    mean: float = field(init=False)
    se: float = field(init=False)  # standard error of the mean (0 with one episode)

    def __post_init__(self) -> None:
        r = np.asarray(self.returns, dtype=np.float64)
        object.__setattr__(self, "returns", tuple(float(x) for x in r))
        object.__setattr__(self, "mean", float(r.mean()) if r.size else math.nan)
        object.__setattr__(self, "se", float(r.std(ddof=1) / math.sqrt(r.size)) if r.size > 1 else 0.0)

    @property
    def episodes(self) -> int:
        return len(self.returns)

    @property
    def key(self) -> tuple[int, int]:
        """What makes two evaluations comparable episode by episode."""
        return (self.seed, self.episodes)

    @property
    def finite(self) -> bool:
        return bool(self.returns) and all(math.isfinite(x) for x in self.returns)

    def ci95(self) -> tuple[float, float]:
        """The 95% t-interval of the mean (NaN with fewer than 2 episodes)."""
        return t_interval(self.returns)

    def to_json(self) -> dict:
        return {
            "seed": self.seed,
            "episodes": self.episodes,
            "mean": self.mean,
            "se": self.se,
            "returns": list(self.returns),
        }

    def to_checkpoint(self) -> dict[str, Any]:
        """This evaluation as checkpoint JSON (NaN returns, a frozen pod's, as null)."""
        return {"seed": self.seed, "returns": [x if math.isfinite(x) else None for x in self.returns]}

    @classmethod
    def from_checkpoint(cls, d: Any) -> "Fitness":
        """The evaluation a checkpoint kept; a plain number (checkpoints of an older version) has no episodes."""
        if isinstance(d, dict) and isinstance(d.get("returns"), list):
            return cls(tuple(math.nan if x is None else float(x) for x in d["returns"]), int(d.get("seed", -1)))
        return cls((math.nan if d is None else float(d),))

    @classmethod
    def from_json(cls, d: object) -> "Fitness | None":
        """The evaluation an entry or checkpoint recorded, or None if it recorded none (or garbage)."""
        if not isinstance(d, dict) or not isinstance(d.get("returns"), list):
            return None
        try:
            return cls(tuple(float(x) for x in d["returns"]), int(d.get("seed", -1)))
        except (TypeError, ValueError):
            return None


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of ``b_i - a_i`` over episodes on common start states."""
    if len(a) != len(b) or not len(a):
        raise ValueError(f"a paired comparison needs returns on the same start states, got {len(a)} and {len(b)}")
    d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else 0.0
    return float(d.mean()), se


def better(a: Sequence[float], b: Sequence[float], margin_se: float) -> tuple[bool, float, float]:
    """Whether ``b`` beats ``a`` on common start states by more than ``margin_se`` standard errors
    of the paired difference (and by more than 0); returns ``(verdict, diff_mean, diff_se)``."""
    m, se = paired(a, b)
    return bool(m > max(margin_se * se, 0.0)), m, se


def t_quantile(df: int, q: float = 0.975) -> float:
    """Student's t quantile (exact, scipy); NaN for df < 1."""
    if df < 1:
        return math.nan
    from scipy.stats import t  # noqa: PLC0415  (0.3 s to import: only where an interval is printed)

    return float(t.ppf(q, df))


def t_interval(x: Sequence[float], q: float = 0.975) -> tuple[float, float]:
    """The two-sided t-interval of the mean of ``x`` (95% by default); NaN with fewer than 2 values."""
    a = np.asarray(x, dtype=np.float64)
    if a.size < 2:
        return (math.nan, math.nan)
    half = t_quantile(a.size - 1, q) * float(a.std(ddof=1)) / math.sqrt(a.size)
    return (float(a.mean()) - half, float(a.mean()) + half)
