"""Watching what was launched: progress from the run directories' logs, the jobs' states, and
an end that is never a hang (a job that failed, was cancelled, vanished or can never start is an
error naming its state and log; a requeued job is waited for)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from podracer_hpc.cluster import jobstate
from podracer_hpc.files.bounded import read_json
from podracer_hpc.files.rundir import EXIT_REQUEUE, RunDir
from podracer_hpc.launch.errors import JobError

__all__ = [
    "ACTIVE_STATES",
    "Job",
    "Launched",
    "NEVER_STARTS",
    "part_done",
    "progress_line",
    "read_summary",
    "state_counts",
    "still_active",
    "summary_signature",
    "wait",
]

# States in which a job will still run, or run again (a requeued job is PENDING again).
ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "RESV_DEL_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "POWER_UP_NODE",
    "UPDATE_DB",
}
# Pending reasons that no amount of waiting resolves: the request exceeds a partition's, QOS's or
# association's limit, or names something that does not exist (slurm/src/common/slurm_protocol_defs.c).
NEVER_STARTS = {
    "PartitionNodeLimit": "more nodes than the partition allows",
    "PartitionTimeLimit": "a longer time limit than the partition allows",
    "PartitionConfig": "a request the partition's configuration cannot meet",
    "BadConstraints": "constraints no node satisfies",
    "DependencyNeverSatisfied": "a dependency that can never be satisfied",
    "InvalidAccount": "an account that does not exist or you may not use",
    "InvalidQOS": "a QOS that does not exist or you may not use",
    "QOSMaxWallDurationPerJobLimit": "a longer time limit than the QOS allows",
    "AssocMaxWallDurationPerJobLimit": "a longer time limit than your association allows",
    "QOSMaxNodePerJobLimit": "more nodes than the QOS allows",
    "AssocMaxNodesPerJobLimit": "more nodes than your association allows",
    "QOSMaxCpuPerJobLimit": "more CPUs than the QOS allows",
    "AssocMaxCpuPerJobLimit": "more CPUs than your association allows",
    "QOSMaxGRESPerJob": "more GPUs/GRES than the QOS allows",
    "AssocMaxGRESPerJob": "more GPUs/GRES than your association allows",
    "QOSMaxMemoryPerJob": "more memory than the QOS allows",
}


def still_active(state: str) -> bool:
    """Whether a job in Slurm state ``state`` will still run, or run again (a requeue passes
    through REQUEUE* states); "" (unknown to Slurm) is not."""
    return state in ACTIVE_STATES or state.startswith("REQUEUE")


@dataclass
class Job:
    """A Slurm job that was submitted: its id and the log that says what became of it."""

    job_id: str
    log: Path


@dataclass
class Launched:
    """Handles of what was started, for waiting and reporting."""

    executor: str
    run_dirs: list[Path]
    jobs: list[Job] = field(default_factory=list)  # Slurm jobs
    procs: list[subprocess.Popen] = field(default_factory=list)  # local processes
    logs: list[Path] = field(default_factory=list)
    stale_summaries: list[tuple[int, int, int] | None] = field(default_factory=list)  # per run dir, at submission
    started: float = field(default_factory=time.monotonic)
    snapshot: Any = None  # the code snapshot (snapshot.Snapshot) of a Slurm submission
    # a pool of several jobs (--pods-per-job): the pods of each job (same run directory for all);
    # empty: each job is a run of its own
    parts: list[range] = field(default_factory=list)
    pool_jobs: int = 0  # the pool's jobs, started now or not

    def label(self, i: int) -> str:
        """How messages name job i: its run directory, and its pods when it is part of a pool."""
        if not self.parts:
            return str(self.run_dirs[i])
        r = self.parts[i]
        return f"{self.run_dirs[i]} (pods {r.start}-{r.stop - 1})"

    def describe(self) -> str:
        if not self.run_dirs:
            return "nothing to start: every part of the pool is done, or still queued or running (notes above)"
        pool = (
            f" ({len(self.parts)} of the pool's {self.pool_jobs} jobs of {len(self.parts[0])} pods, one MPI world each)"
            if self.parts
            else ""
        )
        if self.executor == "slurm":
            ids = ", ".join(j.job_id for j in self.jobs)
            code = f"; code snapshot {self.snapshot.path} (revision {self.snapshot.revision})" if self.snapshot else ""
            one_dir = len(set(self.run_dirs)) == 1
            return (
                f"submitted Slurm job {ids}{pool}; logs {self.logs[0].parent}; run dir "
                f"{self.run_dirs[0] if one_dir else self.run_dirs[0].parent}{code}"
            )
        return (
            f"started {len(self.procs)} local mpiexec run(s){pool} (pid {', '.join(str(p.pid) for p in self.procs)}: "
            f"kill -USR2 <pid> stops it with a checkpoint); output in {', '.join(map(str, self.logs))}"
        )


_MONITORS: dict[str, Any] = {}  # run dir -> live.Monitor: each progress line reads only the rows appended since
MONITORS_KEPT = 256


def progress_line(run_dir: Path) -> str:
    """Pods (running, done, ...), env steps, median and best evaluation, rounds and steps/s of a
    run, from its HDF5 logs: only the rows appended since the last line for the same run
    directory are read (a :class:`live.Monitor` is kept per run directory)."""
    from podracer_hpc.files.live import Monitor, StatusError, pod_state

    key = str(run_dir)
    m = _MONITORS.get(key)
    if m is None:
        if len(_MONITORS) >= MONITORS_KEPT:
            _MONITORS.pop(next(iter(_MONITORS)))
        m = _MONITORS[key] = Monitor(run_dir)
    try:
        pods = [p for p in m.poll() if not p.error]
    except StatusError:
        pods = []
    if not pods:
        return f"{run_dir.name}: waiting for the ranks to start"
    total = int(m.config.get("total_env_steps") or 0)
    states: dict[str, int] = {}
    for p in pods:
        states[pod_state(p, total, False)] = states.get(pod_state(p, total, False), 0) + 1
    steps = sum(p.env_steps for p in pods)
    sps = sum(p.steps_per_s for p in pods if math.isfinite(p.steps_per_s))
    rounds = max((p.rounds or 0 for p in pods), default=0)
    evals = [p for p in pods if math.isfinite(p.best_eval)]
    if evals:
        best = max(evals, key=lambda p: p.best_eval)
        last = sorted(p.last_eval for p in pods if math.isfinite(p.last_eval))
        median = f"median last eval {last[len(last) // 2]:.1f}, " if len(pods) > 1 and last else ""
        best_text = median + f"best eval {best.best_eval:.1f}" + (f" (pod {best.rank})" if len(pods) > 1 else "")
    else:
        best_text = "best eval n/a"
    pct = f" ({100 * steps / (total * len(pods)):.0f}%)" if total else ""
    breakdown = (
        ""
        if set(states) == {"running"}
        else ", ".join(f"{n} {k}" for k, n in sorted(states.items(), key=lambda kv: -kv[1])) + " | "
    )
    return (
        f"{run_dir.name}: {len(pods)} pods | {breakdown}{steps:,} env steps{pct} | {sps / 1e3:.0f}k steps/s | "
        f"rounds {rounds} | {best_text}"
    )


def summary_signature(run_dir: Path) -> tuple[int, int, int] | None:
    """:meth:`RunDir.summary_signature` of ``run_dir``."""
    return RunDir(run_dir).summary_signature()


def read_summary(run_dir: Path, stale: tuple[int, int, int] | None = None) -> dict[str, Any] | None:
    """The run's summary.json, unless it is the one that was there at submission (``stale``)."""
    sig = summary_signature(run_dir)
    if sig is None or sig == stale:
        return None
    try:
        return read_json(RunDir(run_dir).summary, what="run summary")
    except (OSError, ValueError):
        return None


