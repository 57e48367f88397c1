"""Backtest: metrics against hand-computed values, the baselines, a checkpoint through main()."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from podracer_hpc.tools.backtest import backtest, infer_periods_per_year, main, metrics, min_variance_weights
from podracer_hpc.trading import from_arrays, synthetic_market

# torch on one thread: the 2 shared cores make OpenMP threads wait on each other (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_metrics_by_hand():
    m = metrics([100.0, 110.0, 99.0, 121.0], periods_per_year=3)
    r = [0.1, -0.1, 121 / 99 - 1]
    mean = sum(r) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in r) / 2)
    assert m["cumulative_return"] == pytest.approx(0.21)
    assert m["annual_return"] == pytest.approx(0.21)  # n = 3 bars = one year here
    assert m["annual_volatility"] == pytest.approx(sd * math.sqrt(3))
    assert m["sharpe_ratio"] == pytest.approx(mean / sd * math.sqrt(3))
    assert m["max_drawdown"] == pytest.approx(99 / 110 - 1)
    assert m["calmar_ratio"] == pytest.approx(0.21 / (1 - 99 / 110))
    # two years of daily bars doubling: annual return sqrt(2) - 1
    v = np.geomspace(1.0, 2.0, 505)
    assert metrics(v)["annual_return"] == pytest.approx(math.sqrt(2) - 1)
    flat = metrics([5.0, 5.0, 5.0])
    assert flat["cumulative_return"] == 0 and flat["sharpe_ratio"] is None and flat["calmar_ratio"] is None
    assert flat["max_drawdown"] == 0
    with pytest.raises(ValueError):
        metrics([1.0])


def test_periods_per_year():
    daily = np.arange(np.datetime64("2020-01-01"), np.datetime64("2020-02-01")).astype("datetime64[s]")
    assert infer_periods_per_year(daily) == 252
    minutes = np.datetime64("2020-01-02T14:30") + np.arange(390 * 3) % 390 + np.repeat([0, 1440, 2880], 390)
    assert infer_periods_per_year(minutes.astype("datetime64[s]")) == 252 * 390


def test_min_variance_weights():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20000, 2)) * [0.01, 0.02]
    w = min_variance_weights(x)
    inv = np.linalg.inv(np.cov(x, rowvar=False))
    want = inv.sum(1) / inv.sum()  # interior solution: Sigma^-1 1 / 1' Sigma^-1 1 (about inverse variance)
    assert w == pytest.approx(want, abs=1e-4) and w[0] == pytest.approx(0.8, abs=0.01)
    # a dominated asset (perfectly correlated, more volatile) gets nothing; weights stay long-only
    y = np.column_stack([x[:, 0], 3 * x[:, 0] + 1e-4 * x[:, 1], x[:, 1]])
    w3 = min_variance_weights(y)
    assert (w3 >= 0).all() and w3.sum() == pytest.approx(1.0) and w3[1] < 1e-3


def tiny_market():
    close = np.array([[10.0, 20.0], [11.0, 20.0], [12.0, 18.0], [12.0, 22.0], [13.0, 21.0]])
    dates = np.array(["2021-03-01", "2021-03-02", "2021-03-03", "2021-03-04", "2021-03-05"], dtype="datetime64[D]")
    return from_arrays(close, dates=dates, tickers=["A", "B"])


def test_backtest_by_hand(tmp_path):
    md = tiny_market()
    # buy 10 shares of A on the first day, then hold
    calls = []

    def policy(obs):
        calls.append(obs.clone())
        a = torch.zeros(obs.shape[0], 2)
        if len(calls) == 1:
            a[:, 0] = 1.0
        return a

    r = backtest(
        policy,
        md,
        None,
        None,
        initial_cash=1000.0,
        cost=0.01,
        max_shares=10,
        warmup_bars=0,
        turbulence_window=3,
        plot=tmp_path / "bt.png",
    )
    assert (r["start"], r["end"], r["bars"]) == ("2021-03-01", "2021-03-05", 4)
    cash = 1000 - 10 * 10 * 1.01
    want = [1000.0] + [cash + 10 * p for p in (11.0, 12.0, 12.0, 13.0)]
    assert r["series"]["agent"] == pytest.approx(want, rel=1e-12)
    assert r["agent"] == metrics(want, 252)
    assert len(calls) == 4  # one decision per bar, not after the last one
    # equal weight: 500 in each at the first close, cost paid once
    sh = np.array([500 / (10 * 1.01), 500 / (20 * 1.01)])
    assert r["series"]["equal_weight"] == pytest.approx((md.close.numpy() @ sh).tolist(), rel=1e-12)
    assert r["min_variance"]["cumulative_return"] is not None
    assert (tmp_path / "bt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a held-out window
    r2 = backtest(
        lambda o: torch.zeros(o.shape[0], 2), md, "2021-03-03", "2021-03-04", initial_cash=1000.0, warmup_bars=0
    )
    assert (r2["start"], r2["end"], r2["bars"]) == ("2021-03-03", "2021-03-04", 1)
    assert r2["agent"]["cumulative_return"] == 0.0


def test_main_with_a_checkpoint(tmp_path, capsys):
    from podracer_hpc.config import load_config
    from podracer_hpc.pod import Pod

    cfg = load_config(
        None,
        [
            "env.name=stock_trading",
            "env.num_envs=4",
            "agent.hidden_sizes=[8]",
            "eval.episodes=1",
            "env.max_episode_steps=4",
            "agent.rollout_steps=2",
            "agent.num_minibatches=1",
        ],
    )
    pod = Pod(cfg)
    ck = tmp_path / "rank0.safetensors"
    pod.save(ck)
    png = tmp_path / "out" / "bt.png"
    code = main([str(ck), "--start", "2015-06-01", "--end", "2015-08-31", "--cost", "0.002", "--plot", str(png)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0, out
    summary = json.loads(out[-1])
    for k in ("agent", "equal_weight", "min_variance"):
        assert set(summary[k]) == {
            "cumulative_return",
            "annual_return",
            "annual_volatility",
            "sharpe_ratio",
            "max_drawdown",
            "calmar_ratio",
        }
    assert summary["start"] == "2015-06-01" and summary["end"] == "2015-08-31" and summary["plot"] == str(png)
    assert png.is_file() and "series" not in summary
    # the same policy through the Python API gives the same numbers
    res = backtest(str(ck), None, "2015-06-01", "2015-08-31", cost=0.002)
    assert res["agent"] == summary["agent"]
    # other data: the checkpoint's own stocks are picked out, in order; missing ones are an error
    from podracer_hpc.trading import synthetic_market

    wide = tmp_path / "wide.csv"
    synthetic_market(31, 90, seed=7).to_csv(wide)
    r = backtest(str(ck), wide, "2010-03-01", None, warmup_bars=0)
    assert r["bars"] > 40 and "SYN030" not in r["min_variance_weights"]
    narrow = tmp_path / "narrow.csv"
    synthetic_market(29, 90, seed=7).to_csv(narrow)
    assert main([str(ck), "--data", str(narrow), "--plot", ""]) == 2
    assert "SYN029" in capsys.readouterr().err


def test_main_refuses_other_tasks_and_bad_data(tmp_path, capsys):
    from podracer_hpc.config import load_config
    from podracer_hpc.pod import Pod

    pod = Pod(
        load_config(None, ["env.num_envs=2", "eval.episodes=1", "agent.rollout_steps=2", "agent.num_minibatches=1"])
    )
    ck = tmp_path / "pendulum.safetensors"
    pod.save(ck)
    assert main([str(ck), "--plot", ""]) == 2
    assert "not stock_trading" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.safetensors")]) == 2
    assert "missing.safetensors: no such file or directory; pass a checkpoint" in capsys.readouterr().err


def test_a_policy_read_for_acting_builds_no_optimizer(tmp_path):
    """The backtest's start-up: a checkpoint read to act must not build a torch optimizer (the
    first one of a process imports torch._dynamo, 2-3 s here, a third of a 10-year backtest), and
    its actions are the trained pod's own."""
    import subprocess
    import sys

    from podracer_hpc.config import load_config
    from podracer_hpc.pod import Pod

    cfg = load_config(
        None,
        [
            "env.name=stock_trading",
            "env.num_envs=4",
            "agent.hidden_sizes=[8]",
            "eval.episodes=1",
            "env.max_episode_steps=8",
            "agent.rollout_steps=4",
            "agent.num_minibatches=1",
        ],
    )
    pod = Pod(cfg)
    pod.train_iteration()  # the checkpoint holds optimizer moments too
    ck = tmp_path / "rank0.safetensors"
    pod.save(ck)
    obs = torch.randn(5, pod.env.obs_dim, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = pod.agent.act_deterministic(pod.agent.normalize_obs(obs, update=False)).clamp(-1, 1)
    code = (
        f"import sys, json, torch; from podracer_hpc.tools.backtest import load_policy; "
        f"p, _ = load_policy({str(ck)!r}); obs = torch.randn(5, {pod.env.obs_dim}, "
        f"generator=torch.Generator().manual_seed(0)); "
        f"print(json.dumps([p(obs).tolist(), 'torch._dynamo' in sys.modules]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    acts, dynamo = json.loads(r.stdout.strip().splitlines()[-1])
    assert not dynamo, "reading a policy to act built an optimizer (torch._dynamo was imported)"
    assert torch.allclose(torch.tensor(acts, dtype=want.dtype), want, atol=1e-6)


def last_return_rule(S):
    """Buy a stock after a day it rose, sell it after a day it fell (remembers the last log close)."""
    prev = []

    def policy(obs):
        lc = obs[:, 1 + S : 1 + 2 * S].double()
        r = lc - prev[-1] if prev else torch.zeros_like(lc)
        prev.append(lc)
        return torch.sign(r)

    return policy


def test_a_momentum_rule_has_an_edge_only_where_the_market_has_momentum():
    """End to end through the synthetic market, the env's orders and the metrics: trading on
    yesterday's return beats equal weight on Sharpe where returns have momentum, and loses (the
    costs) where they have none. A backtest that traded a day late, or saw tomorrow, fails this."""
    diff = {}
    for structure in ("momentum", "none"):
        d = []
        for seed in (1, 2, 3):
            md = synthetic_market(3, 600, seed, structure, predictable_fraction=1.0)
            r = backtest(last_return_rule(3), md, cost=0.001, max_shares=10**7, turbulence_window=0)
            d.append(r["agent"]["sharpe_ratio"] - r["equal_weight"]["sharpe_ratio"])
        diff[structure] = d
    assert all(m > n for m, n in zip(diff["momentum"], diff["none"])), diff  # the same seed's shocks, paired
    assert np.mean(diff["momentum"]) > 0.5 and np.mean(diff["none"]) < 0, diff
    # a zero policy keeps the cash: no trade, no cost, a flat account
    r = backtest(lambda o: torch.zeros(o.shape[0], 3), synthetic_market(3, 200, 1), max_shares=10**7)
    assert set(r["series"]["agent"]) == {1_000_000.0} and r["agent"]["cumulative_return"] == 0.0
