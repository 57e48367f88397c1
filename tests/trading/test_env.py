"""The stock_trading env: accounting properties, a slow per-env reference, no look-ahead,
episode boundaries, exact resume, the branch-free path, no loop over envs or stocks, a pod."""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile

from podracer_hpc.envs import TASKS, make_env
from podracer_hpc.trading import StockTradingEnv, from_arrays
from podracer_hpc.trading.env import get_market, tickers_from_state
from podracer_hpc.trading.task import TradingOptions

# torch on one thread: the 2 shared cores make OpenMP threads wait on each other (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_market(seed, T=40, S=3):
    rng = np.random.default_rng(seed)
    close = np.exp(rng.uniform(np.log(2), np.log(400), S)) * np.exp(np.cumsum(rng.normal(0, 0.05, (T, S)), 0))
    close = np.round(close, 2).clip(0.01)
    return from_arrays(close, high=close * 1.02, low=close * 0.98, open=close)


def make(md, n=4, seed=0, **kw):
    kw.setdefault("warmup_bars", 0)
    kw.setdefault("turbulence_window", 10)
    return StockTradingEnv(n, seed=seed, dtype=torch.float64, data=md, **kw)


# --------------------------------------------------------------------------------------
# A slow, obviously-correct reference: one account, one stock at a time, Python floats
# --------------------------------------------------------------------------------------
class RefAccount:
    MARGIN = 1e-9

    def __init__(self, close, cash, hold, day, cost, max_shares, scale, liquidate=None):
        self.close, self.cash, self.hold, self.day = close, cash, list(hold), day
        self.cost, self.max_shares, self.scale, self.liquidate = cost, max_shares, scale, liquidate

    def value(self, day=None):
        p = self.close[self.day if day is None else day]
        return self.cash + sum(h * q for h, q in zip(self.hold, p))

    def step(self, action):
        p, S = self.close[self.day], len(self.hold)
        v0 = self.value()
        asks, buys = [], []
        for s in range(S):
            a = action[s]
            a = 0.0 if math.isnan(a) else min(1.0, max(-1.0, a))
            x = a * self.max_shares
            buys.append(float(math.floor(x)) if x > 0 else 0.0)
            asks.append(float(math.floor(-x)) if x < 0 else 0.0)
        if self.liquidate is not None and self.liquidate[self.day]:
            asks, buys = list(self.hold), [0.0] * S
        sells = [min(asks[s], self.hold[s]) for s in range(S)]
        cash = self.cash
        for s in range(S):  # sells first
            cash += sells[s] * p[s] * (1 - self.cost)
        budget = cash * (1 - self.MARGIN)
        want = sum(buys[s] * p[s] for s in range(S)) * (1 + self.cost)
        if want > budget:
            f = budget / want
            buys = [float(math.floor(b * f)) for b in buys]
        for s in range(S):
            cash -= buys[s] * p[s] * (1 + self.cost)
            self.hold[s] += buys[s] - sells[s]
        self.cash = cash
        self.day += 1
        return (self.value() - v0) * self.scale


def account(env, i):
    st_ = env.state[i].tolist()
    S = env.num_stocks
    return st_[0], st_[1 : 1 + S], int(st_[1 + S])