def summary_after_success(run_dir: Path, stale: tuple[int, int, int] | None) -> dict[str, Any] | None:
    """The summary of a job that ended with success (exit 0, COMPLETED): a new one, or, when its run
    was already complete before (``podracer train`` then says so and changes no file), the one there."""
    return read_summary(run_dir, stale) or read_summary(run_dir)


def _complete(summary: dict[str, Any] | None) -> bool:
    return summary is not None and summary.get("complete", True) is not False


def _incomplete_text(summary: dict[str, Any] | None, run_dir: Path) -> str:
    if summary is None:
        return f"it wrote no summary ({RunDir(run_dir).summary})"
    return (
        f'its summary says it stopped early ({summary.get("env_steps", "?"):,} env steps; "complete": false; '
        f"the checkpoints in {run_dir} resume it)"
        if isinstance(summary.get("env_steps"), int)
        else f'its summary says it stopped early ("complete": false; {RunDir(run_dir).summary})'
    )


@dataclass
class _Watch:
    """What wait() remembers about one Slurm job between polls."""

    seen: bool = False
    last: str = ""
    restarts: int = 0
    ended_at: float | None = None  # monotonic time the job was first seen ended or gone
    ended_state: str = ""


# How often a waiting command asks Slurm (scontrol/sacct), seconds: slurmctld serves every user of
# the cluster, so 30 by default; a private cluster (the test tier's) may ask every few seconds.
SLURM_POLL_ENV = "PODRACER_SLURM_POLL_S"


