"""A seeded synthetic stock market for tests and demos.

Daily bars of ``num_stocks`` assets on business days, from a regime-switching factor model:

- **Regimes**: a Markov chain over calm (bull), volatile (bear) and crisis states, each with its
  own drift, volatility multiplier and market-factor weight (correlations rise in a crisis).
- **Correlation**: returns load on a market factor (betas in [0.5, 1.5]) and on one of a few
  sector factors, plus an idiosyncratic part.
- **Heavy tails**: every shock is Student-t with ``tail_df`` degrees of freedom (unit variance).
- **Predictable structure** (``structure``): in a fraction ``predictable_fraction`` of the
  assets the idiosyncratic part is AR(1) with coefficient ``+predictability`` (``momentum``),
  ``-predictability`` (``mean_reversion``), either sign by asset (``mixed``), or none
  (``none``). Which assets and which sign are in ``meta["predictable"]``.

``synthetic_history(seeds, ...)`` joins independent draws of the market (one per seed) end to end:
a long training history in which no single path, stock or price level repeats, so that a policy
trained on it has to learn the structure rather than the path (``bench/trading_edge.py``).

Open, high, low and volume are derived from the closes (an overnight gap, an intraday range,
volume growing with the absolute return) so that every indicator has sensible input. The same
arguments always give the same market (numpy's PCG64 from ``seed``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from podracer_hpc.trading.data import MarketData
from podracer_hpc.trading.task import STRUCTURES  # noqa: E402  (declared with the task, no torch)

# calm, volatile, crisis
_DRIFT = np.array([0.15, -0.05, -0.60]) / 252
_VOL_MULT = np.array([1.0, 1.7, 3.0])
_MKT_WEIGHT = np.array([1.0, 1.2, 1.8])
_TRANSITIONS = np.array(
    [
        [0.990, 0.008, 0.002],
        [0.020, 0.970, 0.010],
        [0.040, 0.060, 0.900],
    ]
)


def _student_t(rng: np.random.Generator, df: float, size: tuple[int, ...]) -> np.ndarray:
    """Student-t draws scaled to unit variance (Gaussian for df = inf)."""
    if not np.isfinite(df):
        return rng.standard_normal(size)
    return rng.standard_t(df, size) * np.sqrt((df - 2.0) / df)


def synthetic_market(
    num_stocks: int = 30,
    num_days: int = 1512,
    seed: int = 0,
    structure: str = "momentum",
    predictable_fraction: float = 0.3,
    predictability: float = 0.25,
    tail_df: float = 4.0,
    num_sectors: int = 4,
    start_date: str = "2010-01-04",
) -> MarketData:
    """A :class:`MarketData` of ``num_days`` business days (see the module docstring)."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {', '.join(STRUCTURES)}, got {structure!r}")
    if num_stocks < 1 or num_days < 2:
        raise ValueError(f"need num_stocks >= 1 and num_days >= 2, got {num_stocks}, {num_days}")
    if not tail_df > 2:
        raise ValueError(f"tail_df must be > 2 (finite variance), got {tail_df}")
    rng = np.random.default_rng(seed)
    S, T = int(num_stocks), int(num_days)

    # regime path
    u = rng.random(T)
    regime = np.zeros(T, dtype=np.int64)
    cum = np.cumsum(_TRANSITIONS, axis=1)
    for t in range(1, T):
        regime[t] = min(int(np.searchsorted(cum[regime[t - 1]], u[t], side="right")), 2)

    # factor model
    beta = rng.uniform(0.5, 1.5, S)
    sector = rng.integers(0, max(1, num_sectors), S)
    sec_load = rng.uniform(0.3, 0.8, S)
    idio_vol = rng.uniform(0.008, 0.02, S)
    mkt = 0.009 * _student_t(rng, tail_df, (T,))
    sec = 0.006 * _student_t(rng, tail_df, (T, max(1, num_sectors)))
    eps = _student_t(rng, tail_df, (T, S)) * idio_vol

    # predictable idiosyncratic structure: AR(1) in a subset of assets
    phi = np.zeros(S)
    k = int(round(predictable_fraction * S)) if structure != "none" else 0
    chosen = np.sort(rng.choice(S, size=k, replace=False)) if k else np.zeros(0, dtype=np.int64)
    if structure == "momentum":
        phi[chosen] = predictability
    elif structure == "mean_reversion":
        phi[chosen] = -predictability
    elif structure == "mixed":
        phi[chosen] = np.where(rng.random(k) < 0.5, predictability, -predictability)
    idio = np.empty_like(eps)
    idio[0] = eps[0]
    for t in range(1, T):
        idio[t] = phi * idio[t - 1] + eps[t]

    vm = _VOL_MULT[regime][:, None]
    r = (
        _DRIFT[regime][:, None]
        + vm * (_MKT_WEIGHT[regime][:, None] * beta * mkt[:, None] + sec_load * sec[:, sector])
        + vm * idio
    )
    r[0] = 0.0
    r = np.clip(r, -0.5, 1.0)
    p0 = np.exp(rng.uniform(np.log(10.0), np.log(300.0), S))
    close = p0 * np.exp(np.cumsum(np.log1p(r), axis=0))

    vol_day = (idio_vol + 0.009 * beta) * vm
    prev = np.vstack([close[:1], close[:-1]])
    open_ = prev * np.exp(0.25 * vol_day * rng.standard_normal((T, S)))
    open_[0] = close[0]
    top = np.maximum(open_, close)
    bot = np.minimum(open_, close)
    high = top * np.exp(np.abs(0.5 * vol_day * rng.standard_normal((T, S))))
    low = bot * np.exp(-np.abs(0.5 * vol_day * rng.standard_normal((T, S))))
    volume = np.round(np.exp(rng.normal(np.log(1e6), 0.3, (T, S))) * (1.0 + 20.0 * np.abs(r)))

    dates = np.busday_offset(np.datetime64(start_date, "D"), np.arange(T), roll="forward")
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))  # noqa: E731
    return MarketData(
        dates=dates.astype("datetime64[s]"),
        tickers=[f"SYN{i:03d}" for i in range(S)],
        open=t(open_),
        high=t(high),
        low=t(low),
        close=t(close),
        volume=t(volume),
        valid=torch.ones(T, S, dtype=torch.bool),
        notes=[f"synthetic market: seed {seed}, {S} stocks, {T} days, structure {structure}"],
        meta={
            "source": "synthetic",
            "seed": seed,
            "structure": structure,
            "regime": regime,
            "predictable": {f"SYN{i:03d}": float(phi[i]) for i in chosen},
        },
    )


