"""Technical indicators and the turbulence index, vectorized over ``(time, stocks)`` in torch.

Every function takes ``[T, S]`` tensors (float64 recommended) and is causal: the value at time
``t`` uses bars ``0..t`` only (``tests/trading/test_indicators.py`` checks each one against a
plain loop, and that changing bars after ``t`` leaves it unchanged). Windows are partial at the
start of the data (a 30-bar mean at ``t = 4`` is the mean of the 5 bars so far). There is no
Python loop over stocks, and none over bars either: recursive smoothers are a block scan over
time (``ema``), rolling windows are block-wise prefix sums or one op per lag on blocks of rows
that stay in the CPU cache, and the turbulence index follows its covariance from bar to bar by
rank-2 updates (see :func:`turbulence`). On the paper's scale (429,000 minute bars x 100 stocks)
all eight indicators and the turbulence index take about a minute on one CPU core.

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

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

INDICATORS = ("macd", "rsi", "cci", "dx", "boll_ub", "boll_lb", "sma30", "sma60")
# The market part of an observation, in column blocks of S (the last block is one column).
OBS_FEATURES = ("log_close", *INDICATORS)

_ROWS_PER_BLOCK = 2048  # rows of a rolling-window block: 2048 x 100 stocks x 8 bytes stays in L2/L3


def _lower_powers(q: float, B: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``L[i, j] = q ** (i - j)`` for ``j <= i``, else 0 (``[B, B]``)."""
    i = torch.arange(B, dtype=dtype, device=device)
    lag = i[:, None] - i[None, :]
    return torch.where(lag >= 0, q ** lag.clamp(min=0), torch.zeros((), dtype=dtype, device=device))


