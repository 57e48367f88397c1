"""The run directory: the one module that knows its layout, the job's identity and exit codes.

``--run-dir`` (default ``runs/<name>``)::

    config.yaml                       the resolved config (rank 0, at the first start)
    summary.json                      the final summary (rank 0), also the last line of stdout
    logs/<name>_rank<r>.h5            rank r's HDF5 log (h5log.py)
    checkpoints/rank<r>.safetensors   rank r's pod state (+ .prev, the one before)
    leaderboard/                      the default leaderboard (tournament.leaderboard_dir overrides)
    rounds/<i>.json                   the leaderboard listing round i decided on (exact redo)
    slurm/<job id>/                   submitit's per-task stdout/stderr

Nothing here imports torch, h5py or MPI.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "EXIT_REQUEUE", "RunDir", "job_id"]

EXIT_OK = 0
EXIT_BAD_INPUT = 2  # config, checkpoint, log or run directory is wrong; the message says what to do
EXIT_REQUEUE = 75  # EX_TEMPFAIL: stopped early with every rank checkpointed; run again to resume


def job_id(environ: dict[str, str] | None = None) -> str:
    """``<array job>_<task>`` for an array task, the Slurm job id, else ``local``."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_ARRAY_JOB_ID", env.get("SLURM_JOB_ID", "local"))
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_JOB_ID" in env:
        job += f"_{env['SLURM_ARRAY_TASK_ID']}"
    return job


class RunDir:
    """Paths of one run directory (nothing is created by constructing it)."""

    def __init__(self, root: str | os.PathLike, name: str):
        self.root = Path(root)
        self.name = name

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def log(self, rank: int) -> Path:
        return self.logs_dir / f"{self.name}_rank{rank}.h5"

    def rank_logs(self) -> list[Path]:
        """The rank logs present, in rank order."""
        found = [(p, p.stem.rsplit("_rank", 1)) for p in self.logs_dir.glob("*_rank*.h5")]
        return [p for p, parts in sorted(found, key=lambda x: (x[1][0], int(x[1][1]) if x[1][1].isdigit() else -1))
                if len(parts) == 2 and parts[1].isdigit()]

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, rank: int) -> Path:
        return self.checkpoints_dir / f"rank{rank}.safetensors"

    def checkpoint_ranks(self) -> list[int]:
        """Ranks that have a checkpoint (or its .prev) here."""
        ranks = set()
        for p in self.checkpoints_dir.glob("rank*"):
            head = p.name.split(".", 1)[0][4:]
            if head.isdigit() and p.name.endswith((".safetensors", ".prev")):
                ranks.add(int(head))
        return sorted(ranks)

    def leaderboard(self, shared_dir: str = "") -> Path:
        """The leaderboard directory: ``shared_dir`` if given, else ``<run>/leaderboard``."""
        return Path(shared_dir) if shared_dir else self.root / "leaderboard"

    def round_listing(self, index: int) -> Path:
        return self.root / "rounds" / f"{index}.json"
