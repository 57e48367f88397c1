"""A pool of several jobs (``podracer submit --pods-per-job M``): which parts to start.

The pool of N pods runs as N/M jobs of M pods, each its own MPI world (``podracer train
--pool-part i/J``) and failure domain: a job that fails, is preempted or killed requeues (or is
resubmitted) alone, and its pods resume from their checkpoints and rejoin through the shared
leaderboard while the other jobs never stop. ``<run>/pool.json`` keeps the pool's shape and the
last job (Slurm id, or a local pid) of each part, so that the same ``podracer submit`` command
run again starts only the parts that are neither done (every pod's record says ``done``:
poolsummary.py) nor still queued or running.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Any

from podracer_hpc.cluster import jobstate
from podracer_hpc.files.atomic import atomic_write_bytes
from podracer_hpc.files.bounded import read_json
from podracer_hpc.files.rundir import (
    PoolPart,
    RunDir,
    describe_owner,
    lock_owner,
    owner_alive,
    process_alive,
    process_start,
)
from podracer_hpc.files.summary import read_records
from podracer_hpc.launch.errors import LaunchError
from podracer_hpc.launch.watch import still_active

__all__ = ["Plan", "live_writer", "local_job", "plan", "read_pool", "record"]


@dataclass
class Plan:
    """What a submission of a pool does: the parts to start, and why the others are left alone."""

    start: list[int]
    notes: list[str] = field(default_factory=list)


def _read(rundir: RunDir) -> dict[str, Any] | None:
    try:
        d = read_json(rundir.pool_file, what="pool record")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise LaunchError(
            f"{rundir.pool_file} is unreadable ({e}): move it away (the run resumes without it; parts "
            "still running would then be started twice), or use a new --run-dir"
        ) from None
    return d if isinstance(d, dict) else None


def _alive(job: dict[str, Any], slurm_states: dict[str, Any]) -> bool:
    """Whether a part's last job still runs or will run (queued, requeued)."""
    if job.get("executor") == "local":
        if job.get("host") != socket.gethostname():
            return False  # another machine's process: not ours to see (a local pool is one machine's)
        return _running(int(job.get("pid", 0) or 0), str(job.get("start") or ""))
    st = slurm_states.get(str(job.get("job", "")))
    if st is None:
        return True  # slurmctld did not answer: assume it runs rather than start it twice
    return bool(st.state) and still_active(st.state)


def _running(pid: int, start: str = "") -> bool:
    """Whether process ``pid`` runs here (a zombie nobody reaped yet does not) and, given the start
    time recorded with it, is still the same process (a reused pid is another one)."""
    return process_alive(pid, start)


def live_writer(rundir: RunDir, part: PoolPart = PoolPart()) -> dict[str, Any] | None:
    """The live writer that holds ``rundir``'s lock (of ``part``), None when there is none: its pid
    and start time on this host, Slurm for a job on another host (a job Slurm does not name as
    gone is taken as running)."""
    rec = lock_owner(rundir.lock_file(part))
    if rec is None:
        return None
    alive = owner_alive(rec)
    if alive is None:
        job = str(rec.get("job") or "")
        if job and job != "local":
            st = jobstate.slurm_job_states([job]).get(job)
            alive = st is None or (bool(st.state) and still_active(st.state))
        else:
            alive = True  # another host's local run: nothing here can tell; the lock's message says what to do
    return rec if alive else None


def plan(rundir: RunDir, jobs: int, pods_per_job: int) -> Plan:
    """The parts to start: all of a new pool; of an existing one (``pool.json``), those neither
    done nor still queued or running. Raises LaunchError when the run directory holds a pool of
    another shape."""
    old = _read(rundir)
    if old is None:
        ranks = rundir.checkpoint_pods()  # one listing of the checkpoints directory
        if ranks and ranks[-1] >= jobs * pods_per_job:
            raise LaunchError(
                f"{rundir.root} holds the checkpoints of a bigger run (pod {ranks[-1]}); use a new "
                "--run-dir or the same pool size"
            )
        return Plan(list(range(jobs)))
    shape = (old.get("jobs"), old.get("pods_per_job"))
    if shape != (jobs, pods_per_job):
        raise LaunchError(
            f"{rundir.root} holds a pool of {shape[0]} jobs x {shape[1]} pods ({rundir.pool_file}); "
            f"this submission asks for {jobs} x {pods_per_job}: submit it with the same --nodes, "
            "--tasks-per-node and --pods-per-job to resume it, or use a new --run-dir"
        )
    parts: dict[str, Any] = old.get("parts") or {}
    slurm_ids = [str(p["job"]) for p in parts.values() if p.get("executor") == "slurm" and p.get("job")]
    states = jobstate.slurm_job_states(slurm_ids) if slurm_ids else {}
    records = read_records(rundir, range(jobs * pods_per_job))
    out = Plan([])
    for g in range(jobs):
        pods = range(g * pods_per_job, (g + 1) * pods_per_job)
        job = parts.get(str(g)) or {}
        if all(records.get(i, {}).get("state") == "done" for i in pods):
            out.notes.append(f"part {g} (pods {pods.start}-{pods.stop - 1}): done")
        elif job and _alive(job, states):
            out.notes.append(
                f"part {g} (pods {pods.start}-{pods.stop - 1}): still running or queued as "
                f"{job.get('executor', 'slurm')} job {job.get('job') or job.get('pid')}; left alone"
            )
        elif (writer := live_writer(rundir, PoolPart(g, jobs))) is not None:
            out.notes.append(
                f"part {g} (pods {pods.start}-{pods.stop - 1}): written now by {describe_owner(writer)} "
                f"({rundir.lock_file(PoolPart(g, jobs))}); left alone"
            )
        else:
            out.start.append(g)
    return out


def record(
    rundir: RunDir,
    jobs: int,
    pods_per_job: int,
    started: dict[int, dict[str, Any]],
    request: dict[str, Any] | None = None,
) -> None:
    """Write ``pool.json``: the shape and, for each part just started, its job (the others keep
    theirs; a part's ``exclude``, its nodes to avoid, stays unless given anew); ``request``: the
    submission's options (what ``podracer resume`` submits again; kept when not given)."""
    old = _read(rundir) or {}
    parts = dict(old.get("parts") or {})
    for g, job in started.items():
        kept = {"exclude": (parts.get(str(g)) or {}).get("exclude")} if (parts.get(str(g)) or {}).get("exclude") else {}
        parts[str(g)] = {**kept, **job}
    data: dict[str, Any] = {"jobs": jobs, "pods_per_job": pods_per_job, "parts": parts}
    if request is not None or old.get("request") is not None:
        data["request"] = request if request is not None else old["request"]
    rundir.root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(rundir.pool_file, (json.dumps(data, indent=1) + "\n").encode(), mode=0o644)


def read_pool(rundir: RunDir) -> dict[str, Any] | None:
    """``pool.json`` (None: no pool here); LaunchError when it is unreadable."""
    return _read(rundir)


def local_job(pid: int) -> dict[str, Any]:
    """A local part's job: the relay's pid on this host, and its start time (a later process that
    reuses the pid is not this job)."""
    return {"executor": "local", "pid": pid, "host": socket.gethostname(), "start": process_start(pid)}