def _linear_scan(u: torch.Tensor, q: float, B: int) -> torch.Tensor:
    """``y_t = q y_{t-1} + u_t`` along dim 0 of ``u`` ``[T, K]`` with ``y_{-1} = 0``.

    A block scan: inside blocks of ``B`` rows one matrix product with the lower-triangular powers
    of ``q`` (``B`` flops per value), and the blocks' carries are the same recursion one level up
    (factor ``q ** B``), so the cost is ``O(T B)`` with ``log_B T`` levels and no loop over bars.
    Row ``t`` only ever sums rows ``<= t`` (the powers above the diagonal are exact zeros)."""
    T, K = u.shape
    if T <= B:
        return _lower_powers(q, T, u.dtype, u.device) @ u
    nb = -(-T // B)
    if nb * B != T:
        u = torch.cat([u, u.new_zeros(nb * B - T, K)])
    ub = u.reshape(nb, B, K)
    if q ** (B - 1) > 1e-100:  # y_i = q^i sum_{j <= i} q^-j u_j: a cumulative sum, no overflow for these q and B
        j = torch.arange(B, dtype=u.dtype, device=u.device)[None, :, None]
        y = torch.cumsum(ub * q**-j, 1).mul_(q**j)  # [nb, B, K]: each block from 0
    else:
        y = torch.matmul(_lower_powers(q, B, u.dtype, u.device), ub)
    carry = _linear_scan(y[:, -1, :].contiguous(), q**B, B)  # [nb, K]: the true value at each block's end
    p = q ** torch.arange(1, B + 1, dtype=u.dtype, device=u.device)
    y[1:].addcmul_(p[None, :, None], carry[:-1, None, :])
    return y.reshape(nb * B, K)[:T]


def ema(x: torch.Tensor, alpha: float, block: int = 32, init: torch.Tensor | None = None) -> torch.Tensor:
    """Exponential moving average along dim 0: ``y_0 = x_0`` or, given ``init`` (the value before
    the first row, shaped like one row), ``y_0 = (1 - alpha) init + alpha x_0``; an exact block scan
    (no per-bar loop)."""
    T = x.shape[0]
    if T == 0:
        return x.clone()
    flat = x.reshape(T, -1)
    u = flat * alpha
    if init is None:
        u[0] = flat[0]  # y_{-1} := x_0 makes y_0 = x_0
    else:
        u[0] += (1.0 - alpha) * init.reshape(-1)
    return _linear_scan(u, 1.0 - alpha, max(2, int(block))).reshape(x.shape)


def _shift(x: torch.Tensor, j: int) -> torch.Tensor:
    """``x_{t-j}`` (rows before the start are zero)."""
    if j == 0:
        return x
    out = torch.zeros_like(x)
    out[j:] = x[:-j]
    return out


def _count(x: torch.Tensor, n: int, lo: int = 0, hi: int | None = None) -> torch.Tensor:
    """Bars in the partial window ending at each t in ``[lo, hi)``: ``min(t + 1, n)`` as a column."""
    hi = x.shape[0] if hi is None else hi
    c = torch.arange(lo + 1, hi + 1, dtype=x.dtype, device=x.device).clamp(max=n)
    return c.reshape(hi - lo, *([1] * (x.ndim - 1)))


def sma(x: torch.Tensor, n: int) -> torch.Tensor:
    """Mean of the last ``n`` bars (fewer at the start): prefix sums restarted every block of rows."""
    T = x.shape[0]
    out = torch.empty_like(x)
    B = max(_ROWS_PER_BLOCK, n)
    for s in range(0, T, B):
        e = min(T, s + B)
        a = max(0, s - n + 1)  # the block's windows reach back to row a
        cs = torch.cat([x.new_zeros(1, *x.shape[1:]), torch.cumsum(x[a:e], 0)])  # cs[i] = x[a] + .. + x[a+i-1]
        t = torch.arange(s, e, device=x.device)
        out[s:e] = (cs[t + 1 - a] - cs[(t - n + 1).clamp(min=0) - a]) / _count(x, n, s, e)
    return out


def _rolling_dev(x: torch.Tensor, mean: torch.Tensor, n: int, square: bool) -> torch.Tensor:
    """``sum_{j < n} f(x_{t-j} - mean_t)`` over the (partial) window, ``f`` the square or the absolute
    value; one in-place op per lag on row blocks that stay in the CPU cache."""
    T = x.shape[0]
    out = torch.zeros_like(x)
    tmp = torch.empty_like(x[:_ROWS_PER_BLOCK])
    for s in range(0, T, _ROWS_PER_BLOCK):
        e = min(T, s + _ROWS_PER_BLOCK)
        acc, m = out[s:e], mean[s:e]
        for j in range(min(n, e)):
            t0 = max(s, j)  # the first t of the block with a bar j back
            d = torch.sub(x[t0 - j : e - j], m[t0 - s :], out=tmp[: e - t0])
            if square:
                acc[t0 - s :].addcmul_(d, d)
            else:
                acc[t0 - s :] += d.abs_()
    return out


def rolling_std(x: torch.Tensor, n: int, mean: torch.Tensor | None = None) -> torch.Tensor:
    """Population std of the last ``n`` bars (fewer at the start), two-pass (no cancellation)."""
    m = sma(x, n) if mean is None else mean
    return torch.sqrt(_rolling_dev(x, m, n, True) / _count(x, n))


def _mad(x: torch.Tensor, mean: torch.Tensor, n: int) -> torch.Tensor:
    return _rolling_dev(x, mean, n, False) / _count(x, n)


def macd(close: torch.Tensor, fast: int = 12, slow: int = 26) -> torch.Tensor:
    return ema(close, 2.0 / (fast + 1)) - ema(close, 2.0 / (slow + 1))


def rsi(close: torch.Tensor, n: int = 14) -> torch.Tensor:
    d = close - _shift(close, 1)
    d[0] = 0.0
    g = ema(d.clamp(min=0), 1.0 / n)
    l = ema((-d).clamp(min=0), 1.0 / n)
    tot = g + l
    return torch.where(tot > 0, 100.0 * (g / torch.where(tot > 0, tot, 1.0)), torch.full_like(tot, 50.0))  # g/tot <= 1


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
    del up, down
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
    return torch.where(
        s > 0, 100.0 * ((pdi - mdi).abs() / torch.where(s > 0, s, 1.0)), zero
    )  # the ratio <= 1: DX <= 100


def bollinger(close: torch.Tensor, n: int = 20, k: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    m = sma(close, n)
    sd = rolling_std(close, n, m)
    return m + k * sd, m - k * sd


def returns(close: torch.Tensor) -> torch.Tensor:
    """Simple returns ``close_t / close_{t-1} - 1`` (0 at ``t = 0``)."""
    r = torch.zeros_like(close)
    r[1:] = close[1:] / close[:-1] - 1.0
    return r


# --------------------------------------------------------------------------------------
# Turbulence
# --------------------------------------------------------------------------------------
def _turbulence_exact(r: torch.Tensor, w: int, t0: int, t1: int, out: torch.Tensor, chunk: int = 512) -> None:
    """``out[t]`` for ``t`` in ``[t0, t1)`` by the definition: one covariance and pseudo-inverse per bar."""
    windows = r.unfold(0, w, 1)  # windows[k] = r[k .. k+w-1] (S, w), the window of t = k + w; a view
    for k0 in range(t0 - w, t1 - w, chunk):
        k1 = min(k0 + chunk, t1 - w)
        win = windows[k0:k1]
        mu = win.mean(-1)
        xc = win - mu[..., None]
        cov = xc @ xc.transpose(1, 2) / (w - 1)
        inv = torch.linalg.pinv(cov, hermitian=True)
        y = r[k0 + w : k1 + w] - mu
        out[k0 + w : k1 + w] = torch.einsum("cs,cst,ct->c", y, inv, y)


def _window_inverse(r: torch.Tensor, w: int, ts: torch.Tensor, rcond: float) -> tuple[torch.Tensor, ...]:
    """For each bar in ``ts``: (sum, inverse of the scatter matrix, well-conditioned?) of ``r[t-w .. t-1]``."""
    idx = ts[:, None] - w + torch.arange(w, device=r.device)[None, :]
    win = r[idx]  # [n, w, S]
    s = win.sum(1)
    xc = win - (s / w)[:, None, :]
    scatter = xc.transpose(1, 2) @ xc  # (w - 1) Sigma
    lam, vec = torch.linalg.eigh(scatter)
    ok = lam[:, 0] > rcond * lam[:, -1].clamp(min=torch.finfo(r.dtype).tiny)
    inv = (vec / torch.where(ok[:, None], lam, 1.0)[:, None, :]) @ vec.transpose(1, 2)
    return s, inv, ok


def _turbulence_updates(
    r: torch.Tensor, w: int, starts: torch.Tensor, length: int, out: torch.Tensor, rcond: float, drift_tol: float
) -> torch.Tensor:
    """Segments of ``length`` bars starting at ``starts``, stepped together; returns which segments failed.

    Each segment starts from the exact inverse of its first window's scatter matrix ``C`` and
    slides the window one bar at a time: dropping ``o`` and adding ``n`` is
    ``C' = C - w/(w-1) (o - mu)(o - mu)' + (w-1)/w (n - mu_)(n - mu_)'`` (``mu_`` the mean without
    ``o``), a rank-2 update of the inverse by the Woodbury identity (``O(S^2)`` per bar instead of
    a pseudo-inverse's ``O(S^3)``). A segment fails (and is recomputed by the definition) when a
    window is ill-conditioned (``lambda_min <= rcond lambda_max``), an update is degenerate, or the
    inverse it carried to its end differs from the exact one there by more than ``drift_tol``."""
    n, S = len(starts), r.shape[1]
    s, P, ok = _window_inverse(r, w, starts, rcond)
    _, P_end, ok_end = _window_inverse(r, w, starts + length, rcond)
    failed = ~(ok & ok_end)
    inv_a, inv_b = -(w - 1.0) / w, w / (w - 1.0)  # 1 / the rank-1 coefficients (drop, add)
    V = torch.empty(n, S, 3, dtype=r.dtype, device=r.device)  # [y, o - mu, n - mu_]
    PV = torch.empty_like(V)
    G = torch.empty(n, 3, 3, dtype=r.dtype, device=r.device)
    K = torch.empty(n, 2, S, dtype=r.dtype, device=r.device)
    for i in range(length):
        t = starts + i
        rt, old = r[t], r[t - w]  # [n, S]: the bar itself, the one that leaves the window after it
        mu = s / w
        torch.sub(rt, mu, out=V[:, :, 0])
        torch.sub(old, mu, out=V[:, :, 1])
        torch.sub(rt, (s - old) / (w - 1.0), out=V[:, :, 2])
        torch.bmm(P, V, out=PV)
        torch.bmm(V.transpose(1, 2), PV, out=G)  # G[0, 0] = y' P y; G[1:, 1:] = U' P U
        out[t] = (w - 1.0) * G[:, 0, 0]
        # slide the window past t (Woodbury): P -= PU (F^-1 + U'PU)^-1 U'P
        g00, g01, g10, g11 = G[:, 1, 1] + inv_a, G[:, 1, 2], G[:, 2, 1], G[:, 2, 2] + inv_b
        det = g00 * g11 - g01 * g10
        bad = det.abs() <= 1e-12 * (g00.abs() * g11.abs() + (g01 * g10).abs())
        failed |= bad
        det = torch.where(bad, 1.0, det)
        PU = PV[:, :, 1:]
        Ginv = torch.stack([torch.stack([g11, -g01], 1), torch.stack([-g10, g00], 1)], 1) / det[:, None, None]
        torch.bmm(Ginv, PU.transpose(1, 2), out=K)
        P.baddbmm_(PU, K, alpha=-1.0)
        s += rt - old
    # the inverse carried to the end against the exact one there
    scale = P_end.flatten(1).norm(dim=1)
    failed |= ~((P - P_end).flatten(1).norm(dim=1) <= drift_tol * scale)
    failed |= ~torch.isfinite(out[starts[:, None] + torch.arange(length, device=r.device)]).all(1)
    return failed


def turbulence(
    close: torch.Tensor,
    window: int = 252,
    chunk: int = 512,
    segment: int = 0,
    rcond: float = 1e-9,
    drift_tol: float = 1e-7,
) -> torch.Tensor:
    """Turbulence index ``[T]`` (see the module docstring).

    Computed in segments of consecutive bars, all stepped together: each starts from an exact
    inverse of its window's covariance and follows the sliding window by rank-2 updates
    (:func:`_turbulence_updates`), checked against the exact inverse at its end; a segment that
    is ill-conditioned (a singular covariance: fewer returns than stocks, a stock that did not
    move for the whole window) or drifted is computed by the definition, a pseudo-inverse per bar
    in batches of ``chunk``. ``segment`` is the segment length (0: about 32 segments, at least 256
    bars each). The result equals the definition's to about 1e-10 relative."""
    T, S = close.shape
    out = torch.zeros(T, dtype=close.dtype, device=close.device)
    w = int(window)
    if w < 2 or T <= w + 1:
        return out
    r = returns(close)
    t_first, n_bars = w + 1, T - (w + 1)  # the bars with a full window of w real returns (r_0 is not one)
    if S >= w:  # the covariance of w < S + 1 returns is always singular: the definition, bar by bar
        _turbulence_exact(r, w, t_first, T, out, chunk)
        return out
    length = int(segment) or max(256, -(-n_bars // 32))
    full = n_bars // length
    jobs = []
    if full:
        jobs.append((t_first + length * torch.arange(full, device=close.device), length))
    if n_bars - full * length:
        jobs.append((torch.tensor([t_first + full * length], device=close.device), n_bars - full * length))
    for starts, n in jobs:
        if n < 2:  # too short to update: by the definition
            for t in starts.tolist():
                _turbulence_exact(r, w, t, t + n, out, chunk)
            continue
        failed = _turbulence_updates(r, w, starts, n, out, rcond, drift_tol)
        for t in starts[failed].tolist():
            _turbulence_exact(r, w, t, t + n, out, chunk)
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


_HALO = 60  # rows before a block that its windows need: the longest window (sma60) less one, plus one for t - 1


def market_features(
    high: torch.Tensor,
    low: torch.Tensor,
    close: torch.Tensor,
    turbulence_window: int = 252,
    dtype: torch.dtype = torch.float64,
    progress: Callable[[str], None] | None = None,
    block: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(market observation ``[T, 9 S + 1]`` in ``dtype``, turbulence ``[T]`` float64) from float64 bars.

    The blocks of :data:`OBS_FEATURES` (``log close``, ``macd / close``, ``rsi / 100``,
    ``cci / 100``, ``dx / 100``, ``boll_ub / close - 1``, ``boll_lb / close - 1``,
    ``sma30 / close - 1``, ``sma60 / close - 1``; S columns each), then ``log1p(turbulence / S)``.

    The same values as :func:`compute_indicators` (to rounding), computed in float64 over blocks
    of ``block`` bars: each block reads the 60 bars before it for its windows and carries the
    states of the seven moving averages from the block before, so every temporary stays in the
    CPU cache and memory is the output plus a few blocks (at 429k bars x 100 stocks: 1.5 GB of
    float32 output, instead of ~10 GB of float64 whole-history temporaries). ``turbulence_window``
    0 (or 1) turns the index off (0 everywhere). ``progress`` gets a line now and then."""
    say = progress or (lambda _m: None)
    T, S = close.shape
    h, lo, c = (x.to(torch.float64) for x in (high, low, close))
    out = torch.empty(T, 9 * S + 1, dtype=dtype, device=c.device)
    state: dict[str, torch.Tensor | None] = dict.fromkeys(("fast", "slow", "gain", "loss", "tr", "pdm", "mdm"))
    a12, a26, a14 = 2.0 / 13, 2.0 / 27, 1.0 / 14
    next_say = 0.0
    # the turbulence index in a second thread (torch ops release the GIL): two cores, two jobs
    pool = ThreadPoolExecutor(1)
    turb_job = pool.submit(turbulence, c, turbulence_window)
    for s in range(0, T, block):
        e = min(T, s + block)
        a = max(0, s - _HALO)
        k = s - a  # halo rows
        hb, lb, cb = h[a:e], lo[a:e], c[a:e]
        C, Hh, Ll = cb[k:], hb[k:], lb[k:]
        # t - 1 values (the first bar of the data has none)
        pc = cb[k - 1 : e - a - 1] if k else torch.cat([C[:1], C[:-1]])
        ph = hb[k - 1 : e - a - 1] if k else torch.cat([Hh[:1], Hh[:-1]])
        pl = lb[k - 1 : e - a - 1] if k else torch.cat([Ll[:1], Ll[:-1]])

        def smooth(name: str, x: torch.Tensor, alpha: float) -> torch.Tensor:
            y = ema(x, alpha, init=state[name])
            state[name] = y[-1].clone()
            return y

        def put(i: int, v: torch.Tensor) -> None:
            out[s:e, i * S : (i + 1) * S] = v

        put(0, torch.log(C))
        put(1, (smooth("fast", C, a12) - smooth("slow", C, a26)) / C)
        d = C - pc  # 0 at t = 0
        tot_g, tot_l = smooth("gain", d.clamp(min=0), a14), smooth("loss", (-d).clamp(min=0), a14)
        tot = tot_g + tot_l
        put(2, torch.where(tot > 0, tot_g / torch.where(tot > 0, tot, 1.0), 0.5))
        tp = (hb + lb + cb) / 3.0
        m = sma(tp, 20)
        mad = _mad(tp, m, 20)[k:]
        tp, m = tp[k:], m[k:]
        ok = mad > 0
        put(3, torch.where(ok, (tp - m) / (0.015 * torch.where(ok, mad, 1.0)), 0.0) / 100.0)
        up, down = Hh - ph, pl - Ll
        if not k:
            up[0] = down[0] = 0.0
        pdm = torch.where((up > down) & (up > 0), up, 0.0)
        mdm = torch.where((down > up) & (down > 0), down, 0.0)
        tr = torch.maximum(Hh - Ll, torch.maximum((Hh - pc).abs(), (Ll - pc).abs()))
        if not k:
            tr[0] = Hh[0] - Ll[0]
        str_ = smooth("tr", tr, a14)
        ok = str_ > 0
        den = torch.where(ok, str_, 1.0)
        pdi = torch.where(ok, 100.0 * smooth("pdm", pdm, a14) / den, 0.0)
        mdi = torch.where(ok, 100.0 * smooth("mdm", mdm, a14) / den, 0.0)
        sm = pdi + mdi
        put(4, torch.where(sm > 0, (pdi - mdi).abs() / torch.where(sm > 0, sm, 1.0), 0.0))
        m20 = sma(cb, 20)
        sd = torch.sqrt(_rolling_dev(cb, m20, 20, True) / _count(cb, 20))[k:]
        m20 = m20[k:]
        put(5, (m20 + 2.0 * sd) / C - 1.0)
        put(6, (m20 - 2.0 * sd) / C - 1.0)
        put(7, sma(cb, 30)[k:] / C - 1.0)
        put(8, sma(cb, 60)[k:] / C - 1.0)
        if e / T >= next_say:
            say(f"indicators: {e:,} of {T:,} bars")
            next_say += 0.25
    turb = turb_job.result()
    pool.shutdown()
    out[:, 9 * S] = torch.log1p(turb / S)
    say(f"turbulence index (window {turbulence_window})")
    return out, turb


__all__ = [
    "INDICATORS",
    "OBS_FEATURES",
    "ema",
    "sma",
    "rolling_std",
    "macd",
    "rsi",
    "cci",
    "dx",
    "bollinger",
    "returns",
    "turbulence",
    "compute_indicators",
    "market_features",
]