def slurm_poll_s() -> float:
    """``$PODRACER_SLURM_POLL_S`` if it is a number >= 1, else 30."""
    try:
        v = float(os.environ.get(SLURM_POLL_ENV, ""))
    except ValueError:
        return 30.0
    return v if math.isfinite(v) and v >= 1 else 30.0


JOB_LINES = 8  # up to this many jobs, a line for each state change; beyond, one line of counts when they change


def _label(st: Any) -> str:
    return st.state + (f" ({st.reason})" if st.reason and st.reason not in ("None", "") else "")


def _report_state(job: Job, st: Any, w: _Watch, d: Path, out: Any, each: bool = True) -> None:
    """Print a job's state when it changed (``each``: else the counts line says it), and its requeues."""
    w.seen = True
    label = _label(st)
    if st.restarts > w.restarts:
        w.restarts = st.restarts
        print(f"job {job.job_id}: requeued (start {st.restarts + 1}); it resumes from {d}", file=out, flush=True)
    if label != w.last:
        w.last = label
        if each:
            print(f"job {job.job_id}: {label}", file=out, flush=True)


def state_counts(states: dict[str, Any], restarts: int = 0) -> str:
    """``97 RUNNING, 3 PENDING (Priority); 2 requeues`` for many jobs' states (most common first)."""
    counts: dict[str, int] = {}
    for st in states.values():
        label = _label(st) if st is not None and st.state else ("no answer" if st is None else "gone")
        counts[label] = counts.get(label, 0) + 1
    text = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return text + (f"; {restarts} requeue{'s' * (restarts != 1)}" if restarts else "")


Done = Callable[[Any], bool]  # a summary (or None) -> whether the run needs no more work


def _slurm_step(
    launched: Launched, i: int, w: _Watch, out: Any, confirm_s: float, done: Done, st: Any, each: bool = True
) -> bool:
    """One poll of Slurm job i, whose state this poll's one scheduler call gave (``st``; None:
    slurmctld did not answer): True when it completed its training; raises JobError when it will not."""
    job, d = launched.jobs[i], launched.run_dirs[i]
    if st is None:
        return False  # slurmctld busy: ask again
    now = time.monotonic()
    if st.state:
        _report_state(job, st, w, d, out, each)
    if still_active(st.state):
        w.ended_at = None
        if st.state == "PENDING" and st.reason in NEVER_STARTS:
            raise JobError(
                f"Slurm job {job.job_id} cannot start: {st.reason} (it asks for {NEVER_STARTS[st.reason]}). "
                f"It stays queued until you cancel it (scancel {job.job_id}) and submit a request that fits."
            )
        return False
    if not st.state and not w.seen and now - launched.started < 30:
        return False  # not visible yet
    # Ended (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...), or gone from slurmctld (MinJobAge passed)
    # and from accounting (none). Confirm once a few seconds later: a requeue passes through
    # ended-looking states before it is PENDING again.
    if w.ended_at is None or w.ended_state != st.state:
        w.ended_at, w.ended_state = now, st.state
        return False
    if now - w.ended_at < confirm_s:
        return False
    summary = (summary_after_success if st.state == "COMPLETED" else read_summary)(d, launched.stale_summaries[i])
    state = st.state or "gone from the queue, and Slurm keeps no record of it (no accounting)"
    pool = (
        f" It ran pods {launched.parts[i].start}-{launched.parts[i].stop - 1} of a pool: the pool's other jobs go "
        "on, and the same podracer submit command starts only this part again."
        if launched.parts
        else ""
    )
    if st.state == "COMPLETED" or not st.state:
        if done(summary):
            return True
        raise JobError(
            f"Slurm job {job.job_id} ended {state} without completing its training: "
            f"{_incomplete_text(summary, d)}; see {job.log}.{pool}\n" + _tail(job.log)
        )
    code = f", exit code {st.exit_code}" if st.exit_code and st.exit_code != "0:0" else ""
    raise JobError(
        f"Slurm job {job.job_id} ended {state}{code}: {_incomplete_text(summary, d)}; see {job.log}.{pool}\n"
        + _tail(job.log)
    )


