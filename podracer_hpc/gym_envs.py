"""podracer's batched envs as gymnasium vector envs (for CleanRL, TorchRL or any gymnasium user).

Importing this module registers, in gymnasium's registry, one id per built-in task
(:data:`GYM_IDS`: ``podracer/Pendulum-v0``, ``podracer/CartPole-v0``, ...) and
``podracer/Task-v0`` for any task of podracer's registry (plugins included: ``task=<name>``),
each with a **vector entry point** only::

    import gymnasium as gym
    import podracer_hpc.gym_envs  # noqa: F401  (or the id "podracer_hpc.gym_envs:podracer/Pendulum-v0")

    envs = gym.make_vec("podracer/Pendulum-v0", num_envs=4096, vectorization_mode="vector_entry_point",
                        device="cpu", seed=0)
    obs, info = envs.reset(seed=0)
    obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())

The env is the pod's own (:func:`podracer_hpc.envs.make_env`), stepped as one batch on
``device``; :class:`PodracerVectorEnv` only converts at the boundary: numpy arrays in and out
(gymnasium's convention; obs float32, rewards float64), gymnasium's ``SAME_STEP`` autoreset
(``info["final_obs"]`` and ``info["_final_obs"]`` where an episode ended, as ``SyncVectorEnv``
gives them). Keyword arguments of ``make_vec`` reach ``make_env``: ``device``, ``seed``,
``max_episode_steps``, ``dtype`` and the task's options (``backend="warp"`` for MuJoCo,
``cost=0.002`` for stock trading). This module imports gymnasium; torch is imported when an env
is made. gymnasium 1.x has no plugin hook for other packages' envs, hence the import.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

# the built-in tasks' gymnasium ids (podracer/Task-v0 takes any task by name)
GYM_IDS: dict[str, str] = {
    "pendulum": "podracer/Pendulum-v0",
    "cartpole": "podracer/CartPole-v0",
    "stock_trading": "podracer/StockTrading-v0",
    "halfcheetah": "podracer/HalfCheetah-v0",
    "hopper": "podracer/Hopper-v0",
    "walker2d": "podracer/Walker2d-v0",
    "ant": "podracer/Ant-v0",
    "humanoid": "podracer/Humanoid-v0",
}
ANY_TASK_ID = "podracer/Task-v0"


class PodracerVectorEnv(VectorEnv):
    """A podracer batched env (task ``task`` of the registry, ``num_envs`` wide) as a gymnasium
    ``VectorEnv`` with same-step autoreset."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        num_envs: int = 1,
        task: str = "pendulum",
        device: str = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        render_mode: str | None = None,
        **options: Any,
    ):
        if task == "gymnasium":
            raise ValueError("task 'gymnasium' is a gymnasium env already: make it with gymnasium directly")
        if render_mode is not None:
            raise ValueError(f"podracer's batched envs do not render (render_mode {render_mode!r})")
        from podracer_hpc.envs import make_env

        self.env = make_env(task, num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps, **options)
        self.task, self.num_envs, self.render_mode = task, int(num_envs), None
        self._seed = seed
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (self.env.obs_dim,), np.float32)
        if self.env.discrete:
            self.single_action_space = spaces.Discrete(int(self.env.num_actions))
        else:
            shape = (self.env.act_dim,)
            low = np.broadcast_to(np.asarray(_numpy(self.env.action_low), np.float32), shape)
            high = np.broadcast_to(np.asarray(_numpy(self.env.action_high), np.float32), shape)
            self.single_action_space = spaces.Box(low, high, shape, np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.max_episode_steps = int(self.env.max_episode_steps)

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start every env anew; ``seed`` restarts the per-env streams (one seed: the batch's
        streams derive env i's from it; a list gives its first)."""
        if isinstance(seed, (list, tuple)):
            seed = seed[0]
        super().reset(seed=seed)
        return _numpy(self.env.reset(seed)).astype(np.float32, copy=False), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of the whole batch; finished envs restart in the same step."""
        import torch

        a = torch.as_tensor(np.asarray(actions), device=self.env.device)
        a = a.reshape(self.num_envs).long() if self.env.discrete else a.reshape(self.num_envs, -1).float()
        obs, reward, term, trunc, info = self.env.step(a)
        infos: dict[str, Any] = {}
        done = _numpy(info["done"]).astype(bool)
        if done.any():  # as SyncVectorEnv with SAME_STEP: final_obs rows where done, None elsewhere
            final = _numpy(info["final_obs"]).astype(np.float32, copy=False)
            rows = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):  # the finished envs' rows only (gymnasium's layout of this info)
                rows[i] = final[i]
            infos["final_obs"] = rows
            infos["_final_obs"] = done
            infos["final_info"], infos["_final_info"] = {}, done.copy()
        return (
            _numpy(obs).astype(np.float32, copy=False),
            _numpy(reward).astype(np.float64),
            _numpy(term).astype(bool),
            _numpy(trunc).astype(bool),
            infos,
        )

    def close_extras(self, **kwargs: Any) -> None:
        """Close the batched env if it holds resources (a host simulator)."""
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


def _numpy(x: Any) -> Any:
    """A tensor (on any device) as a numpy array; anything else as it is."""
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x


def register_envs() -> list[str]:
    """Register :data:`GYM_IDS` and :data:`ANY_TASK_ID` in gymnasium (done at import; again is a no-op)."""
    entry = f"{__name__}:PodracerVectorEnv"
    ids = []
    for task, env_id in [*GYM_IDS.items(), (None, ANY_TASK_ID)]:
        if env_id not in gym.registry:
            gym.register(id=env_id, vector_entry_point=entry, kwargs={} if task is None else {"task": task})
        ids.append(env_id)
    return ids


register_envs()
