"""Batched environments (the VecEnv protocol) and the task registry."""

from __future__ import annotations

import torch

from .base import TorchVecEnv, VecEnv
from .cartpole import CartPole
from .pendulum import Pendulum

TASKS: dict[str, type[TorchVecEnv]] = {"pendulum": Pendulum, "cartpole": CartPole}
TASKS["stock_trading"] = __import__("podracer_hpc.trading.env", fromlist=["StockTradingEnv"]).StockTradingEnv
TASKS.update(__import__("podracer_hpc.envs.mujoco", fromlist=["MUJOCO_TASKS"]).MUJOCO_TASKS)  # ant, humanoid, ...


def make_env(
    name: str,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    max_episode_steps: int = 0,
    dtype: torch.dtype = torch.float32,
    **options: object,
) -> VecEnv:
    """Build a batched environment of task ``name`` on ``device`` (``options``: task settings)."""
    try:
        cls = TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}") from None
    return cls(num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps, dtype=dtype, **options)


__all__ = ["TASKS", "VecEnv", "TorchVecEnv", "make_env", "Pendulum", "CartPole"]