# --------------------------------------------------------------------------------------
# Properties over random markets and actions
# --------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    S=st.integers(1, 4),
    cost=st.sampled_from([0.0, 0.001, 0.002, 0.05]),
    max_shares=st.integers(1, 40),
    cash=st.floats(20.0, 20_000.0),
    turb=st.sampled_from([0.0, 1.5]),
    data=st.data(),
)
def test_env_matches_the_reference_and_keeps_the_books(seed, S, cost, max_shares, cash, turb, data):
    md = random_market(seed, T=30, S=S)
    n, K = 3, 24
    env = make(
        md,
        n,
        seed=seed,
        initial_cash=cash,
        cost=cost,
        max_shares=max_shares,
        turbulence_threshold=turb,
        max_episode_steps=9,
    )
    acts = data.draw(
        hnp.arrays(
            np.float64,
            (K, n, S),
            elements=st.one_of(st.sampled_from([0.0, 1.0, -1.0, 2.0, -3.0, math.nan]), st.floats(-1.2, 1.2)),
        )
    )
    close = md.close.tolist()
    liq = env._liquidate.tolist() if env._liquidate is not None else None
    env.reset()
    refs = [RefAccount(close, *account(env, i), cost, max_shares, env.reward_scale, liq) for i in range(n)]
    for r in refs:
        assert r.cash == cash and r.hold == [0.0] * S
    ret = [0.0] * n
    for k in range(K):
        prev = env.state.clone()
        obs, rew, term, trunc, info = env.step(torch.tensor(acts[k]))
        nxt, _, _ = env.dynamics(prev, torch.tensor(acts[k]))  # the transition itself, before any restart
        for i in range(n):
            r = refs[i]
            want_rew = r.step(acts[k, i].tolist())
            c1, h1, d1 = nxt[i, 0].item(), nxt[i, 1 : 1 + S].tolist(), int(nxt[i, 1 + S])
            assert h1 == r.hold, (k, i)  # integer shares, exactly
            assert d1 == r.day
            assert c1 == pytest.approx(r.cash, rel=1e-12, abs=1e-9)
            assert rew[i].item() == pytest.approx(want_rew, rel=1e-9, abs=1e-9 * cash * env.reward_scale)
            # the books: never negative, costs charged exactly, value = cash + holdings x price
            c0, h0 = prev[i, 0].item(), prev[i, 1 : 1 + S].tolist()
            assert c1 >= 0 and min(h1) >= 0 and all(float(h).is_integer() for h in h1)
            p = close[r.day - 1]
            dh = [b - a for a, b in zip(h0, h1)]
            traded = sum(-d * q for d, q in zip(dh, p))
            fees = cost * sum(abs(d) * q for d, q in zip(dh, p))
            assert c1 - c0 == pytest.approx(traded - fees, rel=1e-12, abs=1e-9)
            ret[i] += rew[i].item()
            v1 = c1 + sum(h * q for h, q in zip(h1, close[d1]))
            assert env.portfolio_value(nxt)[i].item() == pytest.approx(v1, rel=1e-12)
            fo = info["final_obs"][i]
            assert fo[0].item() * cash + fo[1 : 1 + S].sum().item() * cash == pytest.approx(v1, rel=1e-9)
            # rewards telescope: their sum is the change in value since the episode started
            assert ret[i] == pytest.approx((v1 - cash) * env.reward_scale, rel=1e-8, abs=1e-8)
            if info["done"][i]:
                assert info["episode_return"][i].item() == pytest.approx(ret[i], rel=1e-9, abs=1e-12)
                assert bool(term[i]) == (d1 == env.hi) and bool(term[i]) != bool(trunc[i])
                ret[i] = 0.0
                refs[i] = RefAccount(close, *account(env, i), cost, max_shares, env.reward_scale, liq)
                assert refs[i].cash == cash and refs[i].hold == [0.0] * S
            else:
                assert torch.equal(env.state[i], nxt[i])


def test_zero_action_changes_nothing_but_prices():
    md = random_market(1, T=200, S=3)
    env = make(md, 8, seed=2, cost=0.01, max_episode_steps=30)
    env.reset()
    env.step(torch.full((8, 3), 0.5))  # hold something first
    checked = 0
    for _ in range(10):
        before = env.state.clone()
        obs_before = env.observe(before)
        obs, rew, term, trunc, _ = env.step(torch.zeros(8, 3))
        ok = ~(term | trunc)
        after = env.state
        assert torch.equal(after[ok, :4], before[ok, :4])  # cash and holdings
        assert torch.equal(after[ok, 4], before[ok, 4] + 1)  # one day on
        p0, p1 = env.prices(before), env.prices(after)
        want = ((before[:, 1:4] * (p1 - p0)).sum(1)) * env.reward_scale
        assert torch.allclose(rew[ok], want[ok], rtol=1e-12, atol=1e-12)
        assert torch.equal(obs[ok, 0], obs_before[ok, 0])  # the cash column does not move
        checked += int(ok.sum())
    assert checked >= 60 and (env.holdings(env.state) > 0).any()


