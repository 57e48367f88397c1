"""Launching jobs: Slurm through submitit, or this machine through mpiexec. The only module
that imports submitit.

``podracer submit JOB.yaml`` validates everything it can before anything is queued (the job
file, the resource request, the partition as ``sinfo`` knows it), then starts the job's ranks:

- ``slurm``: one submitit job (or job array) whose tasks are the pods of one MPI world
  (``srun --mpi=pmi2|pmix``, one rank per GPU). Each task runs :class:`RankProgram`.
- ``local``: ``mpiexec -n <ranks> podracer train ...`` on this machine, no cluster needed.

Preemption and time limits: Slurm warns the ranks with a signal (submitit's USR2); every rank
finishes its update and checkpoints, then rank 0 requeues the job (``scontrol requeue``) and
the ranks exit without a result, so the requeued job resumes from the run directory and the
submitter's ``--wait`` keeps waiting.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit
from submitit.slurm.slurm import _make_sbatch_string

from .config import Config, ConfigError, load_config



class LaunchError(ValueError):
    """A request that cannot be right, or a job that failed; the message says which and why."""


@dataclass
class Request:
    """What ``podracer submit`` was asked for (the resolved, validated form)."""

    job_file: str
    overrides: list[str]
    executor: str = "local"  # local | slurm
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    array: list[int] = field(default_factory=list)  # array task ids; empty = no array
    array_parallelism: int = 0  # %P throttle; 0 = no limit
    partition: str = ""
    account: str = ""
    time_min: int = 60
    mpi: str = "pmi2"  # srun --mpi plugin matching the site's MPI (pmi2 for the mpich wheel, pmix for Open MPI)
    run_dir: str = ""
    shared_leaderboard: bool = True  # array tasks share one leaderboard (elastic join between tasks)
    signal_delay_s: int = 90

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node


def parse_array(spec: str) -> tuple[list[int], int]:
    """``"3"`` -> [0, 1, 2]; ``"0-4%2"`` -> ([0..4], 2); ``"1,3,5"`` -> [1, 3, 5]."""
    m = re.fullmatch(r"([0-9,\-]+)(?:%([0-9]+))?", spec.strip())
    if not m:
        raise LaunchError(f"--array {spec!r}: expected N, A-B or A,B,C, optionally followed by %P")
    body, par = m.group(1), int(m.group(2) or 0)
    ids: list[int] = []
    if re.fullmatch(r"[0-9]+", body):
        ids = list(range(int(body)))
    else:
        for part in body.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                if not (a.isdigit() and b.isdigit()) or int(a) > int(b):
                    raise LaunchError(f"--array {spec!r}: bad range {part!r}")
                ids += range(int(a), int(b) + 1)
            elif part.isdigit():
                ids.append(int(part))
            else:
                raise LaunchError(f"--array {spec!r}: bad element {part!r}")
    if not ids:
        raise LaunchError(f"--array {spec!r}: no tasks")
    return sorted(set(ids)), par


def _sinfo(fmt: str, partition: str = "") -> list[str]:
    cmd = ["sinfo", "-h", "-o", fmt] + (["-p", partition] if partition else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise LaunchError(f"sinfo failed ({out.stderr.strip()}); is Slurm reachable from here?")
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def slurm_minutes(text: str) -> int | None:
    """A Slurm time limit ("infinite", "30", "1:00:00", "2-12:00:00", "1-0") in minutes; None = no limit."""
    t = text.strip().lower()
    if t in ("infinite", "unlimited", "n/a", ""):
        return None
    days, _, rest = t.rpartition("-")
    try:
        d = int(days) if days else 0
        parts = [int(x) for x in rest.split(":")] if rest else [0]
    except ValueError:
        return None
    if days:  # days-hours[:minutes[:seconds]]
        parts = parts + [0] * (3 - len(parts))
        h, m, sec = parts[:3]
    elif len(parts) == 3:
        h, m, sec = parts
    elif len(parts) == 2:
        h, m, sec = 0, parts[0], parts[1]
    else:
        h, m, sec = 0, parts[0], 0
    return d * 1440 + h * 60 + m  # seconds dropped: a limit of 45:30 admits --time 45, not 46


def validate(req: Request) -> Config:
    """Check the request and the job file; raises LaunchError/ConfigError before anything is queued."""
    if not Path(req.job_file).is_file():
        raise LaunchError(f"job file {req.job_file!r} not found (jobs live in jobs/*.yaml)")
    cfg = load_config(req.job_file, req.overrides)
    if req.executor not in ("local", "slurm"):
        raise LaunchError(f"--executor must be local or slurm, got {req.executor!r}")
    if req.nodes < 1:
        raise LaunchError(f"--nodes must be >= 1, got {req.nodes}")
    if req.tasks_per_node < 1:
        raise LaunchError(f"--tasks-per-node must be >= 1, got {req.tasks_per_node}")
    if req.gpus_per_node < 0:
        raise LaunchError(f"--gpus-per-node must be >= 0, got {req.gpus_per_node}")
    if req.gpus_per_node and req.tasks_per_node > req.gpus_per_node:
        raise LaunchError(
            f"--tasks-per-node {req.tasks_per_node} > --gpus-per-node {req.gpus_per_node}: a pod is one rank "
            "on one GPU; ask for as many GPUs as tasks per node (or fewer tasks)"
        )
    if req.time_min < 1:
        raise LaunchError(f"--time must be >= 1 minute, got {req.time_min}")
    if req.mpi not in ("pmi2", "pmix", "none"):
        raise LaunchError(f"--mpi must be pmi2, pmix or none, got {req.mpi!r}")
    if cfg.tournament.mode != "none" and req.ranks < 2 and not req.array:
        print(f"note: a tournament of {req.ranks} pod; ask for more tasks to make it a pool", file=sys.stderr)
    if req.executor == "slurm":
        if shutil.which("sbatch") is None:
            raise LaunchError("--executor slurm, but there is no sbatch here: run on a login node, or use --executor local")
        parts = [p.rstrip("*") for p in _sinfo("%P")]
        if req.partition and req.partition not in parts:
            raise LaunchError(f"--partition {req.partition!r} does not exist; partitions here: {', '.join(parts)}")
        part = req.partition or next((p.rstrip("*") for p in _sinfo("%P") if p.endswith("*")), "")
        if part:
            total = sum(int(x) for x in _sinfo("%D", part) if x.isdigit())
            if total and req.nodes > total:
                raise LaunchError(f"--nodes {req.nodes}: partition {part!r} has only {total} nodes")
            limits = [m for m in (slurm_minutes(x) for x in _sinfo("%l", part)) if m is not None]
            if limits and req.time_min > max(limits):
                raise LaunchError(f"--time {req.time_min}: partition {part!r} allows at most {max(limits)} minutes "
                                  "(sinfo -o %l); the job would never start")
    else:
        if req.nodes > 1:
            raise LaunchError("--executor local runs on this machine: use --nodes 1 (and --tasks-per-node for the pods)")
    return cfg


def run_dir_for(req: Request, cfg: Config) -> Path:
    return Path(req.run_dir or Path("runs") / cfg.name).resolve()


def task_overrides(req: Request, cfg: Config, task: int | None) -> tuple[list[str], Path]:
    """The ``--set`` list and run dir of one (array) task."""
    base = run_dir_for(req, cfg)
    sets = list(req.overrides)
    if task is None:
        return sets, base
    sets.append(f"seed={cfg.seed + 1000 * task}")
    if req.shared_leaderboard and not cfg.tournament.leaderboard_dir:
        sets.append(f"tournament.leaderboard_dir={base / 'leaderboard'}")
    return sets, base / f"task{task}"


# ------------------------------------------------------------------------------------------
# What runs in each Slurm task
# ------------------------------------------------------------------------------------------
class RankProgram:
    """One pod rank of a submitit job: trains, and on a warning signal checkpoints and requeues."""

    def __init__(self, job_file: str, overrides: list[str], run_dir: str):
        self.job_file, self.overrides, self.run_dir = job_file, list(overrides), run_dir

    def __call__(self) -> dict[str, Any]:
        from .run import train

        cfg = load_config(self.job_file, self.overrides)
        result = train(cfg, self.run_dir)
        if result.complete:
            return result.summary
        # Stopped by Slurm's warning: every rank has checkpointed. Rank 0 requeues the job; the
        # others wait for that (srun --kill-on-bad-exit would otherwise end rank 0 first), then all
        # leave without a result so the submitter keeps waiting for the requeued run.
        from .comm import get_comm

        comm = get_comm()
        if comm.rank == 0 and "SLURM_JOB_ID" in os.environ:
            job = os.environ.get("SLURM_ARRAY_JOB_ID", "")
            job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ["SLURM_JOB_ID"]
            # Requeue only a job that Slurm still runs (a warning signal: USR2, or --signal). A
            # scancel also stops the ranks (SIGTERM) with checkpoints, but Slurm already marked the
            # job CANCELLED, and `scontrol requeue` would bring a finished job back to life; a job
            # at its time limit (TIMEOUT) or requeued by Slurm itself is Slurm's to restart or not.
            st = slurm_job_state(job)
            if st is None or st.state == "RUNNING":
                subprocess.run(["scontrol", "requeue", job], check=False, timeout=60)
            else:
                print(f"job {job} is {st.state}: not requeued; run the same job again to resume from "
                      f"{self.run_dir}", file=sys.stderr, flush=True)
        comm.barrier()
        raise SystemExit(75)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """submitit's hook (a signal before training started): resubmit as is; the run dir resumes."""
        return submitit.helpers.DelayedSubmission(RankProgram(self.job_file, self.overrides, self.run_dir))


