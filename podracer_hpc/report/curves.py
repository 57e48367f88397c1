"""Learning curves over runs (a tournament's pods copy each other: the run is the sample): each
run's pods reduced to one curve, then the mean and an exact 95% t-band over runs."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from podracer_hpc.report.tables import Table

__all__ = ["MIN_RUNS_FOR_BAND", "REDUCERS", "mean_curve", "run_curves", "t95"]


# ---------------------------------------------------------------------- curves


def t95(df: float) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom, t(0.975, df),
    exact for any ``df`` (``scipy.stats.t``; ``inf`` gives the normal's 1.95996); NaN for df < 1."""
    return float(_t975(np.array([df], dtype=float))[0])


def _t975(df: np.ndarray) -> np.ndarray:
    """:func:`t95` over an array of degrees of freedom."""
    from scipy import stats  # here, not at import: the tables need no scipy

    df = np.asarray(df, dtype=float)
    out = np.full(df.shape, math.nan)
    ok = df >= 1  # NaN compares False
    out[ok] = stats.t.ppf(0.975, df[ok])
    return out


# How a run's pods become the run's one curve (the run is the independent sample, its pods are not:
# a tournament's pods copy each other).
REDUCERS = {"mean": "the mean of its pods", "best": "its best pod at each point"}
MIN_RUNS_FOR_BAND = 3  # with 2 runs a 95% t-interval is +-12.7 sd/sqrt(2): wider than it says anything