def test_no_look_ahead():
    """Observation and reward up to step t are unchanged when every price after day t is altered."""
    md = random_market(5, T=60, S=3)
    acts = torch.tensor(np.random.default_rng(0).uniform(-1, 1, (20, 6, 3)))

    def run(market):
        env = make(market, 6, seed=3, max_episode_steps=15, turbulence_window=8, turbulence_threshold=3.0)
        obs = [env.reset()]
        days, rews, finals, reached = [env.day(env.state).clone()], [], [], []
        for a in acts:
            reached.append(env.day(env.state) + 1)  # the day this step's transition reaches
            o, r, term, trunc, info = env.step(a)
            obs.append(o)
            rews.append(r)
            finals.append(info["final_obs"])
            days.append(env.day(env.state).clone())
        return [torch.stack(x) for x in (obs, days, rews, finals, reached)]

    obs, day, rew, fin, reached = run(md)
    for cut in (20, 30, 41):
        alt = from_arrays(md.close, high=md.high, low=md.low, open=md.open)
        rng = np.random.default_rng(cut)
        bump = torch.tensor(np.exp(rng.normal(0, 0.2, (60 - cut - 1, 3))))
        for f in ("open", "high", "low", "close"):
            getattr(alt, f)[cut + 1 :] *= bump
        obs2, day2, rew2, fin2, reached2 = run(alt)
        assert torch.equal(day, day2) and torch.equal(reached, reached2)
        seen = day <= cut  # [steps + 1, N]: observations made on or before day `cut`
        assert torch.equal(obs[seen], obs2[seen])
        paid = reached <= cut  # a step's reward and final observation are known on the day it reaches
        assert torch.equal(rew[paid], rew2[paid]) and torch.equal(fin[paid], fin2[paid])
        assert seen.any() and paid.any() and not torch.equal(obs[~seen], obs2[~seen])  # later ones do change
        assert not torch.equal(rew[~paid], rew2[~paid])


def test_turbulence_liquidates_and_blocks_buys():
    md = random_market(2, T=80, S=3)
    env = make(md, 64, seed=1, turbulence_window=10, turbulence_threshold=2.0, max_episode_steps=60)
    flag = env._liquidate
    assert flag.any() and not flag.all()
    env.reset()
    env.step(torch.ones(64, 3))  # buy
    for _ in range(30):
        before = env.state.clone()
        liq = flag[env.day(before)]
        _, _, term, trunc, _ = env.step(torch.ones(64, 3))
        nxt = env.state
        ok = ~(term | trunc)
        assert (nxt[liq & ok, 1:4] == 0).all()  # sold everything, bought nothing despite the action
        calm = ~liq & ok
        assert (nxt[calm, 1:4] >= before[calm, 1:4]).all()


# --------------------------------------------------------------------------------------
# Episodes, starts, protocol
# --------------------------------------------------------------------------------------
def test_episodes_end_terminated_at_the_window_end_and_truncated_at_the_limit():
    md = random_market(3, T=50, S=2)
    env = make(md, 3, start="2000-01-13", end="2000-02-01", random_start=False)  # days 10 .. 29
    assert (env.lo, env.hi, env.max_episode_steps) == (10, 29, 19)
    env.reset()
    for k in range(1, 20):
        obs, _, term, trunc, info = env.step(torch.zeros(3, 2))
        assert not trunc.any()
        assert bool(term.all()) == (k == 19) and bool(term.any()) == (k == 19)
    assert torch.equal(info["final_obs"][:, 3:5], torch.log(md.close[29]).expand(3, 2))  # the last day's prices
    assert (env.day(env.state) == 10).all()  # restarted at the window's first day
    env2 = make(md, 3, seed=0, max_episode_steps=5)
    env2.reset()
    for k in range(1, 6):
        _, _, term, trunc, info = env2.step(torch.zeros(3, 2))
    assert (trunc | term).all() and (info["episode_length"] == 5).all()


def test_starts_are_spread_over_the_window():
    env = make_env("stock_trading", 512, seed=0)
    env.reset()
    d = env.day(env.state)
    assert d.min() >= env.lo and d.max() <= env.hi - 1
    assert len(torch.unique(d)) > 300  # not in lockstep
    assert (env.cash(env.state) == env.initial_cash).all() and (env.holdings(env.state) == 0).all()


