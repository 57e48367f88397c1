"""Indicators and turbulence: vectorized torch versions against plain loops, and causality."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from podracer_hpc.trading import indicators as ind

# small tensors: threads only add overhead on a shared machine (fixture in tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_bars(T=300, S=3, seed=0):
    rng = np.random.default_rng(seed)
    close = 50 * np.exp(np.cumsum(rng.normal(0, 0.02, (T, S)), 0))
    if T > 46:
        close[40:46, 0] = close[39, 0]  # a flat stretch: zero deviations and zero ranges
    open_ = close * np.exp(rng.normal(0, 0.005, (T, S)))
    high = np.maximum(open_, close) * np.exp(np.abs(rng.normal(0, 0.01, (T, S))))
    low = np.minimum(open_, close) * np.exp(-np.abs(rng.normal(0, 0.01, (T, S))))
    if T > 46:
        high[40:46, 0] = low[40:46, 0] = close[40:46, 0]
    return [torch.tensor(a) for a in (high, low, close)]


# --------------------------------------------------------------------------------------
# Plain-loop references (one stock, one bar at a time)
# --------------------------------------------------------------------------------------
def ref_ema(x, alpha):
    y = [x[0]]
    for t in range(1, len(x)):
        y.append((1 - alpha) * y[-1] + alpha * x[t])
    return y


def window(x, t, n):
    return x[max(0, t - n + 1) : t + 1]


def ref_sma(x, n):
    return [sum(window(x, t, n)) / len(window(x, t, n)) for t in range(len(x))]


def ref_std(x, n):
    out = []
    for t in range(len(x)):
        w = window(x, t, n)
        m = sum(w) / len(w)
        out.append(math.sqrt(sum((v - m) ** 2 for v in w) / len(w)))
    return out


def ref_rsi(c, n=14):
    d = [0.0] + [c[t] - c[t - 1] for t in range(1, len(c))]
    g = ref_ema([max(v, 0.0) for v in d], 1 / n)
    l = ref_ema([max(-v, 0.0) for v in d], 1 / n)
    return [100 * a / (a + b) if a + b > 0 else 50.0 for a, b in zip(g, l)]


def ref_cci(h, l, c, n=20):
    tp = [(a + b + d) / 3 for a, b, d in zip(h, l, c)]
    out = []
    for t in range(len(tp)):
        w = window(tp, t, n)
        m = sum(w) / len(w)
        mad = sum(abs(v - m) for v in w) / len(w)
        out.append((tp[t] - m) / (0.015 * mad) if mad > 0 else 0.0)
    return out


def ref_dx(h, l, c, n=14):
    pdm, mdm, tr = [0.0], [0.0], [h[0] - l[0]]
    for t in range(1, len(c)):
        up, down = h[t] - h[t - 1], l[t - 1] - l[t]
        pdm.append(up if up > down and up > 0 else 0.0)
        mdm.append(down if down > up and down > 0 else 0.0)
        tr.append(max(h[t] - l[t], abs(h[t] - c[t - 1]), abs(l[t] - c[t - 1])))
    sp, sm, st = ref_ema(pdm, 1 / n), ref_ema(mdm, 1 / n), ref_ema(tr, 1 / n)
    out = []
    for a, b, s in zip(sp, sm, st):
        pdi, mdi = (100 * a / s, 100 * b / s) if s > 0 else (0.0, 0.0)
        out.append(100 * abs(pdi - mdi) / (pdi + mdi) if pdi + mdi > 0 else 0.0)
    return out


def ref_turbulence(close, w):
    close = np.asarray(close)
    T = len(close)
    r = np.zeros_like(close)
    r[1:] = close[1:] / close[:-1] - 1
    out = np.zeros(T)
    for t in range(w + 1, T):
        hist = r[t - w : t]
        mu = hist.mean(0)
        cov = np.cov(hist, rowvar=False, ddof=1)
        y = r[t] - mu
        out[t] = y @ np.linalg.pinv(cov) @ y
    return out


def per_stock(fn, *cols):
    """Apply a one-stock reference to every column; returns [T, S]."""
    S = cols[0].shape[1]
    return torch.tensor([fn(*[c[:, s].tolist() for c in cols]) for s in range(S)], dtype=torch.float64).T


def close_enough(got, want, rel=1e-10):
    scale = max(1.0, float(want.abs().max()))
    assert torch.allclose(got, want, rtol=0, atol=rel * scale), float((got - want).abs().max())


# --------------------------------------------------------------------------------------
# Against the references
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha,block", [(2 / 13, 256), (2 / 27, 16), (1 / 14, 7), (0.5, 1000)])
def test_ema_block_scan_matches_the_recursion(alpha, block):
    _, _, c = random_bars()
    close_enough(ind.ema(c, alpha, block=block), per_stock(lambda x: ref_ema(x, alpha), c))


def test_macd_rsi_cci_dx_bollinger_sma_match_plain_loops():
    h, l, c = random_bars()
    f = ind.compute_indicators(h, l, c)
    close_enough(f["macd"], per_stock(lambda x: [a - b for a, b in zip(ref_ema(x, 2 / 13), ref_ema(x, 2 / 27))], c))
    close_enough(f["rsi"], per_stock(ref_rsi, c))
    close_enough(f["cci"], per_stock(ref_cci, h, l, c), rel=1e-8)
    close_enough(f["dx"], per_stock(ref_dx, h, l, c))
    m, sd = per_stock(lambda x: ref_sma(x, 20), c), per_stock(lambda x: ref_std(x, 20), c)
    close_enough(f["boll_ub"], m + 2 * sd)
    close_enough(f["boll_lb"], m - 2 * sd)
    close_enough(f["sma30"], per_stock(lambda x: ref_sma(x, 30), c))
    close_enough(f["sma60"], per_stock(lambda x: ref_sma(x, 60), c))
    # the flat stretch: no deviation -> CCI 0 after the window is flat; RSI defined everywhere
    assert torch.isfinite(torch.stack(list(f.values()))).all()
    assert ((f["rsi"] >= 0) & (f["rsi"] <= 100)).all() and ((f["dx"] >= 0) & (f["dx"] <= 100)).all()


def test_turbulence_matches_a_pinv_loop():
    _, _, c = random_bars(T=120, S=4, seed=3)
    got = ind.turbulence(c, window=30, chunk=17)  # several chunks
    want = torch.tensor(ref_turbulence(c.numpy(), 30))
    assert (got[:31] == 0).all()
    close_enough(got, want, rel=1e-8)
    assert (got[31:] > 0).all()


def test_short_data_and_one_stock():
    _, _, c = random_bars(T=5, S=1)
    assert torch.equal(ind.turbulence(c, 252), torch.zeros(5, dtype=torch.float64))
    close_enough(ind.sma(c, 60), per_stock(lambda x: ref_sma(x, 60), c))
    close_enough(ind.rsi(c), per_stock(ref_rsi, c))


# --------------------------------------------------------------------------------------
# Causality: nothing at time t depends on a bar after t
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [0, 10, 100, 255, 256, 257])
def test_indicators_do_not_look_ahead(t):
    h, l, c = random_bars(T=400)
    base = {**ind.compute_indicators(h, l, c), "turbulence": ind.turbulence(c, 50)[:, None]}
    rng = np.random.default_rng(t)
    bump = torch.tensor(np.exp(rng.normal(0, 0.3, h[t + 1 :].shape)))
    h2, l2, c2 = h.clone(), l.clone(), c.clone()
    h2[t + 1 :] *= bump * 1.1
    l2[t + 1 :] *= bump * 0.9
    c2[t + 1 :] *= bump
    alt = {**ind.compute_indicators(h2, l2, c2), "turbulence": ind.turbulence(c2, 50)[:, None]}
    for k in base:
        assert torch.equal(base[k][: t + 1], alt[k][: t + 1]), k
        assert not torch.equal(base[k][t + 1 :], alt[k][t + 1 :]), k  # the change is seen later


# --------------------------------------------------------------------------------------
# At scale: turbulence by rank-2 updates, the observation's market block in row blocks
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "T,S,w,segment,rel",
    [
        (
            700,
            5,
            40,
            64,
            1e-8,
        ),  # many segments; stock 0 flat for 100 bars: singular windows, computed by the definition
        (700, 5, 40, 0, 1e-8),  # the default segmentation
        # few returns per stock: ill-conditioned windows, where rounding is amplified by the condition
        # number and depends on the CPU's BLAS path (2.6e-8 of the largest value on one machine, below
        # 1e-8 on another): a wrong update would be off by far more
        (400, 8, 10, 32, 1e-7),
        (300, 3, 3, 16, 1e-8),  # as many stocks as returns: always singular, the definition bar by bar
    ],
)
def test_turbulence_in_segments_matches_the_definition(T, S, w, segment, rel):
    rng = np.random.default_rng(T + S)
    close = 50 * np.exp(np.cumsum(rng.normal(0, 0.02, (T, S)), 0))
    close[200:300, 0] = close[199, 0]
    c = torch.tensor(close)
    got = ind.turbulence(c, w, segment=segment)
    want = torch.tensor(ref_turbulence(close, w))
    close_enough(got, want, rel=rel)
    assert (got[: w + 1] == 0).all()


def test_ema_from_a_state_continues_the_recursion():
    _, _, c = random_bars(T=200)
    whole = ind.ema(c, 2 / 13)
    first = ind.ema(c[:77], 2 / 13)
    rest = ind.ema(c[77:], 2 / 13, init=first[-1])
    close_enough(torch.cat([first, rest]), whole, rel=1e-13)


@pytest.mark.parametrize("block", [7, 64, 4096])
def test_market_features_in_blocks_equal_the_whole_array_indicators(block):
    h, l, c = random_bars(T=500, S=4)
    f = ind.compute_indicators(h, l, c)
    want = torch.cat(
        [
            torch.log(c),
            f["macd"] / c,
            f["rsi"] / 100,
            f["cci"] / 100,
            f["dx"] / 100,
            f["boll_ub"] / c - 1,
            f["boll_lb"] / c - 1,
            f["sma30"] / c - 1,
            f["sma60"] / c - 1,
            torch.log1p(ind.turbulence(c, 50) / 4)[:, None],
        ],
        1,
    )
    obs, turb = ind.market_features(h, l, c, 50, block=block)
    assert obs.shape == (500, 9 * 4 + 1) and obs.dtype == torch.float64
    close_enough(obs, want, rel=1e-11)
    assert torch.equal(turb, ind.turbulence(c, 50))
    obs32, _ = ind.market_features(h, l, c, 50, dtype=torch.float32, block=block)
    assert obs32.dtype == torch.float32 and torch.equal(obs32, obs.float())
