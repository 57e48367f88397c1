"""podracer's ``stock_trading`` env as a gymnasium env, for the RLlib baseline.

One trading account of :class:`podracer_hpc.trading.env.StockTradingEnv` (the same market, rules,
costs, observation and reward as a pod's), stepped through gymnasium's interface so that RLlib's
env runners can run it. Options are the ``env.trading`` keys of a podracer job; ``data`` paths
are resolved against the directory the run started in (Ray's workers may run elsewhere).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from podracer_hpc.trading.env import StockTradingEnv


class TradingGymEnv(gym.Env):
    """``config``: ``{"trading": {...env.trading keys...}, "max_episode_steps": int, "seed": int}``.

    Observations are float32 ``[10 S + 2]``, actions ``[-1, 1]^S`` (shares or target weights, as
    ``trading.actions`` says), the reward the pod's (change in account value x ``reward_scale``).
    An episode starts at a day drawn by ``reset(seed=...)``'s stream and ends as a pod's does.
    """

    metadata: dict[str, Any] = {}

    def __init__(self, config: dict[str, Any] | None = None):
        config = dict(config or {})
        trading = dict(config.get("trading") or {})  # checked by the env itself (TradingOptions)
        torch.set_num_threads(1)  # one account: more threads only wait on each other
        self.env = StockTradingEnv(
            1,
            "cpu",
            seed=int(config.get("seed", 0)),
            max_episode_steps=int(config.get("max_episode_steps", 252)),
            data=trading.pop("data", "") or None,
            **trading,
        )
        S = self.env.num_stocks
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.env.obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (S,), np.float32)
        self.tickers = list(self.env.market.data.tickers)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        obs = self.env.reset(seed=seed) if seed is not None else self.env.reset()
        return obs[0].numpy().astype(np.float32), {}

    def step(self, action):
        a = torch.as_tensor(np.asarray(action, np.float32).reshape(1, -1))
        obs, reward, terminated, truncated, info = self.env.step(a)
        done = bool(terminated[0] or truncated[0])
        o = info["final_obs"][0] if done else obs[0]  # the vector env restarted the account already
        return (o.numpy().astype(np.float32), float(reward[0]), bool(terminated[0]), bool(truncated[0]), {})