def test_defaults_make_env_and_registry():
    env = make_env("stock_trading", 8)
    assert TASKS["stock_trading"] is StockTradingEnv
    assert (env.obs_dim, env.act_dim, env.discrete) == (302, 30, False)
    assert (env.action_low, env.action_high, env.max_episode_steps) == (-1.0, 1.0, 252)
    obs = env.reset()
    assert obs.shape == (8, 302) and obs.dtype == torch.float32 and torch.isfinite(obs).all()
    o, r, term, trunc, info = env.step(torch.zeros(8, 30))
    assert r.dtype == torch.float32 and info["final_obs"].shape == (8, 302)
    names = [n for n, _ in env.obs_layout()]
    assert names[0] == "cash" and names[-1] == "turbulence" and env.obs_layout()[-1][1].stop == env.obs_dim
    assert set(TradingOptions.__dataclass_fields__) >= {"data", "stocks", "initial_cash", "cost", "max_shares"}
    with pytest.raises(ValueError, match=r"stock_trading: cost: must be in \[0, 1\)"):
        make(random_market(0), cost=1.5)  # the env checks its options as the config does (TradingOptions.check)
    with pytest.raises(TypeError, match="unknown option.*cots.*cost"):
        make(random_market(0), cots=0.1)
    with pytest.raises(ValueError, match="columns"):
        env.step(torch.zeros(8, 7))


def test_state_dict_round_trip_and_foreign_data():
    md = random_market(4, T=60, S=3)
    acts = torch.tensor(np.random.default_rng(1).uniform(-1, 1, (40, 5, 3)))
    env = make(md, 5, seed=9, max_episode_steps=7)
    env.reset()
    for a in acts[:13]:
        env.step(a)
    sd = env.state_dict()
    assert tickers_from_state(sd) == md.tickers
    expected = [env.step(a) for a in acts[13:]]
    other = make(md, 5, seed=1, max_episode_steps=7)
    other.reset()
    other.load_state_dict(sd)
    got = [other.step(a) for a in acts[13:]]
    for e, g in zip(expected, got):
        for x, y in zip(e[:4], g[:4]):
            assert torch.equal(x, y)
        for k in e[4]:
            assert torch.equal(e[4][k], g[4][k]), k
    with pytest.raises(ValueError, match="other market data"):
        make(random_market(5, T=60, S=3), 5).load_state_dict(sd)
    with pytest.raises(ValueError, match="trading window"):
        make(md, 5, start="2000-01-10").load_state_dict(sd)


def test_branch_free_path_equals_the_cpu_path():
    """``pure_step`` (GPU / compile path) gives the same results as the CPU step, resets included."""
    md = random_market(6, T=50, S=4)
    acts = torch.tensor(np.random.default_rng(2).uniform(-1, 1, (30, 16, 4)))
    a, b = make(md, 16, seed=4, max_episode_steps=6), make(md, 16, seed=4, max_episode_steps=6)
    a.reset(), b.reset()
    for act in acts:
        ra = a.step(act)
        rb = b._apply(b.pure_step(b.state, b.t, b.ep_return, b.rng.key, b.rng.counter, act))
        for x, y in zip(ra[:4], rb[:4]):
            assert torch.equal(x, y)
        for k in ra[4]:
            assert torch.equal(ra[4][k], rb[4][k]), k
        assert torch.equal(a.state, b.state) and torch.equal(a.rng.counter, b.rng.counter)


def _compiled_equals_eager(device: str, mode: str | None) -> None:
    md = random_market(8, T=50, S=4)
    acts = torch.tensor(np.random.default_rng(4).uniform(-1, 1, (14, 16, 4)), dtype=torch.float32)
    kw = dict(seed=3, max_episode_steps=5, turbulence_window=10, warmup_bars=0, data=md)
    a = StockTradingEnv(16, device, **kw)
    b = StockTradingEnv(16, device, **kw).compile(mode=mode)
    a.reset(), b.reset()
    for act in acts.to(device):
        ra, rb = a.step(act), b.step(act)
        for x, y in zip(ra[:4], rb[:4]):
            assert torch.equal(x, y)
        for k in ra[4]:
            assert torch.equal(ra[4][k], rb[4][k]), k
        assert torch.equal(a.state, b.state) and torch.equal(a.rng.counter, b.rng.counter)