# ------------------------------------------------------------------------------------------
# Executors
# ------------------------------------------------------------------------------------------
def _slurm_parameters(req: Request, cfg: Config, name: str) -> dict[str, Any]:
    params: dict[str, Any] = {
        "job_name": f"podracer-{name}",
        "nodes": req.nodes,
        "ntasks_per_node": req.tasks_per_node,
        "time": req.time_min,
        "signal_delay_s": min(req.signal_delay_s, max(10, req.time_min * 60 // 3)),
        # A rank that dies ends the step, instead of leaving the others waiting in a collective.
        "srun_args": ["--kill-on-bad-exit=1"] + ([] if req.mpi == "none" else [f"--mpi={req.mpi}"]),
        "additional_parameters": {"requeue": True},
        "setup": ["export PYTHONUNBUFFERED=1"],
    }
    if req.gpus_per_node:
        params["gpus_per_node"] = req.gpus_per_node
    if req.partition:
        params["partition"] = req.partition
    if req.account:
        params["account"] = req.account
    if req.array_parallelism:
        params["array_parallelism"] = req.array_parallelism
    return params


def sbatch_text(req: Request, cfg: Config) -> str:
    """The sbatch script submitit will submit for this request (shown by --dry-run)."""
    folder = run_dir_for(req, cfg) / "slurm" / "%j"
    params = _slurm_parameters(req, cfg, cfg.name)
    if req.array:
        params["map_count"] = len(req.array)
    python = shlex.quote(sys.executable)
    return _make_sbatch_string(command=f"{python} -u -m submitit.core._submit {shlex.quote(str(folder))}",
                               folder=folder, **params)


@dataclass
class Launched:
    """Handles of what was started, for waiting and reporting."""

    executor: str
    run_dirs: list[Path]
    jobs: list[Any] = field(default_factory=list)  # submitit jobs (slurm)
    procs: list[subprocess.Popen] = field(default_factory=list)  # mpiexec processes (local)
    logs: list[Path] = field(default_factory=list)
    stale_summaries: list[tuple[int, int, int] | None] = field(default_factory=list)  # per run dir, at submission
    started: float = field(default_factory=time.monotonic)

    def describe(self) -> str:
        if self.executor == "slurm":
            ids = ", ".join(str(j.job_id) for j in self.jobs)
            return f"submitted Slurm job {ids}; logs {self.logs[0].parent}; run dir {self.run_dirs[0].parent if len(self.run_dirs) > 1 else self.run_dirs[0]}"
        return (f"started {len(self.procs)} local mpiexec run(s) (pid {', '.join(str(p.pid) for p in self.procs)}: "
                f"kill -USR2 <pid> stops it with a checkpoint); output in {', '.join(map(str, self.logs))}")


def submit_slurm(req: Request, cfg: Config) -> Launched:
    base = run_dir_for(req, cfg)
    folder = base / "slurm" / "%j"
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=30)
    ex.update_parameters(**_slurm_parameters(req, cfg, cfg.name))
    tasks = req.array or [None]
    calls, dirs = [], []
    for t in tasks:
        sets, d = task_overrides(req, cfg, t)
        calls.append(RankProgram(str(Path(req.job_file).resolve()), sets, str(d)))
        dirs.append(d)
    stale = [summary_signature(d) for d in dirs]
    try:
        if req.array:
            with ex.batch():
                jobs = [ex.submit(c) for c in calls]
        else:
            jobs = [ex.submit(calls[0])]
    except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError) as e:
        raise LaunchError(f"sbatch refused the job: {str(e).strip() or type(e).__name__}") from e
    return Launched("slurm", dirs, jobs=jobs, logs=[Path(str(j.paths.stderr)) for j in jobs], stale_summaries=stale)


