"""``reach``: the task of docs/adding-a-task.md, a whole task in one file.

A point on a line, ``x`` in [-1, 1], moves by ``speed x action`` each step towards ``target``;
the reward is ``-|x - target|``, the observation ``[x, target]``, 20 steps an episode. Its
settings are the config section ``env.reach`` (``target``, ``speed``).

tests/envs/test_registry.py adds it with the one line a built-in task takes (its module path in
``podracer_hpc.envs.registry.TASK_MODULES``) and trains it through the real Pod and ``train``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from podracer_hpc.docfield import F
from podracer_hpc.envs.base import TorchVecEnv
from podracer_hpc.envs.registry import OptionError, Task, options_from, register


@dataclass
class ReachOptions:
    """reach settings (where the target is, how far a step goes)."""

    target: float = F(0.5, "position to reach, in [-1, 1]")
    speed: float = F(0.2, "distance moved by a step at action +-1 (> 0)")

    def check(self) -> None:
        """Raise OptionError for a target off the line or a speed that does not move."""
        if not -1.0 <= self.target <= 1.0:
            raise OptionError("target", f"must be in [-1, 1], got {self.target}")
        if not self.speed > 0:
            raise OptionError("speed", f"must be > 0, got {self.speed}")


class Reach(TorchVecEnv):
    """The batched env (physics as tensor ops over all environments, as TorchVecEnv asks)."""

    obs_dim = 2
    act_dim = 1
    discrete = False
    state_dim = 1
    default_max_episode_steps = 20
    action_low = -1.0
    action_high = 1.0

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        dtype: torch.dtype = torch.float32,
        **options: Any,
    ):
        o = options_from(ReachOptions, options, "reach")  # the defaults and checks of ReachOptions
        self.target, self.speed = float(o.target), float(o.speed)
        super().__init__(num_envs, device, seed, max_episode_steps, dtype)

    def initial_state(self, u: torch.Tensor) -> torch.Tensor:
        return 2.0 * u - 1.0

    def dynamics(self, state: torch.Tensor, action: torch.Tensor):
        a = action.reshape(-1, 1).to(state.dtype).clamp(-1.0, 1.0)
        x = (state + self.speed * a).clamp(-1.0, 1.0)
        reward = -(x[:, 0] - self.target).abs()
        return x, reward, torch.zeros_like(reward, dtype=torch.bool)

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        return torch.cat([state, torch.full_like(state, self.target)], 1)


register(Task("reach", build=Reach, options=ReachOptions, section="reach", doc="move a point to a target (tests)"))