def _pod_curves(evals: Table, x: str, y: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each pod's finite (x, y) points of one run, sorted by x (pods without any left out)."""
    out = []
    for p in evals.unique("pod"):
        u = evals.where(pod=p)
        xs, ys = u[x].astype(float), u[y].astype(float)
        ok = np.isfinite(xs) & np.isfinite(ys)
        if ok.any():
            o = np.argsort(xs[ok], kind="stable")
            out.append((xs[ok][o], ys[ok][o]))
    return out


def _grid(curves: Sequence[tuple[np.ndarray, np.ndarray]], max_points: int) -> np.ndarray:
    """The union of the curves' x values, thinned to about ``max_points`` (each curve's end kept)."""
    grid = np.unique(np.concatenate([c[0] for c in curves]))
    if len(grid) > max_points:
        grid = np.unique(np.concatenate([np.linspace(grid[0], grid[-1], max_points), [c[0][-1] for c in curves]]))
    return grid


def _on_grid(curves: Sequence[tuple[np.ndarray, np.ndarray]], grid: np.ndarray) -> np.ndarray:
    """Curves x grid: each curve interpolated linearly, only inside its own x range (NaN outside)."""
    vals = np.full((len(curves), len(grid)), math.nan)
    for i, (xs, ys) in enumerate(curves):
        inside = (grid >= xs[0]) & (grid <= xs[-1])
        vals[i, inside] = np.interp(grid[inside], xs, ys)
    return vals


def _enough(vals: np.ndarray, min_share: float) -> np.ndarray:
    """Grid points where at least ``min_share`` of the rows (at least one) have data."""
    return np.isfinite(vals).sum(axis=0) >= max(1, math.ceil(min_share * len(vals)))


def _reduce(vals: np.ndarray, how: str, min_share: float) -> np.ndarray:
    """One run's pods x grid to one curve: the mean or the max over the pods with data at each
    point, where at least ``min_share`` of its pods have data (so it does not jump where pods end)."""
    out = np.full(vals.shape[1], math.nan)
    keep = _enough(vals, min_share)
    if keep.any():
        v = vals[:, keep]
        out[keep] = np.nanmean(v, axis=0) if how == "mean" else np.nanmax(v, axis=0)
    return out


def run_curves(
    evals: Table,
    x: str = "env_steps",
    y: str = "return_mean",
    reduce: str = "mean",
    max_points: int = 400,
    min_share: float = 0.5,
) -> dict[str, Any]:
    """Each run's curve of ``y`` vs ``x``, its pods reduced to one (``reduce``: ``"mean"`` of the
    pods, or ``"best"``: the best pod at each point, as time to target takes any pod).

    Each pod's curve is interpolated linearly on a common grid (the union of all pods' ``x``
    values, thinned to ``max_points``), only inside its own range; a run has a value where at
    least ``min_share`` of its pods have data. Returns ``{x, runs, curves}`` (``curves``: runs x
    grid, NaN where a run has none; runs without any data are left out).
    """
    if reduce not in REDUCERS:
        raise ValueError(f"reduce {reduce!r}: one of {', '.join(REDUCERS)}")
    pods = {run: _pod_curves(evals.where(run=run), x, y) for run in (evals.unique("run") if len(evals) else [])}
    pods = {run: c for run, c in pods.items() if c}
    if not pods:
        return {"x": np.array([]), "runs": [], "curves": np.zeros((0, 0))}
    grid = _grid([c for cs in pods.values() for c in cs], max_points)
    curves = np.array([_reduce(_on_grid(cs, grid), reduce, min_share) for cs in pods.values()])
    return {"x": grid, "runs": list(pods), "curves": curves}


def mean_curve(
    evals: Table,
    x: str = "env_steps",
    y: str = "return_mean",
    max_points: int = 400,
    min_share: float = 0.5,
    reduce: str = "mean",
    min_runs: int = MIN_RUNS_FOR_BAND,
) -> dict[str, Any]:
    """Mean and 95% confidence band of ``y`` over the *runs* of ``evals`` (the independent
    samples: seeds), each run's pods reduced first (:func:`run_curves`, ``reduce``: ``"mean"`` of
    its pods or its ``"best"`` pod).

    Grid points where fewer than ``min_share`` of the runs have data are dropped (so that the
    mean does not jump where runs end). At each grid point: ``n`` runs with data, ``mean``, and
    ``lo``/``hi`` = mean -/+ t(0.975, n-1) * sd / sqrt(n) over the runs, clipped to the runs' own
    lowest and highest value there (a band of few runs would otherwise leave what the metric can
    take: returns above 0 on Pendulum), NaN where n < ``min_runs`` (3: draw the runs themselves
    then). Returns ``{x, mean, lo, hi, n, runs, curves, reduce}`` (``curves``: the runs' reduced
    curves on ``x``, one row per run in ``runs``).
    """
    rc = run_curves(evals, x, y, reduce, max_points, min_share)
    grid, curves = rc["x"], rc["curves"]
    if not len(grid):
        e = np.array([])
        return {"x": e, "mean": e, "lo": e, "hi": e, "n": e.astype(int), "runs": [], "curves": curves, "reduce": reduce}
    keep = _enough(curves, min_share)
    grid, curves = grid[keep], curves[:, keep]
    has = np.isfinite(curves).any(axis=1)  # a run with data only where too few runs had: not drawn
    runs, curves = [r for r, h in zip(rc["runs"], has) if h], curves[has]
    n = np.isfinite(curves).sum(axis=0)
    mean = np.nansum(curves, axis=0) / n
    sd = np.sqrt(np.nansum((curves - mean) ** 2, axis=0) / np.maximum(n - 1, 1))
    half = _t975(n - 1.0) * sd / np.sqrt(n)
    half[n < max(2, min_runs)] = math.nan
    # A few runs' t-interval can leave what the metric can take (Pendulum's returns are <= 0; 3
    # runs: +-2.5 sd): the band stays within the runs' own values at each point.
    with np.errstate(invalid="ignore"):
        lo = np.fmax(mean - half, np.nanmin(curves, axis=0)) if len(curves) else mean - half
        hi = np.fmin(mean + half, np.nanmax(curves, axis=0)) if len(curves) else mean + half
    lo[~np.isfinite(half)], hi[~np.isfinite(half)] = math.nan, math.nan
    return {
        "x": grid,
        "mean": mean,
        "lo": lo,
        "hi": hi,
        "n": n,
        "runs": runs,
        "curves": curves,
        "reduce": reduce,
    }


# ---------------------------------------------------------------------- scaling
