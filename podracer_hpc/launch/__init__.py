"""Launching jobs: Slurm through submitit, or this machine through mpiexec. The only package that
imports submitit (in :mod:`.slurm`).

``podracer submit JOB.yaml`` validates everything it can before anything is queued (the job
file, the resource request, the partition as ``sinfo`` knows it), then starts the job's ranks:

- ``slurm``: one submitit job (or job array) whose tasks are the pods of one MPI world; each
  task runs from a code snapshot in the run directory (:mod:`.snapshot`);
- ``local``: ``mpiexec -n <ranks> podracer train ...`` on this machine, no cluster needed.

The parts, one job each: :mod:`.request` (every option of ``podracer submit`` declared once, with
its doc, its check and its sbatch option; the argparse, the checks, the sbatch parameters and the
dry-run derive from it), :mod:`.checks` (``validate``), :mod:`.snapshot` (the code a job runs), :mod:`.slurm` (submitit, the
rank task, sbatch, Slurm's job states), :mod:`.local` (mpiexec here), :mod:`.watch` (progress and
an end that is never a hang). ``--dry-run`` needs no Slurm: without ``sbatch``/``sinfo`` the
request is checked as far as it can be here and the script is printed.
"""

from __future__ import annotations

from pathlib import Path

from typing import Any

from ..config import Config, ConfigError
from ..jobstate import SlurmJobState, slurm_job_state, slurm_job_states
from . import local
from .checks import validate
from .errors import JobError, LaunchError, SlurmUnreachable
from .local import find_mpiexec, start_command
from .request import (ACTIONS, Request, add_arguments, from_args, own_sbatch, parse_array, parse_sbatch, run_dir_for,
                      slurm_minutes, task_overrides)
from .snapshot import Snapshot, make_snapshot, plan_snapshot
from .watch import ACTIVE_STATES, Job, Launched, progress_line, read_summary, summary_signature, wait

# From .slurm, which imports submitit: loaded on first use, so that `podracer --help`, `podracer
# config` and a local submit do not pay for it.
_SLURM_NAMES = ("RankProgram", "launch_line", "sbatch_text", "slurm_here")
_LAZY = {n: "slurm" for n in _SLURM_NAMES}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["ACTIONS", "ACTIVE_STATES", "ConfigError", "Job", "JobError", "Launched", "LaunchError", "RankProgram",
           "Request", "Snapshot", "SlurmJobState", "SlurmUnreachable", "add_arguments", "find_mpiexec", "from_args",
           "launch_line", "make_snapshot", "own_sbatch", "parse_array", "parse_sbatch", "plan_snapshot",
           "progress_line", "read_summary", "run_dir_for", "sbatch_text", "slurm_job_state", "slurm_job_states",
           "slurm_minutes", "start_command", "submit_local", "submit_slurm", "summary_signature", "task_overrides",
           "validate", "wait"]


def submit_slurm(req: Request, cfg: Config) -> Launched:
    """Submit the request's job (or array) to Slurm; returns what to watch."""
    import importlib

    jobs, dirs, snap, stale = importlib.import_module(f"{__name__}.slurm").submit(req, cfg)
    handles = [Job(str(j.job_id), Path(str(j.paths.stderr))) for j in jobs]
    return Launched("slurm", dirs, jobs=handles, logs=[h.log for h in handles], stale_summaries=stale, snapshot=snap)


def submit_local(req: Request, cfg: Config) -> Launched:
    """Start the request's ranks on this machine (array tasks up to %P at a time)."""
    return local.submit(req, cfg)