def find_mpiexec() -> str:
    """The mpiexec next to this interpreter (the venv's mpich wheel), else the one on PATH."""
    from .mpirun import MpiexecNotFound, find_mpiexec as find

    try:
        return find()
    except MpiexecNotFound as e:
        raise LaunchError(str(e)) from None


def submit_local(req: Request, cfg: Config) -> Launched:
    """Start the job's ranks on this machine with mpiexec (array tasks up to %P at a time).

    Each run is ``python -m podracer_hpc.mpirun -n <ranks> ...``: the signal relay in front of
    mpiexec (podracer_hpc/mpirun.py), so that USR1/USR2/TERM sent to the pid printed here stop
    every rank with a checkpoint (exit 75), as on Slurm.
    """
    launched = Launched("local", [])
    tasks = req.array or [None]
    mpiexec = find_mpiexec()
    for t in tasks:
        sets, d = task_overrides(req, cfg, t)
        d.mkdir(parents=True, exist_ok=True)
        log = d / "launch.log"
        cmd = [sys.executable, "-m", "podracer_hpc.mpirun", "--mpiexec", mpiexec, "-n", str(req.ranks),
               sys.executable, "-m", "podracer_hpc.cli", "train", str(Path(req.job_file).resolve()), "--run-dir",
               str(d), *sum((["--set", s] for s in sets), [])]
        if req.array_parallelism:
            while sum(p.poll() is None for p in launched.procs) >= req.array_parallelism:
                time.sleep(0.2)
        launched.stale_summaries.append(summary_signature(d))
        with open(log, "ab") as f:
            f.write(f"$ {shlex.join(cmd)}\n".encode())
            f.flush()
            launched.procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                                   stdin=subprocess.DEVNULL,
                                                   env={**os.environ, "PYTHONUNBUFFERED": "1"}))
        launched.run_dirs.append(d)
        launched.logs.append(log)
    return launched


