"""Technical indicators and the turbulence index, vectorized over ``(time, stocks)`` in torch.

Every function takes ``[T, S]`` tensors (float64 recommended) and is causal: the value at time
``t`` uses bars ``0..t`` only (``tests/test_trading_indicators.py`` checks each one against a
plain loop, and that changing bars after ``t`` leaves it unchanged). Windows are partial at the
start of the data (a 30-bar mean at ``t = 4`` is the mean of the 5 bars so far). There is no
Python loop over stocks; recursive smoothers run over time in blocks (a matrix product per
block of 256 bars), rolling windows as one tensor op per lag.

Definitions (``n`` the window):

- ``ema(x, alpha)``: ``y_0 = x_0``, ``y_t = (1 - alpha) y_{t-1} + alpha x_t``.
- ``macd``: ``ema(close, 2/13) - ema(close, 2/27)`` (the MACD line, 12/26).
- ``rsi`` (Wilder, n=14): ``d_t = close_t - close_{t-1}`` (``d_0 = 0``); average gain ``G`` and
  loss ``L`` by ``ema(., 1/n)``; ``100 G / (G + L)``, 50 where ``G + L = 0``.
- ``cci`` (n=20): typical price ``tp = (high + low + close) / 3``; ``(tp - sma(tp)) / (0.015
  mad)`` with ``mad`` the mean absolute deviation of the window's ``tp`` from ``sma(tp)``;
  0 where ``mad = 0``.
- ``dx`` (n=14): ``up = high_t - high_{t-1}``, ``down = low_{t-1} - low_t``; ``+DM = up`` where
  ``up > down`` and ``up > 0``, else 0 (``-DM`` mirrored); true range ``max(high - low,
  |high - close_{t-1}|, |low - close_{t-1}|)`` (``high_0 - low_0`` at ``t = 0``);
  ``+DI = 100 ema(+DM, 1/n) / ema(TR, 1/n)``; ``DX = 100 |+DI - -DI| / (+DI + -DI)`` (0 where
  undefined).
- ``bollinger`` (n=20, k=2): ``sma(close) +- k std(close)``, population std of the window.
- ``sma(close, 30)``, ``sma(close, 60)``.
- ``turbulence`` (Kritzman and Li 2010), window w=252: returns ``r_t = close_t / close_{t-1} - 1``;
  ``(r_t - mu)' pinv(Sigma) (r_t - mu)`` with ``mu, Sigma`` the mean and covariance (ddof 1) of
  the ``w`` returns before ``t`` (``r_{t-w} .. r_{t-1}``); 0 while fewer than ``w`` past
  returns exist (``t <= w``).
"""

from __future__ import annotations

import torch

INDICATORS = ("macd", "rsi", "cci", "dx", "boll_ub", "boll_lb", "sma30", "sma60")


def ema(x: torch.Tensor, alpha: float, block: int = 256) -> torch.Tensor:
    """Exponential moving average along dim 0, ``y_0 = x_0``; exact block scan (no per-bar loop)."""
    T = x.shape[0]
    if T == 0:
        return x.clone()
    q = 1.0 - alpha
    B = min(block, T)
    i = torch.arange(B, dtype=x.dtype, device=x.device)
    lag = i[:, None] - i[None, :]
    L = torch.where(lag >= 0, q ** lag.clamp(min=0), torch.zeros((), dtype=x.dtype, device=x.device))
    p = q ** (i + 1)
    flat = x.reshape(T, -1)
    y = torch.empty_like(flat)
    carry = flat[0]  # y_{-1} := x_0 makes y_0 = x_0
    for s in range(0, T, B):
        xb = flat[s:s + B]
        b = xb.shape[0]
        yb = alpha * (L[:b, :b] @ xb) + p[:b, None] * carry
        y[s:s + b] = yb
        carry = yb[-1]
    return y.reshape(x.shape)


def _shift(x: torch.Tensor, j: int) -> torch.Tensor:
    """``x_{t-j}`` (rows before the start are zero)."""
    if j == 0:
        return x
    out = torch.zeros_like(x)
    out[j:] = x[:-j]
    return out


def _count(x: torch.Tensor, n: int) -> torch.Tensor:
    """Bars in the partial window ending at each t: ``min(t + 1, n)`` as a column."""
    T = x.shape[0]
    c = torch.arange(1, T + 1, dtype=x.dtype, device=x.device).clamp(max=n)
    return c.reshape(T, *([1] * (x.ndim - 1)))


def sma(x: torch.Tensor, n: int) -> torch.Tensor:
    """Mean of the last ``n`` bars (fewer at the start)."""
    acc = x.clone()
    for j in range(1, min(n, x.shape[0])):
        acc[j:] += x[:-j]
    return acc / _count(x, n)


def rolling_std(x: torch.Tensor, n: int, mean: torch.Tensor | None = None) -> torch.Tensor:
    """Population std of the last ``n`` bars (fewer at the start), two-pass (no cancellation)."""
    m = sma(x, n) if mean is None else mean
    acc = torch.zeros_like(x)
    T = x.shape[0]
    for j in range(min(n, T)):
        d = x[: T - j] - m[j:]
        acc[j:] += d * d
    return torch.sqrt(acc / _count(x, n))


