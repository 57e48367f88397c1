"""The classic-control tasks, declared (Pendulum, CartPole): names, docs and where their env classes
live, imported when a pod builds one. This module imports no torch (the registry reads it for
``podracer config`` and ``podracer submit --dry-run``)."""

from __future__ import annotations

from podracer_hpc.envs.registry import Lazy, Task, register

register(
    Task(
        "pendulum",
        build=Lazy("podracer_hpc.envs.pendulum", "Pendulum"),
        doc="Pendulum-v1: swing up and balance a pendulum (continuous torque)",
    )
)
register(
    Task(
        "cartpole",
        build=Lazy("podracer_hpc.envs.cartpole", "CartPole"),
        discrete=True,
        doc="CartPole-v1: balance a pole on a cart (push left or right)",
    )
)
