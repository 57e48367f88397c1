"""Launching jobs: Slurm through submitit, or this machine through mpiexec. The only package that
imports submitit (in :mod:`.slurm`).

``podracer submit JOB.yaml`` validates everything it can before anything is queued (the job
file, the resource request, the partition as ``sinfo`` knows it), then starts the job's ranks:

- ``slurm``: one submitit job (or job array) whose tasks are the pods of one MPI world; each
  task runs from a code snapshot in the run directory (:mod:`.snapshot`);
- ``local``: ``mpiexec -n <ranks> podracer train ...`` on this machine, no cluster needed.

The parts, one job each: :mod:`.request` (every option of ``podracer submit`` declared once, with
its doc, its check and its sbatch option; the argparse, the checks, the sbatch parameters and the
dry-run derive from it), :mod:`.checks` (``validate``), :mod:`.snapshot` (the code a job runs), :mod:`.slurm`
(submitit, the
rank task, sbatch, Slurm's job states), :mod:`.local` (mpiexec here), :mod:`.watch` (progress and
an end that is never a hang). ``--dry-run`` needs no Slurm: without ``sbatch``/``sinfo`` the
request is checked as far as it can be here and the script is printed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from podracer_hpc.cluster.jobstate import SlurmJobState, slurm_job_state, slurm_job_states
from podracer_hpc.config import Config
from podracer_hpc.docfield import ConfigError
from podracer_hpc.files.rundir import RunDir, locked_message
from podracer_hpc.launch import local, pooljobs
from podracer_hpc.launch.checks import validate
from podracer_hpc.launch.errors import JobError, LaunchError, SlurmUnreachable
from podracer_hpc.launch.local import find_mpiexec, start_command
from podracer_hpc.launch.request import (
    ACTIONS,
    Request,
    add_arguments,
    from_args,
    own_sbatch,
    parse_array,
    parse_sbatch,
    run_dir_for,
    slurm_minutes,
    task_overrides,
)
from podracer_hpc.launch.snapshot import Snapshot, make_snapshot, plan_snapshot
from podracer_hpc.launch.watch import (
    ACTIVE_STATES,
    Job,
    Launched,
    progress_line,
    read_summary,
    still_active,
    summary_signature,
    wait,
)

# From .slurm, which imports submitit: loaded on first use, so that `podracer --help`, `podracer
# config` and a local submit do not pay for it.
_SLURM_NAMES = ("RankProgram", "launch_line", "sbatch_text", "slurm_here")
_LAZY = {n: "slurm" for n in _SLURM_NAMES}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACTIONS",
    "ACTIVE_STATES",
    "ConfigError",
    "Job",
    "JobError",
    "Launched",
    "LaunchError",
    "RankProgram",
    "Request",
    "Snapshot",
    "SlurmJobState",
    "SlurmUnreachable",
    "add_arguments",
    "find_mpiexec",
    "from_args",
    "launch_line",
    "make_snapshot",
    "own_sbatch",
    "parse_array",
    "parse_sbatch",
    "plan_snapshot",
    "progress_line",
    "read_summary",
    "run_dir_for",
    "sbatch_text",
    "slurm_job_state",
    "slurm_job_states",
    "slurm_minutes",
    "start_command",
    "still_active",
    "submit_local",
    "submit_slurm",
    "summary_signature",
    "task_overrides",
    "validate",
    "wait",
]


def submit_slurm(req: Request, cfg: Config) -> Launched:
    """Submit the request's job (or array; a pool of several jobs: the parts it needs) to Slurm;
    returns what to watch."""
    import importlib

    plan = _pool_plan(req, cfg)
    if plan is None:
        _refuse_live_writers(req, cfg)
    if plan is not None and not plan.start:
        return Launched("slurm", [], pool_jobs=req.jobs)
    jobs, dirs, snap, stale = importlib.import_module(f"{__name__}.slurm").submit(
        req, cfg, parts=plan.start if plan is not None else None
    )
    handles = [Job(str(j.job_id), Path(str(j.paths.stderr))) for j in jobs]
    launched = Launched(
        "slurm", dirs, jobs=handles, logs=[h.log for h in handles], stale_summaries=stale, snapshot=snap
    )
    if plan is not None:
        launched.parts, launched.pool_jobs = [_pods(req, g) for g in plan.start], req.jobs
        pooljobs.record(
            RunDir(run_dir_for(req, cfg)),
            req.jobs,
            req.job_ranks,
            {g: {"executor": "slurm", "job": h.job_id} for g, h in zip(plan.start, handles)},
        )
    return launched


def submit_local(req: Request, cfg: Config) -> Launched:
    """Start the request's ranks on this machine (array tasks up to %P at a time; a pool of
    several jobs: the parts it needs, at once)."""
    plan = _pool_plan(req, cfg)
    if plan is None:
        _refuse_live_writers(req, cfg)
        return local.submit(req, cfg)
    if not plan.start:
        return Launched("local", [], pool_jobs=req.jobs)
    launched = local.submit(req, cfg, parts=plan.start)
    launched.pool_jobs = req.jobs
    pooljobs.record(
        RunDir(run_dir_for(req, cfg)),
        req.jobs,
        req.job_ranks,
        {g: pooljobs.local_job(p.pid) for g, p in zip(plan.start, launched.procs)},
    )
    return launched


def _refuse_live_writers(req: Request, cfg: Config) -> None:
    """Nothing starts into a run directory that a live process writes (its writer lock): the job
    would be refused there anyway, after its queue wait, and a local one's launch.log appended to."""
    for t in req.array or [None]:
        rundir = RunDir(task_overrides(req, cfg, t)[1])
        writer = pooljobs.live_writer(rundir)
        if writer is not None:
            raise LaunchError(locked_message(rundir, rundir.lock_file(), writer, "it runs"))


def _pods(req: Request, part: int) -> range:
    return range(part * req.job_ranks, (part + 1) * req.job_ranks)


def _pool_plan(req: Request, cfg: Config) -> pooljobs.Plan | None:
    """A pool of several jobs (--pods-per-job): the parts to start now (notes on the others)."""
    if not req.pods_per_job:
        return None
    plan = pooljobs.plan(RunDir(run_dir_for(req, cfg)), req.jobs, req.job_ranks)
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    return plan
