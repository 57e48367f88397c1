"""``validate``: everything about a request that can be checked before anything is queued: the
job file and its overrides, each option's own check, the options together, and (for Slurm) the
cluster as sinfo and srun describe it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from podracer_hpc.config import Config, job_file, load_config
from podracer_hpc.launch.errors import LaunchError
from podracer_hpc.launch.request import (
    LARGE_JOB_RANKS,
    Request,
    check_fields,
    fit_cpus,
    parse_sbatch,
    parse_srun,
    run_dir_for,
)

__all__ = ["SHARED_FS", "check_run_dir", "mount_of", "shared_interpreter", "validate"]

# filesystem types (the mount table's) that every node shares over the network: a Python there is
# read by every rank at every start (and requeue)
SHARED_FS = (
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "cifs",
    "smb3",
    "smbfs",
    "beegfs",
    "ceph",
    "panfs",
    "wekafs",
    "fuse.sshfs",
)


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

        if note := fit_cpus(req, req.node_cpus, "--node-cpus"):
            print(f"note: {note}", file=sys.stderr)
        check_request(req, cfg, dry_run)
        if not req.container_image and (why := shared_interpreter(sys.executable, req.ranks * max(1, len(req.array)))):
            print(f"warning: {why}", file=sys.stderr)
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


def mount_of(path: str, mounts: str | None = None) -> tuple[str, str]:
    """(mount point, filesystem type) of ``path`` by the mount table (``/proc/self/mounts``, or
    ``mounts``: its text); ("", "") when unknown."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return "", ""
    p = os.path.abspath(path)
    best = ("", "")
    for line in mounts.splitlines():
        f = line.split()
        if len(f) < 3:
            continue
        point = f[1].encode().decode("unicode_escape")  # \040 for a space
        inside = p == point or p.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, f[2])
    return best


def shared_interpreter(executable: str, ranks: int, mounts: str | None = None) -> str:
    """Why a job of ``ranks`` ranks should not start its Python from where ``executable`` lives
    ("" when it may): an interpreter (and its venv or conda env) on a network filesystem is read by
    every rank at every start and requeue, some 13,000 file-name calls per rank for this package's
    imports, a metadata storm for the file server at 64 ranks and more."""
    if ranks < LARGE_JOB_RANKS:
        return ""
    point, kind = mount_of(str(Path(executable).parent), mounts)
    if kind not in SHARED_FS:
        return ""
    return (
        f"the ranks' Python {executable} lives on {point} ({kind}, shared by every node): {ranks} ranks "
        "would each read its thousands of files at every start and requeue. For a job this large, run the "
        "ranks in the container (--container-image) or from a venv staged to node-local disk (sbcast a "
        "tarball of it to /tmp; docs/slurm-templates.md, 'Shared filesystem')"
    )
