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

import dataclasses
import sys
from pathlib import Path
from typing import Any

from podracer_hpc.cluster.jobstate import SlurmJobState, slurm_job_state, slurm_job_states
from podracer_hpc.config import Config
from podracer_hpc.docfield import ConfigError
from podracer_hpc.files.rundir import RunDir, locked_message
from podracer_hpc.launch import local, pooljobs, watch
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
    "resubmit",
    "resume_pool",
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
            request=dataclasses.asdict(req),
        )
    return launched


def resubmit(req: Request, cfg: Config, launched: Launched, part: int, exclude: list[str]) -> Job:
    """Submit part ``part`` of the pool (or the job of its own, part 0) again, from its
    checkpoints, on the code its first submission ran, avoiding ``exclude`` (added to the
    request's own --exclude); records it in ``pool.json``. A retry (launch/retry.py)."""
    import importlib

    nodes = ",".join(dict.fromkeys([*filter(None, req.exclude.split(",")), *exclude]))
    again = dataclasses.replace(req, exclude=nodes)
    pool = bool(launched.parts)
    jobs, _, _, _ = importlib.import_module(f"{__name__}.slurm").submit(
        again, cfg, parts=[part] if pool else None, snapshot=launched.snapshot
    )
    job = Job(str(jobs[0].job_id), Path(str(jobs[0].paths.stderr)))
    if pool:
        pooljobs.record(
            RunDir(run_dir_for(req, cfg)),
            req.jobs,
            req.job_ranks,
            {part: {"executor": "slurm", "job": job.job_id, "exclude": exclude}},
        )
    return job


def resume_pool(run_dir: Path) -> tuple[Request, Config, Launched, dict[int, list[str]]]:
    """What ``podracer resume RUN_DIR`` watches: the pool's request (as recorded in ``pool.json``
    at its submission), its config, its parts not done with their last Slurm jobs, and each
    part's excluded nodes. LaunchError when there is no such pool."""
    rundir = RunDir(run_dir)
    pool = pooljobs.read_pool(rundir)
    if pool is None or not isinstance(pool.get("request"), dict):
        raise LaunchError(
            f"{rundir.pool_file} is missing or records no request (a pool submitted by an older podracer, or not "
            "a pool of several jobs): run the same podracer submit command with --wait --retries K instead"
        )
    known = {f.name for f in dataclasses.fields(Request)}
    req = Request(**{k: v for k, v in pool["request"].items() if k in known})
    cfg = validate(req, dry_run=False)
    launched = Launched("slurm", [], pool_jobs=req.jobs)
    excluded: dict[int, list[str]] = {}
    for g in range(req.jobs):
        job = (pool.get("parts") or {}).get(str(g)) or {}
        excluded[g] = list(job.get("exclude") or [])
        if job.get("executor") != "slurm" or not job.get("job") or watch.part_done(rundir.root, _pods(req, g)):
            continue
        launched.jobs.append(Job(str(job["job"]), rundir.slurm_logs(str(job["job"])) / f"{job['job']}_0_log.err"))
        launched.run_dirs.append(rundir.root)
        launched.parts.append(_pods(req, g))
        launched.stale_summaries.append(None)
    return req, cfg, launched, excluded


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
