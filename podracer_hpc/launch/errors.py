"""The launcher's errors: a request that cannot be right, a cluster that does not answer, a job
that did not complete its training."""

from __future__ import annotations

__all__ = ["JobError", "LaunchError", "SlurmUnreachable"]


class LaunchError(ValueError):
    """A request that cannot be right, or a job that failed; the message says which and why."""


class SlurmUnreachable(LaunchError):
    """Slurm's commands are here but do not answer (no slurm.conf, slurmctld down)."""


class JobError(LaunchError):
    """The job ran (or was queued) but did not complete its training; ``exit_code`` for the CLI."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
