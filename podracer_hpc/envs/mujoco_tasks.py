"""The MuJoCo locomotion tasks, declared: names, the shared ``env.mujoco`` options and where their
env classes live (envs/mujoco.py, imported when a pod builds one). This module imports no torch
and no MuJoCo (the registry reads it for ``podracer config`` and ``podracer submit --dry-run``)."""

from __future__ import annotations

from dataclasses import dataclass

from podracer_hpc.docfield import F
from podracer_hpc.envs.registry import Lazy, OptionError, Task, register

__all__ = ["BACKENDS", "GYM_IDS", "MujocoOptions"]

GYM_IDS: dict[str, str] = {
    "halfcheetah": "HalfCheetah-v5",
    "hopper": "Hopper-v5",
    "walker2d": "Walker2d-v5",
    "ant": "Ant-v5",
    "humanoid": "Humanoid-v5",
}
BACKENDS = ("auto", "envpool", "gymnasium", "warp")


@dataclass
class MujocoOptions:
    """MuJoCo task settings (simulator backend).

    The config section ``env.mujoco``, shared by ant, humanoid, halfcheetah, hopper and walker2d."""

    backend: str = F(
        "auto",
        "auto | envpool | gymnasium | warp (auto: warp on a CUDA device if mujoco-warp is "
        "installed, else envpool if installed, else gymnasium)",
    )
    num_threads: int = F(0, "envpool worker threads; 0 = envpool's default")

    def check(self) -> None:
        """Raise OptionError for a backend that does not exist or a negative thread count."""
        if self.backend not in BACKENDS:
            raise OptionError("backend", f"must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.num_threads < 0:
            raise OptionError("num_threads", f"must be >= 0 (0 = envpool's default), got {self.num_threads}")


for _name, _gym_id in GYM_IDS.items():
    register(
        Task(
            _name,
            build=Lazy("podracer_hpc.envs.mujoco", "MUJOCO_TASKS", _name),
            options=MujocoOptions,
            section="mujoco",
            doc=f"MuJoCo {_gym_id}",
        )
    )
