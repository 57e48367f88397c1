"""The batched VecEnv protocol and a base class for environments written as torch ops.

Contract (DESIGN.md): attributes ``num_envs, obs_dim, act_dim, discrete, max_episode_steps,
device``; ``reset(seed) -> obs[N, obs_dim]``; ``step(action) -> (obs, reward[N],
terminated[N], truncated[N], info)``.

Auto-reset semantics (same step, gymnasium "next-step" semantics are NOT used): when an
environment finishes at step ``t``, ``step`` returns the first observation of its next
episode in ``obs`` and puts the last observation of the finished episode in
``info["final_obs"]`` (rows of unfinished environments hold their current observation, so
the tensor always has shape ``[N, obs_dim]``). ``reward`` is the reward of the finishing
transition. ``terminated`` (a true end: the value of ``final_obs`` is 0) and ``truncated``
(a time limit: bootstrap from ``final_obs``) are never both true: a transition that both
reaches a terminal state and the time limit counts as terminated. ``info["episode_return"]``
and ``info["episode_length"]`` hold the finished episodes' totals where ``info["done"]``.

A host env whose simulator runs in its own threads (EnvPool) may also offer ``step_async(action)``
and ``step_wait() -> (the same five values)``: the pod sends the next action and records the last
step while the physics runs (:func:`split_step`).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import torch

from podracer_hpc.envs.rng import BatchRNG, draw


@runtime_checkable
class VecEnv(Protocol):
    """What a pod needs from a batched environment living on one device."""

    num_envs: int
    obs_dim: int
    act_dim: int
    discrete: bool
    max_episode_steps: int
    device: torch.device

    def reset(self, seed: int | None = None) -> torch.Tensor: ...

    def step(
        self, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None: ...


StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]


def split_step(env: Any) -> tuple[Callable[[torch.Tensor], None], Callable[[], StepResult]]:
    """``(send, recv)`` for ``env``: its ``step_async``/``step_wait`` where it has them (the
    simulator steps between the two calls, while the caller works), else a ``send`` that keeps
    the action and a ``recv`` that steps with it (the same results either way)."""
    if callable(getattr(env, "step_async", None)) and callable(getattr(env, "step_wait", None)):
        return env.step_async, env.step_wait
    pending: list[torch.Tensor] = []

    def send(action: torch.Tensor) -> None:
        pending.append(action)

    def recv() -> StepResult:
        return env.step(pending.pop())

    return send, recv


class TorchVecEnv:
    """Base class: subclasses define the physics as pure batched functions of a state tensor.

    Subclasses set ``obs_dim, act_dim, discrete, state_dim, default_max_episode_steps`` (and
    ``action_low/action_high`` for continuous actions) and implement ``initial_state``,
    ``dynamics`` and ``observe``. Everything here is a tensor op over all environments.
    """

    obs_dim: int
    act_dim: int
    discrete: bool
    state_dim: int
    default_max_episode_steps: int
    num_actions: int = 0  # discrete only: number of choices
    action_low: float = -1.0
    action_high: float = 1.0

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_episode_steps = int(max_episode_steps) or self.default_max_episode_steps
        self.seed = seed
        self.rng = BatchRNG(seed, self.num_envs, self.device)
        n = self.num_envs
        self.state = torch.zeros(n, self.state_dim, dtype=dtype, device=self.device)
        self.t = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.ep_return = torch.zeros(n, dtype=torch.float64, device=self.device)
        self._compiled_step = None
        self._cuda_graphs = False

    # --- physics, implemented by subclasses -------------------------------------------
    def initial_state(self, u: torch.Tensor) -> torch.Tensor:
        """Map uniforms ``[N, state_dim]`` in [0, 1) to start states ``[N, state_dim]``."""
        raise NotImplementedError

    def dynamics(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (next_state, reward[N], terminated[N] bool)."""
        raise NotImplementedError

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        """Observation ``[N, obs_dim]`` of a state."""
        raise NotImplementedError

    # --- the protocol ----------------------------------------------------------------
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a new episode in every environment; a seed restarts every stream."""
        if seed is not None:
            self.seed = seed
            self.rng = BatchRNG(seed, self.num_envs, self.device)
        self.state = self.initial_state(self.rng.uniform(self.state_dim, dtype=self.dtype))
        self.t.zero_()
        self.ep_return.zero_()
        return self.observe(self.state)

    def step(self, action: torch.Tensor):
        if self._compiled_step is not None:
            out = self._compiled_step(self.state, self.t, self.ep_return, self.rng.key, self.rng.counter, action)
            if self._cuda_graphs:
                # CUDA graphs (reduce-overhead) reuse their output buffers on the next replay: the
                # env keeps its state across steps and the caller keeps obs/info, so copy them out.
                out = tuple(x.clone() for x in out)
            return self._apply(out)
        next_state, reward, terminated = self.dynamics(self.state, action)
        t = self.t + 1
        if self.device.type == "cpu":
            # Fast path where checking on the host is free (CPU): nobody finished, so the
            # restart draw and the second observation are skipped; results are identical.
            truncated = (t >= self.max_episode_steps) & ~terminated
            done = terminated | truncated
            if not bool(done.any()):
                obs = self.observe(next_state)
                ep_return = self.ep_return + reward.to(torch.float64)
                self.state, self.t, self.ep_return = next_state, t, ep_return
                info = {"final_obs": obs, "done": done, "episode_return": ep_return, "episode_length": t}
                return obs, reward, terminated, truncated, info
        return self._apply(
            self._finish(next_state, reward, terminated, t, self.ep_return, self.rng.key, self.rng.counter)
        )

    def pure_step(self, state, t, ep_return, key, counter, action):
        """The whole step as a pure function of the env's tensors (what ``compile`` compiles)."""
        next_state, reward, terminated = self.dynamics(state, action)
        return self._finish(next_state, reward, terminated, t + 1, ep_return, key, counter)

    def _finish(self, next_state, reward, terminated, t, ep_return, key, counter):
        """Clocks, episode totals and auto-reset after the physics, branch-free (no host sync).

        Every env computes a candidate restart; only finished envs consume randomness.
        """
        truncated = (t >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        final_obs = self.observe(next_state)
        ep_ret = ep_return + reward.to(torch.float64)
        u, counter = draw(key, counter, self.state_dim, done, self.dtype)
        new_state = torch.where(done[:, None], self.initial_state(u), next_state)
        new_t = torch.where(done, 0, t)
        new_ep_return = torch.where(done, 0.0, ep_ret)
        obs = self.observe(new_state)
        return (
            new_state,
            new_t,
            new_ep_return,
            counter,
            obs,
            reward,
            terminated,
            truncated,
            final_obs,
            done,
            ep_ret,
            t,
        )

    def _apply(self, out):
        (
            self.state,
            self.t,
            self.ep_return,
            self.rng.counter,
            obs,
            reward,
            terminated,
            truncated,
            final_obs,
            done,
            ep_ret,
            t,
        ) = out
        info = {"final_obs": final_obs, "done": done, "episode_return": ep_ret, "episode_length": t}
        return obs, reward, terminated, truncated, info

    def compile(self, mode: str | None = None) -> "TorchVecEnv":
        """Compile ``pure_step`` with torch.compile (on CUDA, mode="reduce-overhead" adds CUDA graphs)."""
        compiled = torch.compile(self.pure_step, mode=mode, fullgraph=True, dynamic=False)
        self._cuda_graphs = self.device.type == "cuda" and mode in ("reduce-overhead", "max-autotune")

        def step(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            if self._cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs are ours now
            return compiled(*args)

        self._compiled_step = step
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything needed to continue exactly: physics state, clocks, RNG streams."""
        return {
            "state": self.state.clone(memory_format=torch.contiguous_format),
            "t": self.t.clone(),
            "ep_return": self.ep_return.clone(),
            **{f"rng.{k}": v for k, v in self.rng.state_dict().items()},
        }

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        if sd["state"].shape != self.state.shape:
            raise ValueError(
                f"env state has shape {tuple(sd['state'].shape)}, expected {tuple(self.state.shape)} "
                "(was num_envs changed since the checkpoint?)"
            )
        self.state = sd["state"].to(self.device, self.dtype).clone()
        self.t = sd["t"].to(self.device).clone()
        self.ep_return = sd["ep_return"].to(self.device).clone()
        self.rng.load_state_dict({"key": sd["rng.key"], "counter": sd["rng.counter"]})
