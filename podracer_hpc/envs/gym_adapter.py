"""gymnasium vector envs behind the VecEnv protocol (host numpy envs, tensors at the boundary).

This is the slow path that batched on-device environments replace: every step crosses from
numpy on the host to tensors on the pod's device. It exists as a fallback for tasks that have
no batched implementation, and as the peer that benchmarks compare against. gymnasium's
``SAME_STEP`` autoreset mode gives the protocol's semantics (final observation in the info).
"""

from __future__ import annotations

import numpy as np
import torch


class GymVecEnv:
    """``gymnasium.vector.SyncVectorEnv`` of ``env_id`` as a VecEnv."""

    def __init__(self, env_id: str, num_envs: int, device: str | torch.device = "cpu", seed: int = 0,
                 max_episode_steps: int = 0):
        import gymnasium as gym

        kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
        self.env = gym.vector.SyncVectorEnv(
            [lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        single = self.env.single_action_space
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.obs_dim = int(np.prod(self.env.single_observation_space.shape))
        self.discrete = isinstance(single, gym.spaces.Discrete)
        self.act_dim = 1 if self.discrete else int(np.prod(single.shape))
        self.num_actions = int(single.n) if self.discrete else 0
        if not self.discrete:
            self.action_low, self.action_high = float(single.low.min()), float(single.high.max())
        spec = self.env.envs[0].spec
        self.max_episode_steps = int(max_episode_steps or (spec.max_episode_steps if spec else 0) or 0)
        self.seed = seed
        self._ep_return = np.zeros(num_envs)
        self._ep_len = np.zeros(num_envs, dtype=np.int64)

    def _t(self, x: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x), dtype=dtype, device=self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self.env.reset(seed=self.seed if seed is None else seed)
        self._ep_return[:] = 0
        self._ep_len[:] = 0
        return self._t(obs)

    def step(self, action: torch.Tensor):
        a = action.detach().cpu().numpy()
        if self.discrete:
            a = a.reshape(-1).astype(np.int64)
        obs, reward, term, trunc, info = self.env.step(a)
        trunc = trunc & ~term
        done = term | trunc
        self._ep_return += reward
        self._ep_len += 1
        ep_ret, ep_len = self._ep_return.copy(), self._ep_len.copy()
        self._ep_return[done] = 0
        self._ep_len[done] = 0
        final = obs.copy()
        if "final_obs" in info:
            for i in np.flatnonzero(info["_final_obs"]):
                final[i] = info["final_obs"][i]
        return self._t(obs), self._t(reward), self._t(term, torch.bool), self._t(trunc, torch.bool), {
            "final_obs": self._t(final),
            "done": self._t(done, torch.bool),
            "episode_return": self._t(ep_ret, torch.float64),
            "episode_length": self._t(ep_len, torch.int64),
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError("gymnasium envs cannot be checkpointed exactly; use a batched task")

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError("gymnasium envs cannot be checkpointed exactly; use a batched task")