def _mad(x: torch.Tensor, mean: torch.Tensor, n: int) -> torch.Tensor:
    acc = torch.zeros_like(x)
    T = x.shape[0]
    for j in range(min(n, T)):
        acc[j:] += (x[: T - j] - mean[j:]).abs()
    return acc / _count(x, n)


def macd(close: torch.Tensor, fast: int = 12, slow: int = 26) -> torch.Tensor:
    return ema(close, 2.0 / (fast + 1)) - ema(close, 2.0 / (slow + 1))


def rsi(close: torch.Tensor, n: int = 14) -> torch.Tensor:
    d = close - _shift(close, 1)
    d[0] = 0.0
    g = ema(d.clamp(min=0), 1.0 / n)
    l = ema((-d).clamp(min=0), 1.0 / n)
    tot = g + l
    return torch.where(tot > 0, 100.0 * g / torch.where(tot > 0, tot, 1.0), torch.full_like(tot, 50.0))


def cci(high: torch.Tensor, low: torch.Tensor, close: torch.Tensor, n: int = 20) -> torch.Tensor:
    tp = (high + low + close) / 3.0
    m = sma(tp, n)
    mad = _mad(tp, m, n)
    ok = mad > 0
    return torch.where(ok, (tp - m) / (0.015 * torch.where(ok, mad, 1.0)), torch.zeros_like(tp))


def dx(high: torch.Tensor, low: torch.Tensor, close: torch.Tensor, n: int = 14) -> torch.Tensor:
    up = high - _shift(high, 1)
    down = _shift(low, 1) - low
    up[0] = 0.0
    down[0] = 0.0
    zero = torch.zeros_like(up)
    pdm = torch.where((up > down) & (up > 0), up, zero)
    mdm = torch.where((down > up) & (down > 0), down, zero)
    pc = _shift(close, 1)
    tr = torch.maximum(high - low, torch.maximum((high - pc).abs(), (low - pc).abs()))
    tr[0] = high[0] - low[0]
    a = 1.0 / n
    str_ = ema(tr, a)
    ok = str_ > 0
    den = torch.where(ok, str_, 1.0)
    pdi = torch.where(ok, 100.0 * ema(pdm, a) / den, zero)
    mdi = torch.where(ok, 100.0 * ema(mdm, a) / den, zero)
    s = pdi + mdi
    return torch.where(s > 0, 100.0 * (pdi - mdi).abs() / torch.where(s > 0, s, 1.0), zero)


def bollinger(close: torch.Tensor, n: int = 20, k: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    m = sma(close, n)
    sd = rolling_std(close, n, m)
    return m + k * sd, m - k * sd


def returns(close: torch.Tensor) -> torch.Tensor:
    """Simple returns ``close_t / close_{t-1} - 1`` (0 at ``t = 0``)."""
    r = torch.zeros_like(close)
    r[1:] = close[1:] / close[:-1] - 1.0
    return r


def turbulence(close: torch.Tensor, window: int = 252, chunk: int = 512) -> torch.Tensor:
    """Turbulence index ``[T]`` (see the module docstring); batched over times in chunks."""
    T, S = close.shape
    out = torch.zeros(T, dtype=close.dtype, device=close.device)
    w = int(window)
    if w < 2 or T <= w + 1:
        return out
    r = returns(close)
    # windows[k] = r[k .. k+w-1] (S, w), used for t = k + w; t runs over w+1 .. T-1 (k >= 1)
    windows = r.unfold(0, w, 1)  # [T - w + 1, S, w], a view
    for k0 in range(1, T - w, chunk):
        k1 = min(k0 + chunk, T - w)
        win = windows[k0:k1]
        mu = win.mean(-1)
        xc = win - mu[..., None]
        cov = xc @ xc.transpose(1, 2) / (w - 1)
        inv = torch.linalg.pinv(cov, hermitian=True)
        y = r[k0 + w:k1 + w] - mu
        out[k0 + w:k1 + w] = torch.einsum("cs,cst,ct->c", y, inv, y)
    return out


def compute_indicators(high: torch.Tensor, low: torch.Tensor, close: torch.Tensor) -> dict[str, torch.Tensor]:
    """The eight indicators of :data:`INDICATORS`, each ``[T, S]``."""
    ub, lb = bollinger(close)
    return {
        "macd": macd(close),
        "rsi": rsi(close),
        "cci": cci(high, low, close),
        "dx": dx(high, low, close),
        "boll_ub": ub,
        "boll_lb": lb,
        "sma30": sma(close, 30),
        "sma60": sma(close, 60),
    }


__all__ = ["INDICATORS", "ema", "sma", "rolling_std", "macd", "rsi", "cci", "dx", "bollinger", "returns",
           "turbulence", "compute_indicators"]