# ------------------------------------------------------------------------------------------
# Waiting with progress, never hanging
# ------------------------------------------------------------------------------------------
def progress_line(run_dir: Path) -> str:
    """Rounds, env steps, best evaluation and steps/s of a run, from its HDF5 logs."""
    from .h5log import LogError, read_log

    steps, best, sps, rounds, n = 0, float("-inf"), 0.0, 0, 0
    for p in sorted((run_dir / "logs").glob("*_rank*.h5")):
        try:
            log = read_log(p)
        except (LogError, OSError, KeyError):
            continue
        n += 1
        tr, ev, to = log["train"], log["eval"], log["tournament"]
        if len(tr["env_steps"]):
            steps += int(tr["env_steps"][-1])
            sps += float(tr["steps_per_s"][-1])
        if len(ev["return_mean"]):
            best = max(best, float(ev["return_mean"].max()))
        if len(to["round"]):
            rounds = max(rounds, int(to["round"][-1]) + 1)
    if not n:
        return f"{run_dir.name}: waiting for the ranks to start"
    best_text = f"best eval {best:.1f}" if best > float("-inf") else "best eval n/a"
    return f"{run_dir.name}: {n} pods | {steps:,} env steps | {sps / 1e3:.0f}k steps/s | rounds {rounds} | {best_text}"


