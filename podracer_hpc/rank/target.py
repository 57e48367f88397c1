"""The run's target return (``eval.stop_at_return``): where this pod first reached it, and where it
stops because a pod of the run did.

A pod whose evaluation reaches the target announces a stop notice that carries its env steps
(``Comm.announce_stop(value)``). A rank that hears a notice with env steps trains on to them and
stops there: its evaluations on the way still happen, so no pod that would reach the target at
fewer env steps is cut short, and the run's first crossing is the one an uninterrupted run has. A
round due where it would stop is held first, so the pods of a collective pool meet at the same
rounds whenever the notice arrives. A notice without env steps (0) is a plain stop (a signal,
``--stop-after-updates``), which :meth:`Target.poll` reports as such. Nothing here imports torch,
h5py or MPI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Target"]


@dataclass
class Target:
    """One pod's side of the run's target return."""

    value: float | None = None  # eval.stop_at_return (None: the budget ends the run)
    reached: int = 0  # env steps of this pod's first evaluation at or above it (0: none)
    at: int | None = None  # where this pod stops for it: its own crossing, or a notice's
    stopped: bool = False  # this pod stopped there

    def resume(self, reached: int, reached_for: float | None, comm: Any) -> None:
        """A checkpoint's crossing (``reached`` for target ``reached_for``): the others hear it
        again; one for another target is forgotten (the evaluations from here on decide)."""
        if self.value is not None and reached and reached_for == self.value:
            self.reach(reached, comm)

    def evaluated(self, mean: float, env_steps: int, comm: Any) -> None:
        """After an evaluation of mean return ``mean`` at ``env_steps``."""
        if self.value is not None and not self.reached and mean >= self.value:
            self.reach(env_steps, comm)

    def reach(self, env_steps: int, comm: Any) -> None:
        """This pod reached the target at ``env_steps``: it stops there and tells the others."""
        self.reached = env_steps
        self.at = min(env_steps, self.at or env_steps)
        comm.announce_stop(env_steps)

    def poll(self, comm: Any, env_steps: int, round_due: bool) -> str:
        """Between updates: ``"target"`` when this pod stops for the target now, ``"stop"`` when
        another rank's notice is a plain stop, else ``""`` (train on)."""
        if self.at is None and comm.stop_announced():
            if not comm.notice_value or self.value is None:
                return "stop"
            self.at = comm.notice_value
        self.stopped = self.at is not None and env_steps >= self.at and not round_due
        return "target" if self.stopped else ""
