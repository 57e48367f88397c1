"""The gymnasium MuJoCo v5 locomotion tasks behind the VecEnv protocol, on any backend.

Task names are backend-independent: ``halfcheetah, hopper, walker2d, ant, humanoid`` (the
gymnasium ids ``HalfCheetah-v5`` ... ``Humanoid-v5``). The option ``backend`` chooses who
steps the physics (docs/mujoco.md):

- ``envpool``: EnvPool's C++ thread pool, one batched call per step (the fast CPU path).
- ``gymnasium``: ``gymnasium.vector.SyncVectorEnv`` of ``gym.make(id)`` (the reference and the
  fallback when envpool is not installed).
- ``warp``: MuJoCo Warp, thousands of worlds on the pod's GPU with zero-copy torch views
  (:mod:`podracer_hpc.envs.mujoco_warp`; it also runs on Warp's CPU device, slowly).
- ``auto``: ``warp`` on a CUDA device when ``mujoco_warp`` and ``warp`` are installed, else
  ``envpool`` when it imports, else ``gymnasium``.

Every backend keeps the protocol of ``base.py``: tensors on the pod's device (observations
float32), **same-step** auto-reset (``obs`` of a finished env is the first observation of its
next episode, ``info["final_obs"]`` its last one), ``terminated`` and ``truncated`` never both
true (terminated wins), and ``info["episode_return"]``/``["episode_length"]`` where
``info["done"]``.

Auto-reset conversion. EnvPool only implements gymnasium's *next-step* autoreset: the step
that ends an episode returns the terminal observation, and the following ``step`` ignores the
action of that env and returns the reset observation with reward 0. The adapter converts this
to same-step semantics by resetting the finished envs explicitly right after the step
(``env.reset(env_id=finished)``, one extra batched call only on steps where something
finished): the terminal observation goes to ``final_obs``, the reset observation to ``obs``,
and EnvPool's next ``step`` then steps every env normally (no zero-reward filler step ever
reaches the pod). gymnasium's vector env is created with ``AutoresetMode.SAME_STEP``.

Seeding. gymnasium reseeds every sub-env on ``reset(seed)`` (env i gets ``seed + i``). EnvPool
fixes its seeds when the pool is built, so ``reset(seed)`` rebuilds the pool unless it is the
pool's own seed and the pool has not stepped yet; ``reset(seed)`` with the same seed therefore
gives the same start states on both backends (what the pod's fixed-start evaluation needs).
The two backends draw different start states for the same seed (different RNGs). The warp
backend draws its start states from the project's per-env counter streams (``rng.py``):
``reset(seed)`` restarts them, ``reset()`` continues them, as the batched torch tasks do.

Neither host backend can be checkpointed exactly (simulator state and RNG streams live in C++
or in gymnasium objects): ``state_dict`` raises ``NotImplementedError``. The warp backend's
whole state is device arrays and tensors, so its ``state_dict`` is exact.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import torch

from podracer_hpc.envs.gym_adapter import GymVecEnv
from podracer_hpc.envs.mujoco_tasks import BACKENDS, GYM_IDS

_NO_CHECKPOINT = (
    "MuJoCo envs on the {} backend cannot be checkpointed exactly (the simulator state and RNG "
    "streams are not exposed); resume would need a non-exact mode that restarts the episodes"
)


def envpool_available() -> bool:
    return importlib.util.find_spec("envpool") is not None


def warp_available() -> bool:
    """MuJoCo Warp is installed (``mujoco_warp`` and ``warp``; found, not imported: imports are slow)."""
    return all(importlib.util.find_spec(m) is not None for m in ("warp", "mujoco_warp"))


def resolve_backend(backend: str, device: torch.device | str = "cpu") -> str:
    """``auto`` -> ``warp`` on CUDA when installed, else ``envpool`` when installed, else ``gymnasium``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown MuJoCo backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        if torch.device(device).type == "cuda" and warp_available():
            return "warp"
        return "envpool" if envpool_available() else "gymnasium"
    return backend


