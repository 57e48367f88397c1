"""Batched environments (the VecEnv protocol) and the task registry (:mod:`.registry`)."""

from __future__ import annotations

import torch

from . import registry
from .base import TorchVecEnv, VecEnv
from .cartpole import CartPole
from .pendulum import Pendulum
from .registry import build_env

# {name: env builder}: a live view of the registry (tasks register themselves, see registry.py)
TASKS = registry.TaskTable()


def make_env(
    name: str,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    max_episode_steps: int = 0,
    dtype: torch.dtype = torch.float32,
    **options: object,
) -> VecEnv:
    """Build a batched environment of task ``name`` on ``device`` (``options``: task settings).

    A pod builds its env from its config instead (:func:`build_env`, the task's option section).
    """
    task = registry.get(name)  # ValueError listing the known tasks
    return task.build(num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps, dtype=dtype, **options)


__all__ = ["TASKS", "VecEnv", "TorchVecEnv", "make_env", "build_env", "registry", "Pendulum", "CartPole"]
