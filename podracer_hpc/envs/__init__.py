"""Batched environments (the VecEnv protocol) and the task registry (:mod:`.registry`).

Importing this package imports no torch: the registry and the tasks' declarations are read by
``podracer config`` and ``podracer submit --dry-run``; the env classes (``Pendulum``,
``CartPole``, ``TorchVecEnv``, ``VecEnv``) load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from podracer_hpc.envs import registry
from podracer_hpc.envs.registry import build_env

# {name: env builder}: a live view of the registry (tasks declare themselves, see registry.py)
TASKS = registry.TaskTable()

_LAZY = {"TorchVecEnv": ".base", "VecEnv": ".base", "CartPole": ".cartpole", "Pendulum": ".pendulum"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_env(
    name: str,
    num_envs: int,
    device: Any = "cpu",
    seed: int = 0,
    max_episode_steps: int = 0,
    dtype: Any = None,
    **options: object,
) -> Any:
    """Build a batched environment of task ``name`` on ``device`` (``options``: task settings;
    ``dtype`` default float32).

    A pod builds its env from its config instead (:func:`build_env`, the task's option section).
    """
    import torch

    task = registry.get(name)  # ValueError listing the known tasks
    return task.build(
        num_envs,
        device=device,
        seed=seed,
        max_episode_steps=max_episode_steps,
        dtype=torch.float32 if dtype is None else dtype,
        **options,
    )


__all__ = ["TASKS", "VecEnv", "TorchVecEnv", "make_env", "build_env", "registry", "Pendulum", "CartPole"]