def part_done(run_dir: Path, pods: range) -> bool:
    """Whether every pod of ``pods`` left a ``done`` record (poolsummary.py): a job of a pool."""
    from podracer_hpc.files.summary import read_records

    recs = read_records(RunDir(run_dir), pods)
    return all(recs.get(i, {}).get("state") == "done" for i in pods)


def _done_of(launched: Launched, i: int, done: Done) -> Done:
    """What counts as finished for job i: its run's summary, or, for a job of a pool, its pods' records."""
    if not launched.parts:
        return done
    return lambda _summary: part_done(launched.run_dirs[i], launched.parts[i])


def _local_step(launched: Launched, i: int, done: Done) -> bool:
    p, d, log = launched.procs[i], launched.run_dirs[i], launched.logs[i]
    if p.poll() is None:
        return False
    rc = p.returncode
    summary = (summary_after_success if rc == 0 else read_summary)(d, launched.stale_summaries[i])
    if rc == 0 and done(summary):
        return True
    if rc == EXIT_REQUEUE:
        raise JobError(
            f"local run {launched.label(i)} stopped early (exit 75): every rank checkpointed; submit the "
            f"same command again to resume; see {log}",
            exit_code=EXIT_REQUEUE,
        )
    why = f"exit {rc}" if rc >= 0 else f"killed by signal {-rc}"
    if rc == 0:
        why += f", but {_incomplete_text(summary, d)}"
    raise JobError(f"local run {launched.label(i)} failed ({why}); see {log}:\n" + _tail(log))


def _retried_step(
    launched: Launched,
    i: int,
    watches: list[_Watch],
    out: Any,
    confirm_s: float,
    done: Done,
    states: dict[str, Any],
    each: bool,
    retry: Any,
) -> bool:
    """:func:`_slurm_step` of job i; with a ``retry`` hook, a job that ended without completing is
    replaced by the one it resubmits (watched from now on), and a running one is looked at."""
    st = states.get(launched.jobs[i].job_id)
    try:
        finished = _slurm_step(launched, i, watches[i], out, confirm_s, done, st, each)
    except JobError as e:
        if retry is None or (st is not None and still_active(st.state)):
            raise
        launched.jobs[i] = retry.ended(i, e)
        watches[i] = _Watch(seen=False)
        return False
    if not finished and retry is not None and st is not None and st.state == "RUNNING":
        retry.running(i)
    return finished


def _ask_slurm(
    launched: Launched, finished: set[int], watches: list[_Watch], out: Any, counts: str | None
) -> tuple[dict[str, Any], str | None]:
    """Slurm's states of the jobs still watched (one scheduler call); with ``counts`` (many jobs:
    the last line of counts printed), a line of counts when they changed."""
    states = jobstate.slurm_job_states(
        [launched.jobs[i].job_id for i in range(len(launched.run_dirs)) if i not in finished]
    )
    if counts is not None:
        line = state_counts(states, sum(w.restarts for w in watches))
        if line != counts:
            print(f"jobs: {line}", file=out, flush=True)
            counts = line
    return states, counts


