"""gymnasium vector envs behind the VecEnv protocol (host numpy envs, tensors at the boundary).

This is the slow path that batched on-device environments replace: every step crosses from
numpy on the host to tensors on the pod's device. It runs any installed gymnasium env (the
``gymnasium`` task, :mod:`.gym_task`; the MuJoCo tasks' ``gymnasium`` backend) and is the peer
that benchmarks compare against.

Vectorization (``gymnasium.make_vec``): ``sync`` (``SyncVectorEnv``, one env after another in
this process), ``async`` (``AsyncVectorEnv``, one worker process per env) or
``vector_entry_point`` (the env's own batched implementation, if its spec has one). The async
workers ignore the pod's warning signals and Ctrl-C (the pod stops, checkpoints and closes
them; an env still open at exit is closed then). ``sync`` and
``async`` run with gymnasium's ``SAME_STEP`` autoreset, the protocol's semantics (the final
observation in the info); an env's own vector env must autoreset that way too (gymnasium's
``CartPoleVectorEnv`` resets at the next step instead and is refused: its reset observation
comes one step late, with an action the env ignores).

Spaces: observations ``Box`` (flattened to ``[N, obs_dim]``) or ``Discrete`` (one-hot);
actions ``Discrete`` (``num_actions`` choices, gymnasium's ``start`` added back) or a bounded
``Box`` (per-dimension bounds kept; the pod maps its [-1, 1] actions onto them). Other spaces
raise ValueError naming them (:func:`spaces_problem`).

Neither gymnasium's sub-envs nor their RNGs can be saved as tensors: ``state_dict`` raises
``NotImplementedError`` and a pod resumes with the agent exact and fresh episodes.
"""

from __future__ import annotations

import atexit
import signal
import weakref
from typing import Any

import numpy as np
import torch

VECTORIZATION = ("sync", "async", "vector_entry_point")
NO_CHECKPOINT = (
    "gymnasium envs cannot be checkpointed exactly (their state lives in gymnasium objects); "
    "a resume restores the agent exactly and starts new episodes"
)


def spaces_problem(obs_space: Any, act_space: Any) -> str:
    """Why a pod cannot run an env of these (single-env) spaces, or ``""`` when it can."""
    from gymnasium import spaces

    if not isinstance(obs_space, (spaces.Box, spaces.Discrete)):
        return f"its observation space is {obs_space} (a pod takes Box or Discrete observations)"
    if isinstance(act_space, spaces.Discrete):
        return ""
    if not isinstance(act_space, spaces.Box):
        return f"its action space is {act_space} (a pod takes Discrete or Box actions)"
    if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        return f"its action space {act_space} is unbounded (a pod maps its actions onto finite bounds)"
    return ""


def _async_worker(*args: Any) -> None:
    """gymnasium's AsyncVectorEnv worker, deaf to the signals its pod handles.

    A forked worker inherits the pod's handlers: a warning signal (SIGTERM, SIGUSR1/2, which
    Slurm sends to every process) or Ctrl-C must reach the pod, which finishes its update and
    checkpoints with its envs alive; the worker ends when its pod closes the env (or its pipe
    closes, when the pod is gone)."""
    from gymnasium.vector.async_vector_env import _async_worker as gymnasium_worker

    for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)
    gymnasium_worker(*args)


def _close_at_exit(ref: weakref.ref) -> None:
    """Close an async env still open when the interpreter exits (its workers ignore SIGTERM, so
    multiprocessing's own clean-up, which terminates them, would wait for them forever)."""
    env = ref()
    if env is not None and not getattr(env, "closed", True):
        env.close(terminate=False)


