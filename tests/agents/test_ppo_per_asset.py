"""A policy that scales over stocks: the per-asset network shares its weights
across stocks and is permutation-equivariant; target-weight actions beside share orders."""

from __future__ import annotations

import json

import pytest
import torch

from podracer_hpc.agents.ppo import PPOAgent
from podracer_hpc.agents.settings import PPOConfig
from podracer_hpc.config import load_config
from podracer_hpc.docfield import ConfigError
from podracer_hpc.tools.backtest import backtest, main
from podracer_hpc.trading.data import from_arrays
from podracer_hpc.trading.env import StockTradingEnv

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_env(n=8, stocks=5, **kw) -> StockTradingEnv:
    return StockTradingEnv(n, seed=3, synthetic_stocks=stocks, synthetic_days=300, **kw)


def permute_assets(obs: torch.Tensor, layout, perm: list[int]) -> torch.Tensor:
    """The observation of the same account with the stocks listed in the order ``perm``."""
    cols = torch.tensor(layout[1])  # [S, F]
    out = obs.clone()
    out[:, cols.reshape(-1)] = obs[:, cols[perm].reshape(-1)]
    return out


def test_asset_layout_covers_the_observation_once():
    env = small_env(stocks=4)
    glob, per = env.asset_layout()
    cols = sorted(glob + [c for row in per for c in row])
    assert cols == list(range(env.obs_dim)) and len(per) == 4 and len(per[0]) == 10
    names = dict(env.obs_layout())
    assert glob == [names["cash"].start, names["turbulence"].start]
    assert per[2][0] == names["position_value"].start + 2 and per[2][1] == names["log_close"].start + 2


@pytest.mark.parametrize("network", ["per_asset", "mlp"])
def test_permuting_stocks_permutes_actions_only_for_the_per_asset_network(network):
    torch.manual_seed(0)
    env = small_env(n=64, stocks=5)
    layout = env.asset_layout()
    cfg = PPOConfig(network=network, hidden_sizes=[16, 16], activation="tanh")
    agent = PPOAgent(env.obs_dim, env.act_dim, False, 0, 64, cfg, asset_layout=layout)
    with torch.no_grad():  # a trained-looking actor: large random output weights instead of the 0.01 init
        for p in agent.net.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    obs = env.reset(seed=1)
    for _ in range(5):  # normalizer statistics from real observations (tied across stocks for per_asset)
        agent.normalize_obs(obs, update=True)
        obs, *_ = env.step(torch.rand(64, 5) * 2 - 1)
    perm = [3, 0, 4, 1, 2]
    a = agent.act_deterministic(agent.normalize_obs(obs, update=False))
    ap = agent.act_deterministic(agent.normalize_obs(permute_assets(obs, layout, perm), update=False))
    v = agent.value(agent.normalize_obs(obs, update=False))
    vp = agent.value(agent.normalize_obs(permute_assets(obs, layout, perm), update=False))
    if network == "per_asset":
        torch.testing.assert_close(ap, a[:, perm], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(vp, v, rtol=1e-5, atol=1e-6)
        assert a.std(1).mean() > 1e-3  # the actions do differ between stocks
        # the same weights serve every stock: the parameter count does not grow with the stocks
        big = StockTradingEnv(2, seed=0, synthetic_stocks=12, synthetic_days=300)
        agent12 = PPOAgent(big.obs_dim, big.act_dim, False, 0, 2, cfg, asset_layout=big.asset_layout())
        count = lambda m: sum(p.numel() for p in m.net.parameters())  # noqa: E731
        assert count(agent12) == count(agent)
    else:  # the plain MLP has no such structure (so the check above can fail)
        assert not torch.allclose(ap, a[:, perm], rtol=1e-3, atol=1e-4)


def test_per_asset_is_refused_where_it_cannot_work():
    with pytest.raises(ConfigError, match="agent.network: per_asset needs a task"):
        load_config(None, ["env.name=pendulum", "agent.network=per_asset"])
    with pytest.raises(ConfigError, match="agent.network: must be mlp or per_asset"):
        load_config(None, ["env.name=stock_trading", "agent.network=cnn"])
    with pytest.raises(ConfigError, match="env.trading.actions: must be one of shares, weights"):
        load_config(None, ["env.name=stock_trading", "env.trading.actions=percent"])
    with pytest.raises(ValueError, match="asset layout"):
        PPOAgent(3, 1, False, 0, 4, PPOConfig(network="per_asset"))


def test_target_weight_actions():
    close = torch.tensor([[10.0, 50.0, 200.0]] * 4, dtype=torch.float64)
    close[2:] *= torch.tensor([1.1, 0.9, 1.0], dtype=torch.float64)
    md = from_arrays(close.numpy(), tickers=["A", "B", "C"])
    env = StockTradingEnv(
        3,
        seed=0,
        data=md,
        actions="weights",
        cost=0.01,
        initial_cash=10_000.0,
        warmup_bars=0,
        random_start=False,
        turbulence_window=0,
    )
    env.reset(seed=0)
    a = torch.tensor(
        [
            [1.0, 0.0, 0.0],  # all in A
            [0.5, 0.5, -1.0],  # half A, half B; a negative weight is 0
            [1.0, 1.0, 1.0],
        ]
    )  # more than 1 in all: scaled to a third each
    env.step(a)
    cash, hold = env.state[:, 0], env.state[:, 1:4]
    p = close[0]
    # target 1,000 shares of A; with the 1% cost that is more than the cash: scaled down to what it buys
    assert hold[0].tolist() == [990.0, 0.0, 0.0]
    assert hold[1].tolist() == [495.0, 99.0, 0.0]
    assert hold[2].tolist() == [333.0, 66.0, 16.0]  # floor(V / 3 / price): affordable, not scaled
    assert (cash >= 0).all()
    spent = (hold * p).sum(1) * 1.01
    torch.testing.assert_close(cash, 10_000.0 - spent)
    # the next day: the target is kept by trading only the difference; all -1 sells everything
    env.step(torch.tensor([[1.0, 0.0, 0.0], [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]))
    assert env.state[1, 1:4].tolist() == [0.0, 0.0, 0.0]
    assert env.state[0, 1:4].tolist() == [990.0, 0.0, 0.0]  # a target that is held is not traded again
    assert (env.state[:, 0] >= 0).all()


def test_per_asset_weights_pod_trains_and_its_checkpoint_backtests(tmp_path, capsys):
    from podracer_hpc.pod import Pod

    cfg = load_config(
        None,
        [
            "env.name=stock_trading",
            "env.num_envs=8",
            "agent.hidden_sizes=[8]",
            "eval.episodes=1",
            "env.max_episode_steps=8",
            "agent.rollout_steps=4",
            "agent.num_minibatches=2",
            "agent.network=per_asset",
            "env.trading.actions=weights",
            "total_env_steps=96",
            "env.trading.synthetic_stocks=6",
            "eval.interval_env_steps=0",
        ],
    )
    pod = Pod(cfg)
    before = {k: v.clone() for k, v in pod.agent.net.state_dict().items()}
    for _ in range(3):
        pod.train_iteration()
    after = pod.agent.net.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if after[k].is_floating_point())
    ck = tmp_path / "rank0.safetensors"
    pod.save(ck)
    assert main([str(ck), "--start", "2015-06-01", "--end", "2015-08-31", "--plot", ""]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["agent"]["cumulative_return"] is not None
    # the backtest follows the checkpoint's rules (weights) and network (per asset): same as by hand
    res = backtest(str(ck), None, "2015-06-01", "2015-08-31", synthetic={"stocks": 6})
    assert res["agent"] == summary["agent"]
