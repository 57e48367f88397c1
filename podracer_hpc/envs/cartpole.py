"""CartPole-v1 (gymnasium's Euler dynamics, reward and termination) as batched torch ops.

Action: ``[N]`` or ``[N, 1]`` integers in {0, 1} (push left / right). Reward 1 on every step,
including the one that ends the episode. Terminated when |x| > 2.4 or |theta| > 12 degrees;
500-step time limit (truncation).
"""

from __future__ import annotations

import math

import torch

from .base import TorchVecEnv
from .registry import Task, register


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

    def initial_state(self, u: torch.Tensor) -> torch.Tensor:
        return 0.1 * u - 0.05

    def dynamics(self, state, action):
        x, x_dot, theta, theta_dot = state.unbind(1)
        force = torch.where(action.reshape(-1) == 1, self.force_mag, -self.force_mag).to(state.dtype)
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = (force + self.polemass_length * theta_dot**2 * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta**2 / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        terminated = (x.abs() > self.x_threshold) | (theta.abs() > self.theta_threshold_radians)
        reward = torch.ones_like(x)
        return torch.stack((x, x_dot, theta, theta_dot), dim=1), reward, terminated

    def observe(self, state):
        return state.clone()


register(Task("cartpole", build=CartPole, discrete=True, doc="CartPole-v1: balance a pole on a cart (push left or right)"))