def make_vector(
    env_id: str,
    num_envs: int,
    kwargs: dict[str, Any] | None = None,
    vectorization: str = "sync",
    max_episode_steps: int = 0,
) -> Any:
    """``gymnasium.make_vec`` of ``env_id`` as the protocol needs it (same-step autoreset).

    ``kwargs`` go to the env's constructor; ``max_episode_steps`` (0: the spec's) to its time
    limit. Raises ValueError for an unknown mode or an own vector env that does not reset on
    the same step."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    if vectorization not in VECTORIZATION:
        raise ValueError(f"vectorization must be one of {', '.join(VECTORIZATION)}, got {vectorization!r}")
    kw = dict(kwargs or {})
    if max_episode_steps:
        kw["max_episode_steps"] = int(max_episode_steps)
    if vectorization == "sync":
        return gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            **kw,
        )
    if vectorization == "async":
        env = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="async",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP, "worker": _async_worker},
            **kw,
        )
        atexit.register(_close_at_exit, weakref.ref(env))
        return env
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kw)
    mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode != AutoresetMode.SAME_STEP:
        env.close()
        raise ValueError(
            f"{env_id}'s own vector env resets finished envs with {mode} (a pod needs "
            f"{AutoresetMode.SAME_STEP}: the next episode's first observation on the step that ends one); "
            "use vectorization sync or async"
        )
    return env


class GymVecEnv:
    """A gymnasium vector env of ``env_id`` (:func:`make_vector`) as a VecEnv."""

    backend = "gymnasium"

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        kwargs: dict[str, Any] | None = None,
        vectorization: str = "sync",
        dtype: torch.dtype = torch.float32,
    ):
        from gymnasium import spaces

        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.env = make_vector(env_id, num_envs, kwargs, vectorization, max_episode_steps)
        obs_space, single = self.env.single_observation_space, self.env.single_action_space
        why = spaces_problem(obs_space, single)
        if why:
            self.env.close()
            raise ValueError(f"{env_id}: {why}")
        self.gym_id, self.vectorization = env_id, vectorization
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.dtype = dtype
        self._onehot = int(obs_space.n) if isinstance(obs_space, spaces.Discrete) else 0
        self._obs_start = int(obs_space.start) if self._onehot else 0
        self.obs_dim = self._onehot or int(np.prod(obs_space.shape))
        self.discrete = isinstance(single, spaces.Discrete)
        self.act_dim = 1 if self.discrete else int(np.prod(single.shape))
        self.num_actions = int(single.n) if self.discrete else 0
        self._act_start = int(single.start) if self.discrete else 0
        if not self.discrete:
            self._act_shape, self._act_dtype = tuple(single.shape), single.dtype
            self._low, self._high = single.low.reshape(-1), single.high.reshape(-1)
            uniform = np.all(self._low == self._low[0]) and np.all(self._high == self._high[0])
            # one number where every dimension shares its bounds, else one per dimension (the pod takes both)
            self.action_low = float(self._low[0]) if uniform else torch.as_tensor(self._low, dtype=torch.float32)
            self.action_high = float(self._high[0]) if uniform else torch.as_tensor(self._high, dtype=torch.float32)
        spec = getattr(self.env, "spec", None)
        self.max_episode_steps = int(max_episode_steps or (spec.max_episode_steps if spec else 0) or 0)
        self.seed = seed
        self._ep_return = np.zeros(num_envs)
        self._ep_len = np.zeros(num_envs, dtype=np.int64)

    def _t(self, x: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x), dtype=dtype or self.dtype, device=self.device)

    def _obs(self, obs: Any) -> np.ndarray:
        """Observations as ``[N, obs_dim]`` numbers (Discrete ones one-hot)."""
        if self._onehot:
            idx = np.asarray(obs, dtype=np.int64).reshape(-1) - self._obs_start
            return np.eye(self._onehot, dtype=np.float32)[idx]
        return np.asarray(obs).reshape(len(obs), self.obs_dim)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start every env anew; a seed reseeds them (env i gets ``seed + i``, gymnasium's rule)."""
        obs, _ = self.env.reset(seed=self.seed if seed is None else seed)
        self._ep_return[:] = 0
        self._ep_len[:] = 0
        return self._t(self._obs(obs))

    def step(self, action: torch.Tensor):
        """One step of every env (same-step autoreset: ``info["final_obs"]`` of finished ones)."""
        a = action.detach().cpu().numpy()
        if self.discrete:
            a = a.reshape(-1).astype(np.int64) + self._act_start
        else:
            a = np.clip(a.reshape(self.num_envs, -1), self._low, self._high)
            a = a.reshape(self.num_envs, *self._act_shape).astype(self._act_dtype)
        obs, reward, term, trunc, info = self.env.step(a)
        term, trunc = np.asarray(term, bool), np.asarray(trunc, bool)
        trunc = trunc & ~term
        done = term | trunc
        reward = np.asarray(reward, np.float64)
        self._ep_return += reward
        self._ep_len += 1
        ep_ret, ep_len = self._ep_return.copy(), self._ep_len.copy()
        self._ep_return[done] = 0
        self._ep_len[done] = 0
        obs = self._obs(obs)
        final = obs
        if "final_obs" in info:
            final = obs.copy()
            for i in np.flatnonzero(info["_final_obs"]):
                final[i] = self._obs(np.asarray(info["final_obs"][i])[None])[0]
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
        """Close gymnasium's vector env (its worker processes, for ``async``: asked to end, not signalled)."""
        if not getattr(self.env, "closed", True):
            self.env.close(terminate=False)

    def __del__(self) -> None:
        # before gymnasium's own __del__, which would terminate the async workers by SIGTERM (they ignore it)
        if getattr(self, "env", None) is not None:
            try:
                self.close()
            except Exception:  # noqa: BLE001  (a half-built or already broken env: nothing left to close)
                pass

    def state_dict(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError(NO_CHECKPOINT)

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError(NO_CHECKPOINT)