def test_compiled_step_equals_eager_on_cpu():
    """env.compile() traces pure_step whole (fullgraph): the eager step writes into views of one
    buffer with out=, which torch.compile refuses, so the traced path builds them by concatenation."""
    _compiled_equals_eager("cpu", None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_cuda_graphs_equal_eager():
    _compiled_equals_eager("cuda", "reduce-overhead")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_step_equals_the_cpu_step():
    """On a GPU the env takes the branch-free path; it trades, resets and observes as on the CPU."""
    md = random_market(7, T=60, S=5)
    acts = torch.tensor(np.random.default_rng(3).uniform(-1, 1, (40, 64, 5)))
    a = make(md, 64, seed=5, max_episode_steps=7, cost=0.002, max_shares=50)
    b = StockTradingEnv(
        64,
        "cuda",
        seed=5,
        dtype=torch.float64,
        data=md,
        warmup_bars=0,
        turbulence_window=10,
        max_episode_steps=7,
        cost=0.002,
        max_shares=50,
    )
    oa, ob = a.reset(), b.reset()
    torch.testing.assert_close(ob.cpu(), oa, rtol=1e-12, atol=1e-12)
    for act in acts:
        ra, rb = a.step(act), b.step(act.cuda())
        for x, y in zip(ra[:4], rb[:4]):
            torch.testing.assert_close(y.cpu(), x, rtol=1e-12, atol=1e-9)
        assert torch.equal(rb[4]["done"].cpu(), ra[4]["done"])
        assert torch.equal(b.day(b.state).cpu(), a.day(a.state)) and torch.equal(
            b.holdings(b.state).cpu(), a.holdings(a.state)
        )
        torch.testing.assert_close(b.cash(b.state).cpu(), a.cash(a.state), rtol=1e-12, atol=1e-6)


def op_counts(env, action):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        env.step(action)
    return {e.key: e.count for e in prof.key_averages()}


@pytest.mark.parametrize("limit", [50, 1], ids=["no-reset", "all-reset"])
def test_no_python_loop_over_envs_or_stocks(limit):
    counts = []
    for n, S in ((2, 2), (300, 2), (2, 17)):
        md = random_market(0, T=80, S=S)
        env = make(md, n, max_episode_steps=limit, turbulence_threshold=1.0, random_start=False)
        env.reset()
        a = torch.rand(n, S, dtype=torch.float64) * 2 - 1
        env.step(a)
        counts.append(op_counts(env, a))
    assert sum(counts[0].values()) > 20
    assert counts[0] == counts[1] == counts[2]


def test_a_pod_trains_saves_and_resumes_on_stock_trading(tmp_path):
    from podracer_hpc.config import load_config
    from podracer_hpc.pod import Pod

    cfg = load_config(
        None,
        [
            "env.name=stock_trading",
            "env.num_envs=8",
            "agent.rollout_steps=4",
            "agent.num_minibatches=2",
            "agent.update_epochs=1",
            "eval.episodes=2",
            "env.max_episode_steps=6",
            "agent.hidden_sizes=[16]",
        ],
    )
    pod = Pod(cfg)
    m = pod.train_iteration()
    assert math.isfinite(float(m["loss"]))
    ret = pod.evaluate(0)
    assert ret.shape == (2,) and torch.isfinite(ret).all()
    pod.save(tmp_path / "ck.safetensors")
    again = Pod(cfg)
    again.load(tmp_path / "ck.safetensors")
    assert torch.equal(again.env.state, pod.env.state)
    pod.train_iteration(), again.train_iteration()
    assert torch.equal(again.env.state, pod.env.state)


def test_market_cache_is_shared_between_envs():
    a = get_market(None, (), "cpu", torch.float32, 252, 30, 1512, 0, "momentum")
    b = make_env("stock_trading", 2).market
    assert a is b
