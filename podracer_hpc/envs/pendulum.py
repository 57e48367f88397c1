"""Pendulum-v1 (gymnasium's dynamics and reward) as batched torch ops.

Action: torque in [-2, 2] (clipped), shape ``[N, 1]``. Observation: ``[cos th, sin th, thdot]``.
Reward: ``-(angle_normalize(th)^2 + 0.1 thdot^2 + 0.001 u^2)``. 200-step time limit (truncation).
"""

from __future__ import annotations

import math

import torch

from podracer_hpc.envs.base import TorchVecEnv


class Pendulum(TorchVecEnv):
    obs_dim = 3
    act_dim = 1
    discrete = False
    state_dim = 2
    default_max_episode_steps = 200
    action_low = -2.0
    action_high = 2.0

    max_speed = 8.0
    max_torque = 2.0
    dt = 0.05
    g = 10.0
    m = 1.0
    l = 1.0

    def initial_state(self, u: torch.Tensor) -> torch.Tensor:
        high = torch.tensor([math.pi, 1.0], dtype=u.dtype, device=u.device)
        return (2.0 * u - 1.0) * high

    def dynamics(self, state, action):
        th, thdot = state[:, 0], state[:, 1]
        u = action.reshape(-1).to(state.dtype).clamp(-self.max_torque, self.max_torque)
        th_norm = torch.remainder(th + math.pi, 2 * math.pi) - math.pi
        costs = th_norm**2 + 0.1 * thdot**2 + 0.001 * u**2
        newthdot = thdot + (3 * self.g / (2 * self.l) * torch.sin(th) + 3.0 / (self.m * self.l**2) * u) * self.dt
        newthdot = newthdot.clamp(-self.max_speed, self.max_speed)
        newth = th + newthdot * self.dt
        terminated = torch.zeros_like(th, dtype=torch.bool)
        return torch.stack((newth, newthdot), dim=1), -costs, terminated

    def observe(self, state):
        th = state[:, 0]
        return torch.stack((torch.cos(th), torch.sin(th), state[:, 1]), dim=1)
