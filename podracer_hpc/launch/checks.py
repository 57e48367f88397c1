"""``validate``: everything about a request that can be checked before anything is queued: the
job file and its overrides, each option's own check, the options together, and (for Slurm) the
cluster as sinfo and srun describe it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from podracer_hpc.config import Config, job_file, load_config
from podracer_hpc.launch.errors import LaunchError
from podracer_hpc.launch.request import Request, check_fields, parse_sbatch, parse_srun, run_dir_for

__all__ = ["check_run_dir", "validate"]


def validate(req: Request, dry_run: bool = False) -> Config:
    """Check the request and the job file; raises LaunchError/ConfigError before anything is queued.

    ``dry_run``: nothing will be submitted, so Slurm need not be installed: what needs ``sinfo``
    or ``srun`` is checked only where they exist.
    """
    if not job_file(req.job_file).is_file():
        raise LaunchError(f"job file {req.job_file!r} not found (jobs live in jobs/*.yaml)")
    cfg = load_config(req.job_file, req.overrides)
    check_fields(req)
    if req.gpus_per_node and req.tasks_per_node > req.gpus_per_node:
        raise LaunchError(
            f"--tasks-per-node {req.tasks_per_node} > --gpus-per-node {req.gpus_per_node}: a pod is one rank "
            "on one GPU; ask for as many GPUs as tasks per node (or fewer tasks)"
        )
    parse_sbatch(req.sbatch)
    parse_srun(req.srun)
    if req.container_mounts and not req.container_image:
        raise LaunchError("--container-mounts without --container-image: give the image the ranks run in")
    if req.pods_per_job:
        _check_pool_jobs(req)
    check_run_dir(run_dir_for(req, cfg))
    if req.executor == "slurm" and req.array and req.array != list(range(len(req.array))) and req.array_parallelism:
        raise LaunchError(
            f"--array {','.join(map(str, req.array))}%{req.array_parallelism}: tasks other than 0..N-1 go "
            "to Slurm as one job each (submitit numbers an array from 0, and the task's directory and "
            "Slurm's index must agree), so a %P throttle cannot hold; drop %P or use --array N"
        )
    if cfg.tournament.mode != "none" and req.ranks < 2 and not req.array:
        print(f"note: a tournament of {req.ranks} pod; ask for more tasks to make it a pool", file=sys.stderr)
    if req.executor == "slurm":
        from podracer_hpc.launch.slurm import check_request  # submitit: only when Slurm is asked for

        check_request(req, cfg, dry_run)
    elif req.nodes > 1:
        raise LaunchError("--executor local runs on this machine: use --nodes 1 (and --tasks-per-node for the pods)")
    return cfg


def _check_pool_jobs(req: Request) -> None:
    """--pods-per-job: whole nodes per job, whole jobs per pool, and not with --array (that is
    separate runs; a pool of jobs is one)."""
    m = req.pods_per_job
    if req.array:
        raise LaunchError(
            "--pods-per-job runs one pool as several jobs (one run directory); --array runs separate "
            "runs: use one or the other"
        )
    if req.ranks % m:
        raise LaunchError(
            f"--pods-per-job {m}: the pool's {req.ranks} pods (--nodes {req.nodes} x --tasks-per-node "
            f"{req.tasks_per_node}) do not split into jobs of {m}; use a divisor of {req.ranks}"
        )
    if req.executor == "slurm" and m % req.tasks_per_node:
        raise LaunchError(
            f"--pods-per-job {m}: a job is whole nodes of --tasks-per-node {req.tasks_per_node} pods; "
            f"use a multiple of {req.tasks_per_node}"
        )


def check_run_dir(path: Path) -> None:
    """The run directory can be made (or is one) and written: checked before anything is queued
    (also by --dry-run), so that a typo is an error here, not a job that fails on a compute node."""
    if path.exists() and not path.is_dir():
        raise LaunchError(f"--run-dir {path}: a file stands there; choose a directory")
    anc = path
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise LaunchError(f"--run-dir {path}: {anc} is a file, not a directory; choose another --run-dir")
    if not os.access(anc, os.W_OK | os.X_OK):
        what = "write in" if anc == path else f"create {path} under"
        raise LaunchError(
            f"--run-dir {path}: no permission to {what} {anc}; choose a --run-dir you can write to "
            "(on the cluster's shared filesystem)"
        )