class GymnasiumMujoco(GymVecEnv):
    """``gymnasium.vector.SyncVectorEnv`` (SAME_STEP autoreset) of a MuJoCo v5 task."""

    backend = "gymnasium"

    def __init__(
        self,
        task: str,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        super().__init__(GYM_IDS[task], num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps)
        self.task = task
        self.dtype = dtype

    def _t(self, x: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if dtype == torch.float32:
            dtype = self.dtype
        return super()._t(x, dtype)

    def close(self) -> None:
        self.env.close()

    def state_dict(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError(_NO_CHECKPOINT.format(self.backend))

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError(_NO_CHECKPOINT.format(self.backend))


class EnvPoolMujoco:
    """EnvPool (sync mode, ``batch_size == num_envs``) of a MuJoCo v5 task, same-step autoreset."""

    backend = "envpool"
    discrete = False
    num_actions = 0

    def __init__(
        self,
        task: str,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        dtype: torch.dtype = torch.float32,
        num_threads: int = 0,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        try:
            import envpool  # noqa: F401  (is it installed?)
        except ImportError as e:
            raise ImportError(
                f"backend 'envpool' needs the envpool package ({e}); pip install 'podracer-hpc[mujoco]', "
                "or use backend 'gymnasium'"
            ) from None
        self.task = task
        self.gym_id = GYM_IDS[task]
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dtype = dtype
        self.num_threads = int(num_threads)
        self.seed = seed
        self.env = None
        self._build(seed, max_episode_steps)
        space = self.env.action_space
        self.obs_dim = int(np.prod(self.env.observation_space.shape))
        self.act_dim = int(np.prod(space.shape))
        self.action_low, self.action_high = float(space.low.min()), float(space.high.max())
        self.max_episode_steps = int(self.env.config["max_episode_steps"])
        self._ep_return = np.zeros(self.num_envs)
        self._ep_len = np.zeros(self.num_envs, dtype=np.int64)

    def _build(self, seed: int, max_episode_steps: int | None = None) -> None:
        import envpool

        if self.env is not None:
            self.env.close()
        kwargs: dict[str, Any] = {}
        mes = self.max_episode_steps if max_episode_steps is None else max_episode_steps
        if mes:
            kwargs["max_episode_steps"] = int(mes)
        self.env = envpool.make(
            self.gym_id,
            env_type="gymnasium",
            num_envs=self.num_envs,
            batch_size=self.num_envs,
            seed=int(seed),
            num_threads=self.num_threads,
            **kwargs,
        )
        self.seed = seed
        self._fresh = True  # built and not stepped: reset(seed) with this seed needs no rebuild

    def _t(self, x: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x), dtype=dtype or self.dtype, device=self.device)

    @staticmethod
    def _ordered(x: np.ndarray, env_id: np.ndarray) -> np.ndarray:
        """Rows of a sync-mode result in env order (EnvPool returns them with their env_id)."""
        if np.array_equal(env_id, np.arange(len(env_id))):
            return x
        out = np.empty_like(x)
        out[env_id] = x
        return out

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None and (seed != self.seed or not self._fresh):
            self._build(seed)
        obs, info = self.env.reset()
        self._fresh = False
        self._ep_return[:] = 0
        self._ep_len[:] = 0
        return self._t(self._ordered(obs, info["env_id"]))

    def step(self, action: torch.Tensor):
        self.step_async(action)
        return self.step_wait()

    def step_async(self, action: torch.Tensor) -> None:
        """Hand the actions to EnvPool's threads and return: they step while the caller works."""
        a = action.detach().to("cpu", torch.float64).numpy().reshape(self.num_envs, self.act_dim)
        self.env.send(a)
        self._fresh = False

    def step_wait(self):
        """The step sent by :meth:`step_async`, when EnvPool's threads have done it."""
        obs, reward, term, trunc, info = self.env.recv(reset=False, return_info=True)
        ids = info["env_id"]
        obs, reward = self._ordered(obs, ids), self._ordered(np.asarray(reward, np.float64), ids)
        # copies: EnvPool's buffers are its own (a bool array would reach torch without one)
        term, trunc = self._ordered(term, ids).copy(), self._ordered(trunc, ids)
        trunc = trunc & ~term
        done = term | trunc
        self._ep_return += reward
        self._ep_len += 1
        ep_ret, ep_len = self._ep_return.copy(), self._ep_len.copy()
        final = obs
        if done.any():
            finished = np.flatnonzero(done).astype(np.int32)
            final = obs.copy()
            obs = obs.copy()
            r_obs, r_info = self.env.reset(finished)  # same-step: restart now, not at the next step
            obs[r_info["env_id"]] = r_obs
            self._ep_return[done] = 0
            self._ep_len[done] = 0
        return (
            self._t(obs),
            self._t(reward),
            self._t(term, torch.bool),
            self._t(trunc, torch.bool),
            {
                "final_obs": self._t(final),
                "done": self._t(done, torch.bool),
                "episode_return": self._t(ep_ret, torch.float64),
                "episode_length": self._t(ep_len, torch.int64),
            },
        )

    def close(self) -> None:
        if self.env is not None:
            self.env.close()

    def state_dict(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError(_NO_CHECKPOINT.format(self.backend))

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError(_NO_CHECKPOINT.format(self.backend))


def make_mujoco_env(
    task: str,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    max_episode_steps: int = 0,
    dtype: torch.dtype = torch.float32,
    backend: str = "auto",
    num_threads: int = 0,
    **warp_options: Any,
):
    """A MuJoCo v5 task on ``backend`` (auto | envpool | gymnasium | warp).

    ``num_threads`` is envpool's (ignored elsewhere); ``warp_options`` (``graph``, ``nconmax``,
    ``njmax``) go to :class:`~podracer_hpc.envs.mujoco_warp.WarpMujoco`.
    """
    if task not in GYM_IDS:
        raise ValueError(f"unknown MuJoCo task {task!r}; known: {', '.join(GYM_IDS)}")
    b = resolve_backend(backend, device)
    if warp_options and b != "warp":
        raise TypeError(f"options {', '.join(warp_options)} are for backend 'warp', not {b!r}")
    if b == "envpool":
        return EnvPoolMujoco(task, num_envs, device, seed, max_episode_steps, dtype, num_threads=num_threads)
    if b == "gymnasium":
        return GymnasiumMujoco(task, num_envs, device, seed, max_episode_steps, dtype)
    from podracer_hpc.envs.mujoco_warp import WarpMujoco  # imports warp only when asked for (a clear error if missing)

    return WarpMujoco(task, num_envs, device, seed, max_episode_steps, dtype, **warp_options)


def _task(name: str) -> type:
    """A registry entry: calling it like a task class builds the env on the chosen backend."""

    class Builder:
        gym_id = GYM_IDS[name]

        def __new__(
            cls,
            num_envs: int,
            device: str | torch.device = "cpu",
            seed: int = 0,
            max_episode_steps: int = 0,
            dtype: torch.dtype = torch.float32,
            **options: Any,
        ):
            return make_mujoco_env(name, num_envs, device, seed, max_episode_steps, dtype, **options)

    Builder.__name__ = Builder.__qualname__ = f"Mujoco_{name}"
    Builder.__doc__ = f"MuJoCo {GYM_IDS[name]} (options: backend, num_threads; warp: graph, nconmax, njmax)."
    return Builder


MUJOCO_TASKS: dict[str, type] = {name: _task(name) for name in GYM_IDS}