def wait(
    launched: Launched,
    timeout_s: float,
    poll_s: float = 3.0,
    out: Any = None,
    confirm_s: float = 4.0,
    done: Done = _complete,
    progress: Callable[[Path], str] | None = progress_line,
    slurm_every_s: float | None = None,
    retry: Any = None,
) -> list[dict[str, Any]]:
    """Wait for every job with progress lines; returns the summaries of jobs that completed their
    training. Raises JobError as soon as one job ends without completing (failed, cancelled,
    stopped, gone from the queue with no complete summary, or pending for a reason that never
    resolves), naming its state and log, within ``slurm_every_s + confirm_s`` seconds of Slurm
    saying so; a requeued job is waited for. Raises JobError after ``timeout_s``.

    Slurm is asked at most every ``slurm_every_s`` (default :func:`slurm_poll_s`; once for every job still watched:
    :func:`jobstate.slurm_job_states`, one ``scontrol`` call answers for all tasks of an array;
    slurmctld serves every user of the cluster), and each poll reads the parts' aggregates, or
    only the log rows appended since the last poll (:func:`progress_line`). Up to JOB_LINES jobs, each state change is a
    line; beyond, one line of counts (``jobs: 97 RUNNING, 3 PENDING (Priority)``) when they change.

    ``done``: what counts as finished, from the run's summary (default: ``complete`` is not false);
    ``progress``: the line printed for a run directory when it changes (None: no progress lines);
    ``retry``: a :class:`retry.Retrier` (``--retries``): a Slurm job that ended without completing
    is handed to its ``ended`` (which returns the job that replaces it, or raises), and a running
    one to its ``running`` (which cancels a part gone silent).
    """
    out = out or sys.stderr
    every = slurm_poll_s() if slurm_every_s is None else slurm_every_s
    deadline = time.monotonic() + timeout_s
    last: dict[str, str] = {}
    watches = [_Watch() for _ in launched.run_dirs]
    finished: set[int] = set()
    each = len(launched.jobs) <= JOB_LINES
    counts = ""
    asked = -math.inf  # monotonic time Slurm was last asked
    while len(finished) < len(launched.run_dirs):
        states: dict[str, Any] = {}
        ask = launched.executor != "local" and time.monotonic() - asked >= every
        if ask:  # one scheduler call for every job still watched
            asked = time.monotonic()
            states, counts = _ask_slurm(launched, finished, watches, out, counts if not each else None)
        shown: set[str] = set()  # a pool's jobs share one run directory: one line for it per poll
        for i, d in enumerate(launched.run_dirs):
            if i in finished:
                continue
            _show_progress(d, progress, shown, last, out)
            done_i = _done_of(launched, i, done)
            if launched.executor != "local" and not ask:
                continue  # Slurm's state is looked at only when it was asked
            if launched.executor == "local":
                if _local_step(launched, i, done_i):
                    finished.add(i)
            elif _retried_step(launched, i, watches, out, confirm_s, done_i, states, each, retry):
                finished.add(i)
        if len(finished) == len(launched.run_dirs):
            break
        if time.monotonic() > deadline:
            raise JobError(
                f"gave up waiting after {timeout_s:.0f} s; the job goes on: podracer status {launched.run_dirs[0]}"
            )
        time.sleep(poll_s)
    firsts = {str(d): i for i, d in reversed(list(enumerate(launched.run_dirs)))}  # a pool: its one summary
    return [summary_after_success(launched.run_dirs[i], launched.stale_summaries[i]) for i in sorted(firsts.values())]


def _show_progress(
    d: Path, progress: Callable[[Path], str] | None, shown: set[str], last: dict[str, str], out: Any
) -> None:
    """Print run directory ``d``'s progress line when it changed (once per poll: ``shown``)."""
    line = progress(d) if progress is not None and str(d) not in shown else ""
    shown.add(str(d))
    if line and last.get(str(d)) != line:
        print(line, file=out, flush=True)
        last[str(d)] = line


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return "  (no log file yet)"
    return "\n".join("  " + x for x in lines)