class JobError(LaunchError):
    """The job ran (or was queued) but did not complete its training; ``exit_code`` for the CLI."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


# States in which a job will still run, or run again (a requeued job is PENDING again).
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                 "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT", "STOPPED",
                 "POWER_UP_NODE", "UPDATE_DB"}
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


@dataclass
class SlurmJobState:
    """What Slurm says about one job: ``state`` is "" when nothing knows it (any more)."""

    state: str
    reason: str = ""
    restarts: int = 0
    exit_code: str = ""
    source: str = ""  # scontrol | sacct


def _scontrol_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for tok in text.split():
        k, eq, v = tok.partition("=")
        if eq and k not in fields:
            fields[k] = v
    return fields


def slurm_job_state(job_id: str) -> SlurmJobState | None:
    """The job's state, from slurmctld (``scontrol``: live jobs, and ended ones for MinJobAge
    seconds, with or without accounting), else from ``sacct`` (accounting, if any).

    Returns None when Slurm could not be asked right now (slurmctld busy): ask again later.
    """
    try:
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode == 0 and out.stdout.strip():
        f = _scontrol_fields(out.stdout.splitlines()[0])
        restarts = int(f["Restarts"]) if f.get("Restarts", "").isdigit() else 0
        return SlurmJobState(f.get("JobState", "UNKNOWN"), f.get("Reason", ""), restarts, f.get("ExitCode", ""),
                             "scontrol")
    if "invalid job id" not in (out.stderr + out.stdout).lower():
        return None  # slurmctld did not answer: not the same as "gone"
    try:
        acct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        acct = None
    if acct is not None and acct.returncode == 0:
        for line in acct.stdout.splitlines():
            state, _, code = line.strip().partition("|")
            if state:
                return SlurmJobState(state.split()[0], "", 0, code, "sacct")
    return SlurmJobState("")


def job_state(job_id: str) -> str:
    """The job's state name ("" when Slurm no longer knows it)."""
    st = slurm_job_state(job_id)
    return st.state if st else "UNKNOWN"


def summary_signature(run_dir: Path) -> tuple[int, int, int] | None:
    """Identity of the summary.json there now (None if none): taken at submission, so that an
    earlier run's summary in a reused run directory is never taken for this job's (no clocks
    compared: a shared filesystem's server clock may differ from this host's)."""
    try:
        st = (run_dir / "summary.json").stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_summary(run_dir: Path, stale: tuple[int, int, int] | None = None) -> dict[str, Any] | None:
    """The run's summary.json, unless it is the one that was there at submission (``stale``)."""
    sig = summary_signature(run_dir)
    if sig is None or sig == stale:
        return None
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _complete(summary: dict[str, Any] | None) -> bool:
    return summary is not None and summary.get("complete", True) is not False


def _incomplete_text(summary: dict[str, Any] | None, run_dir: Path) -> str:
    if summary is None:
        return f"it wrote no summary ({run_dir / 'summary.json'})"
    return (f"its summary says it stopped early ({summary.get('env_steps', '?'):,} env steps; \"complete\": false; "
            f"the checkpoints in {run_dir} resume it)" if isinstance(summary.get("env_steps"), int)
            else f"its summary says it stopped early (\"complete\": false; {run_dir / 'summary.json'})")


@dataclass
class _Watch:
    """What wait() remembers about one Slurm job between polls."""

    seen: bool = False
    last: str = ""
    restarts: int = 0
    ended_at: float | None = None  # monotonic time the job was first seen ended or gone
    ended_state: str = ""


