"""CartPole-v1 (gymnasium's Euler dynamics, reward and termination) as batched torch ops.

Action: ``[N]`` or ``[N, 1]`` integers in {0, 1} (push left / right). Reward 1 on every step,
including the one that ends the episode. Terminated when |x| > 2.4 or |theta| > 12 degrees;
500-step time limit (truncation).

On the CPU (eager) the step is written for the per-op overhead that dominates at thousands of
envs: the state lives as one ``[4, N]`` buffer (rows x, x_dot, theta, theta_dot, each
contiguous) updated in place through views made once; the physics is 12 fused torch ops
(``addcmul``, ``add(alpha=)``, ``out=``) into preallocated scratch; the ``[N, 4]`` observation
is one gather; the exact bookkeeping (thresholds, clocks, flags, restarts) runs in numpy on the
same memory (half torch's per-call cost at these sizes); and only the envs that finished draw
their restart (``rng.draw_rows``: the same numbers the branch-free path draws, their streams'
next four). ``env.state`` is the ``[N, 4]`` view of that buffer. CUDA and ``compile`` take the branch-free
``TorchVecEnv`` path through
:meth:`CartPole.dynamics` (the same formulas: tests/envs/test_base.py checks the two bit for bit).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from podracer_hpc.envs.base import TorchVecEnv
from podracer_hpc.envs.rng import draw_rows


class CartPole(TorchVecEnv):
    obs_dim = 4
    act_dim = 1
    discrete = True
    num_actions = 2
    state_dim = 4
    default_max_episode_steps = 500

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        self._soa: torch.Tensor | None = None
        # the CPU step below (numpy views of its tensors: not for bfloat16); else TorchVecEnv's
        self._cpu_step = torch.device(device).type == "cpu" and dtype in (torch.float32, torch.float64, torch.float16)
        super().__init__(num_envs, device, seed, max_episode_steps, dtype)
        n, dev = self.num_envs, self.device
        # force / total_mass by action; the denominator's constant; the thresholds of (x, theta)
        self._force = torch.tensor([-1.0, 1.0], dtype=dtype, device=dev) * (self.force_mag / self.total_mass)
        self._den0 = torch.tensor(self.length * 4.0 / 3.0, dtype=dtype, device=dev)
        self._limits = torch.tensor([[self.x_threshold], [self.theta_threshold_radians]], dtype=dtype, device=dev)
        # scratch for the CPU step: sin, cos, temp, numerator, denominator, xacc, thetaacc
        self._scratch = torch.empty(7, n, dtype=dtype, device=dev)
        self._sin, self._cos, self._temp, self._num, self._den, self._xacc, self._thetaacc = self._scratch.unbind(0)
        self._acc = self._scratch[5:]  # (xacc, thetaacc): the rates of (x_dot, theta_dot)
        if self._cpu_step:  # numpy scratch for the CPU step's bookkeeping: |x, theta|, over the limits
            self._np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            self._np_scratch = (np.empty((2, n), self._np_dtype), np.empty((2, n), np.bool_))
            self._limits_np = self._limits.numpy()
        # [4, N] -> [N, 4] as one gather (a strided copy with an inner size of 4 is 3x slower)
        self._to_rows = torch.arange(4 * n, device=dev).view(4, n).T.reshape(-1)

    # ``state`` is the [N, 4] view of the [4, N] buffer the CPU step updates in place
    @property
    def state(self) -> torch.Tensor:
        return self._soa.T

    @state.setter
    def state(self, value: torch.Tensor) -> None:
        s = torch.empty(tuple(value.T.shape), dtype=self.dtype, device=self.device)
        self._soa = s.copy_(value.T)  # always a copy: the step writes into it
        self._rows = s.unbind(0)  # x, x_dot, theta, theta_dot, each contiguous
        self._even, self._odd = s[0::2], s[1::2]  # (x, theta) and their rates (x_dot, theta_dot)
        self._flat = s.view(-1)
        if self._cpu_step:
            self._even_np = self._even.numpy()

    def initial_state(self, u: torch.Tensor) -> torch.Tensor:
        return 0.1 * u - 0.05

    def dynamics(self, state, action):
        """Pure form of the physics (the CUDA / compile path); the CPU step runs the same formulas."""
        x, x_dot, theta, theta_dot = state.unbind(1)
        force = self._force.to(state.device, state.dtype).take(action.reshape(-1).long())
        sin, cos = torch.sin(theta), torch.cos(theta)
        temp = torch.addcmul(force, theta_dot * theta_dot, sin, value=self.polemass_length / self.total_mass)
        num = torch.addcmul(sin * self.gravity, cos, temp, value=-1.0)
        den = torch.addcmul(
            self._den0.to(state.device, state.dtype), cos, cos, value=-self.length * self.masspole / self.total_mass
        )
        thetaacc = num / den
        xacc = torch.addcmul(temp, thetaacc, cos, value=-self.polemass_length / self.total_mass)
        tau = self.tau
        x, theta = torch.add(x, x_dot, alpha=tau), torch.add(theta, theta_dot, alpha=tau)
        nxt = torch.stack((x, torch.add(x_dot, xacc, alpha=tau), theta, torch.add(theta_dot, thetaacc, alpha=tau)), 1)
        terminated = (x.abs() > self.x_threshold) | (theta.abs() > self.theta_threshold_radians)
        return nxt, torch.ones_like(x), terminated

    def observe(self, state):
        return state.clone()

    def step(self, action: torch.Tensor):
        """One step of every env (the protocol's ``step``); see the module docstring for the CPU path."""
        if self._compiled_step is not None or not self._cpu_step:
            return super().step(action)
        if action.dim() != 1:
            action = action.reshape(-1)
        if action.dtype != torch.int64:
            action = action.long()
        theta, theta_dot = self._rows[2], self._rows[3]
        sin, cos, temp, num, den = self._sin, self._cos, self._temp, self._num, self._den
        # the physics from the old state into scratch (same formulas as ``dynamics``), then the
        # state in place: (x, theta) += tau * (x_dot, theta_dot); (x_dot, theta_dot) += tau * acc
        torch.index_select(self._force, 0, action, out=temp)
        torch.sin(theta, out=sin)
        torch.cos(theta, out=cos)
        torch.mul(theta_dot, theta_dot, out=num)
        temp.addcmul_(num, sin, value=self.polemass_length / self.total_mass)
        torch.mul(sin, self.gravity, out=num)
        num.addcmul_(cos, temp, value=-1.0)
        torch.addcmul(self._den0, cos, cos, value=-self.length * self.masspole / self.total_mass, out=den)
        torch.div(num, den, out=self._thetaacc)
        torch.addcmul(temp, self._thetaacc, cos, value=-self.polemass_length / self.total_mass, out=self._xacc)
        self._even.add_(self._odd, alpha=self.tau)
        self._odd.add_(self._acc, alpha=self.tau)
        # clocks, episode totals and restarts: integer and boolean bookkeeping, in numpy on the
        # tensors' memory (half torch's per-call cost at these sizes; exact either way). Every
        # returned tensor is fresh: the caller may keep it.
        pos_abs, over = self._np_scratch
        np.abs(self._even_np, out=pos_abs)
        np.greater(pos_abs, self._limits_np, out=over)
        term = over[0] | over[1]  # |x| > 2.4 or |theta| > 12 degrees
        t = self.t.numpy() + 1
        ep_ret = self.ep_return.numpy() + 1.0
        done = (t >= self.max_episode_steps) | term
        truncated = done ^ term  # time up and not terminated
        reward = torch.from_numpy(np.ones(self.num_envs, dtype=self._np_dtype))
        final_obs = obs = self._flat.index_select(0, self._to_rows).view(self.num_envs, 4)
        rows = np.flatnonzero(done)
        if len(rows):
            idx = torch.from_numpy(rows)
            fresh = self.initial_state(draw_rows(self.rng.key, self.rng.counter, idx, 4, self.dtype)).numpy()
            self._soa.numpy()[:, rows] = fresh.T
            obs = final_obs.clone()
            obs.numpy()[rows] = fresh
            new_t, new_ep = t.copy(), ep_ret.copy()
            new_t[rows] = 0
            new_ep[rows] = 0.0
            self.t, self.ep_return = torch.from_numpy(new_t), torch.from_numpy(new_ep)
        else:
            self.t, self.ep_return = torch.from_numpy(t), torch.from_numpy(ep_ret)
        t, ep_ret = torch.from_numpy(t), torch.from_numpy(ep_ret)
        info = {"final_obs": final_obs, "done": torch.from_numpy(done), "episode_return": ep_ret, "episode_length": t}
        return obs, reward, torch.from_numpy(term), torch.from_numpy(truncated), info