def synthetic_history(
    seeds: Sequence[int],
    num_stocks: int = 30,
    days_per_market: int = 1512,
    structure: str = "momentum",
    price_band: tuple[float, float] = (10.0, 300.0),
    start_date: str = "2010-01-04",
    **market_kwargs: Any,
) -> MarketData:
    """Independent synthetic markets (``synthetic_market(num_stocks, days_per_market, seed, structure,
    **market_kwargs)`` for each seed) joined end to end on one business-day calendar.

    At each join every stock's prices (open, high, low, close) of the next market are scaled so
    that its first close equals the previous market's last close clipped into ``price_band``:
    the price path continues without a jump unless it had left the band (a stock near zero or
    far above its start is brought back in one bar), so that share-based orders keep their size
    over a long history. Returns inside each market are those of the market drawn alone.
    ``meta["segments"]`` holds the first row of each market and ``meta["seeds"]`` the seeds.
    """
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("synthetic_history needs at least one seed")
    lo, hi = (float(x) for x in price_band)
    if not 0 < lo <= hi:
        raise ValueError(f"price_band must be 0 < low <= high, got {price_band}")
    parts: dict[str, list[np.ndarray]] = {f: [] for f in ("open", "high", "low", "close", "volume")}
    last = None
    predictable: dict[str, list[float]] = {}
    for sd in seeds:
        m = synthetic_market(num_stocks, days_per_market, sd, structure, **market_kwargs)
        c = m.close.numpy()
        scale = np.ones(c.shape[1]) if last is None else np.clip(last, lo, hi) / c[0]
        for f in ("open", "high", "low", "close"):
            parts[f].append(getattr(m, f).numpy() * scale)
        parts["volume"].append(m.volume.numpy())
        last = parts["close"][-1][-1]
        for tic, phi in m.meta["predictable"].items():
            predictable.setdefault(tic, []).append(phi)
    T = len(seeds) * int(days_per_market)
    dates = np.busday_offset(np.datetime64(start_date, "D"), np.arange(T), roll="forward")
    t = lambda f: torch.from_numpy(np.ascontiguousarray(np.concatenate(parts[f]), dtype=np.float64))  # noqa: E731
    return MarketData(
        dates=dates.astype("datetime64[s]"),
        tickers=[f"SYN{i:03d}" for i in range(num_stocks)],
        open=t("open"),
        high=t("high"),
        low=t("low"),
        close=t("close"),
        volume=t("volume"),
        valid=torch.ones(T, num_stocks, dtype=torch.bool),
        notes=[
            f"synthetic history: {len(seeds)} markets (seeds {seeds[0]}..{seeds[-1]}) of {days_per_market} days, "
            f"{num_stocks} stocks, structure {structure}"
        ],
        meta={
            "source": "synthetic_history",
            "seeds": seeds,
            "structure": structure,
            "segments": [i * int(days_per_market) for i in range(len(seeds))],
            "predictable": predictable,
        },
    )


__all__ = ["synthetic_market", "synthetic_history", "STRUCTURES"]