def _slurm_step(launched: "Launched", i: int, w: _Watch, out: Any, confirm_s: float) -> bool:
    """One poll of Slurm job i: True when it completed its training; raises JobError when it will not."""
    job, d = launched.jobs[i], launched.run_dirs[i]
    log = Path(str(job.paths.stderr))
    st = slurm_job_state(str(job.job_id))
    if st is None:
        return False  # slurmctld busy: ask again
    now = time.monotonic()
    if st.state:
        w.seen = True
        label = st.state + (f" ({st.reason})" if st.reason and st.reason not in ("None", "") else "")
        if st.restarts > w.restarts:
            w.restarts = st.restarts
            print(f"job {job.job_id}: requeued (start {st.restarts + 1}); it resumes from {d}", file=out, flush=True)
        if label != w.last:
            w.last = label
            print(f"job {job.job_id}: {label}", file=out, flush=True)
    if st.state in ACTIVE_STATES or st.state.startswith("REQUEUE"):
        w.ended_at = None
        if st.state == "PENDING" and st.reason in NEVER_STARTS:
            raise JobError(f"Slurm job {job.job_id} cannot start: {st.reason} (it asks for {NEVER_STARTS[st.reason]}). "
                           f"It stays queued until you cancel it (scancel {job.job_id}) and submit a request that fits.")
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
    summary = read_summary(d, launched.stale_summaries[i])
    state = st.state or "gone from the queue, and Slurm keeps no record of it (no accounting)"
    if st.state == "COMPLETED" or not st.state:
        if _complete(summary):
            return True
        raise JobError(f"Slurm job {job.job_id} ended {state} without completing its training: "
                       f"{_incomplete_text(summary, d)}; see {log}:\n" + _tail(log))
    code = f", exit code {st.exit_code}" if st.exit_code and st.exit_code != "0:0" else ""
    raise JobError(f"Slurm job {job.job_id} ended {state}{code}: {_incomplete_text(summary, d)}; see {log}:\n"
                   + _tail(log))


def _local_step(launched: "Launched", i: int) -> bool:
    p, d, log = launched.procs[i], launched.run_dirs[i], launched.logs[i]
    if p.poll() is None:
        return False
    rc = p.returncode
    summary = read_summary(d, launched.stale_summaries[i])
    if rc == 0 and _complete(summary):
        return True
    if rc == 75:
        raise JobError(f"local run {d} stopped early (exit 75): every rank checkpointed; submit the same command "
                       f"again to resume; see {log}", exit_code=75)
    why = f"exit {rc}" if rc >= 0 else f"killed by signal {-rc}"
    if rc == 0:
        why += f", but {_incomplete_text(summary, d)}"
    raise JobError(f"local run {d} failed ({why}); see {log}:\n" + _tail(log))


def wait(launched: Launched, timeout_s: float, poll_s: float = 3.0, out: Any = None,
         confirm_s: float = 4.0) -> list[dict[str, Any]]:
    """Wait for every job with progress lines; returns the summaries of jobs that completed their
    training. Raises JobError as soon as one job ends without completing (failed, cancelled,
    stopped, gone from the queue with no complete summary, or pending for a reason that never
    resolves), naming its state and log, within ``poll_s + confirm_s`` seconds of Slurm saying so;
    a requeued job is waited for. Raises LaunchError after ``timeout_s``.
    """
    out = out or sys.stderr
    deadline = time.monotonic() + timeout_s
    last: dict[str, str] = {}
    watches = [_Watch() for _ in launched.run_dirs]
    done: set[int] = set()
    while True:
        for i, d in enumerate(launched.run_dirs):
            if i in done:
                continue
            line = progress_line(d)
            if last.get(str(d)) != line:
                print(line, file=out, flush=True)
                last[str(d)] = line
            finished = (_local_step(launched, i) if launched.executor == "local"
                        else _slurm_step(launched, i, watches[i], out, confirm_s))
            if finished:
                done.add(i)
        if len(done) == len(launched.run_dirs):
            break
        if time.monotonic() > deadline:
            raise JobError(f"gave up waiting after {timeout_s:.0f} s; the job goes on: "
                           f"podracer status {launched.run_dirs[0]}")
        time.sleep(poll_s)
    summaries = []
    for i, d in enumerate(launched.run_dirs):
        summaries.append(read_summary(d, launched.stale_summaries[i]))
    return summaries


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return "  (no log file yet)"
    return "\n".join("  " + x for x in lines)


__all__ = ["Request", "LaunchError", "JobError", "ConfigError", "validate", "sbatch_text", "submit_slurm",
           "submit_local", "wait", "parse_array", "RankProgram", "progress_line", "slurm_job_state"]
