"""Pendulum-v1 as a functional JAX env: the example of the ``jax`` task's protocol (:mod:`.jax_adapter`).

The dynamics, reward and start distribution of :mod:`.pendulum` (gymnasium's), written for one
env in ``jax.numpy`` the way MuJoCo Playground and Brax envs are: ``reset(rng) -> State``,
``step(state, action) -> State``, ``observation_size``, ``action_size``. It also declares the
protocol's optional ``action_low`` / ``action_high`` (torque in [-2, 2]) and
``max_episode_steps`` (200). Train it with::

    podracer train jobs/pendulum.yaml --set env.name=jax --set env.jax.factory=podracer_hpc.envs.jax_pendulum:make

Its state is a NamedTuple (a pytree); ``data`` holds ``[theta, theta_dot]``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class State(NamedTuple):
    """One env's state, with the fields of MuJoCo Playground's ``mjx_env.State``."""

    data: jax.Array  # [theta, theta_dot]
    obs: jax.Array
    reward: jax.Array
    done: jax.Array
    metrics: dict
    info: dict


class Pendulum:
    """Swing up and balance a pendulum (gymnasium's Pendulum-v1) for one env, in jax.numpy."""

    observation_size = 3
    action_size = 1
    action_low, action_high = -2.0, 2.0
    max_episode_steps = 200
    max_speed, max_torque, dt, g, m, l = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0

    def observe(self, data: jax.Array) -> jax.Array:
        """``[cos theta, sin theta, theta_dot]``."""
        return jnp.stack((jnp.cos(data[0]), jnp.sin(data[0]), data[1]))

    def state_at(self, data: jax.Array) -> State:
        """The state at ``data = [theta, theta_dot]`` (a fresh episode's reward and done)."""
        data = jnp.asarray(data, jnp.float32)
        return State(data, self.observe(data), jnp.float32(0.0), jnp.float32(0.0), {}, {})

    def reset(self, rng: jax.Array) -> State:
        """A start state: theta uniform in [-pi, pi), theta_dot uniform in [-1, 1)."""
        u = jax.random.uniform(rng, (2,), jnp.float32)
        return self.state_at((2.0 * u - 1.0) * jnp.array([math.pi, 1.0], jnp.float32))

    def step(self, state: State, action: jax.Array) -> State:
        """One 0.05 s step under torque ``action[0]`` (clipped to [-2, 2]); never terminates."""
        th, thdot = state.data[0], state.data[1]
        u = jnp.clip(action.reshape(-1)[0], -self.max_torque, self.max_torque)
        th_norm = jnp.remainder(th + math.pi, 2 * math.pi) - math.pi
        costs = th_norm**2 + 0.1 * thdot**2 + 0.001 * u**2
        newthdot = thdot + (3 * self.g / (2 * self.l) * jnp.sin(th) + 3.0 / (self.m * self.l**2) * u) * self.dt
        newthdot = jnp.clip(newthdot, -self.max_speed, self.max_speed)
        data = jnp.stack((th + newthdot * self.dt, newthdot))
        return state._replace(data=data, obs=self.observe(data), reward=-costs, done=jnp.float32(0.0))


def make(**kwargs: Any) -> Pendulum:
    """The factory of ``env.jax.factory: podracer_hpc.envs.jax_pendulum:make`` (it takes no arguments)."""
    if kwargs:
        raise TypeError(f"jax_pendulum.make takes no arguments, got {', '.join(sorted(kwargs))}")
    return Pendulum()
