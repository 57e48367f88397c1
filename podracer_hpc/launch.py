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

TERMINAL_FAILED = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                   "PREEMPTED"}


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
            subprocess.run(["scontrol", "requeue", job], check=False, timeout=60)
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

    def describe(self) -> str:
        if self.executor == "slurm":
            ids = ", ".join(str(j.job_id) for j in self.jobs)
            return f"submitted Slurm job {ids}; logs {self.logs[0].parent}; run dir {self.run_dirs[0].parent if len(self.run_dirs) > 1 else self.run_dirs[0]}"
        return f"started {len(self.procs)} local mpiexec run(s) (pid {', '.join(str(p.pid) for p in self.procs)}); output in {', '.join(map(str, self.logs))}"


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
    if req.array:
        with ex.batch():
            jobs = [ex.submit(c) for c in calls]
    else:
        jobs = [ex.submit(calls[0])]
    return Launched("slurm", dirs, jobs=jobs, logs=[Path(str(jobs[0].paths.stderr))])


def find_mpiexec() -> str:
    """The mpiexec next to this interpreter (the venv's mpich wheel), else the one on PATH."""
    exe = Path(sys.executable).parent / "mpiexec"
    found = str(exe) if exe.exists() else shutil.which("mpiexec")
    if not found:
        raise LaunchError("--executor local needs mpiexec: pip install mpich (or load your MPI module)")
    return found


def submit_local(req: Request, cfg: Config) -> Launched:
    """Start the job's ranks on this machine with mpiexec (array tasks up to %P at a time)."""
    launched = Launched("local", [])
    tasks = req.array or [None]
    for t in tasks:
        sets, d = task_overrides(req, cfg, t)
        d.mkdir(parents=True, exist_ok=True)
        log = d / "launch.log"
        cmd = [find_mpiexec(), "-n", str(req.ranks), sys.executable, "-m", "podracer_hpc.cli", "train",
               str(Path(req.job_file).resolve()), "--run-dir", str(d), *sum((["--set", s] for s in sets), [])]
        if req.array_parallelism:
            while sum(p.poll() is None for p in launched.procs) >= req.array_parallelism:
                time.sleep(0.2)
        with open(log, "ab") as f:
            f.write(f"$ {shlex.join(cmd)}\n".encode())
            f.flush()
            launched.procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
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
    return (f"{run_dir.name}: {n} pods | {steps:,} env steps | {sps / 1e3:.0f}k steps/s | rounds {rounds} | "
            f"best eval {best:.1f}" if best > float("-inf") else "best eval n/a")


def _sacct_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True,
                         timeout=30)
    states = [s.split()[0] for s in out.stdout.split() if s.strip()]
    return states[0] if states else "UNKNOWN"


def _squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""


def job_state(job_id: str) -> str:
    """The job's state from squeue (live) or sacct (finished)."""
    return _squeue_state(job_id) or _sacct_state(job_id)


def wait(launched: Launched, timeout_s: float, poll_s: float = 3.0, out: Any = None) -> list[dict[str, Any]]:
    """Wait for every job with progress lines; returns the summaries, raises LaunchError on failure."""
    out = out or sys.stderr
    deadline = time.monotonic() + timeout_s
    last: dict[str, str] = {}
    while True:
        done = []
        for i, d in enumerate(launched.run_dirs):
            line = progress_line(d)
            if last.get(str(d)) != line:
                print(line, file=out, flush=True)
                last[str(d)] = line
            if launched.executor == "local":
                p = launched.procs[i]
                if p.poll() is not None:
                    if p.returncode != 0:
                        raise LaunchError(f"local run {d} failed (exit {p.returncode}); see {launched.logs[i]}:\n"
                                          + _tail(launched.logs[i]))
                    done.append(i)
            else:
                job = launched.jobs[i]
                state = job_state(str(job.job_id))
                if state in TERMINAL_FAILED:
                    raise LaunchError(f"Slurm job {job.job_id} ended {state}; see {job.paths.stderr}:\n"
                                      + _tail(Path(str(job.paths.stderr))))
                if state == "COMPLETED" or (state in ("", "UNKNOWN") and (d / "summary.json").exists()):
                    done.append(i)
                elif last.get(f"state{i}") != state:
                    last[f"state{i}"] = state
                    print(f"job {job.job_id}: {state}", file=out, flush=True)
        if len(done) == len(launched.run_dirs):
            break
        if time.monotonic() > deadline:
            raise LaunchError(f"gave up waiting after {timeout_s:.0f} s; the job goes on: "
                              f"podracer status {launched.run_dirs[0]}")
        time.sleep(poll_s)
    summaries = []
    for d in launched.run_dirs:
        p = d / "summary.json"
        for _ in range(50):  # the filesystem may lag behind the job's end (shared filesystems)
            if p.exists():
                break
            time.sleep(0.2)
        if not p.exists():
            raise LaunchError(f"{d}: the job ended but wrote no summary.json; see {launched.logs[0]}")
        summaries.append(json.loads(p.read_text()))
    return summaries


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return "  (no log file yet)"
    return "\n".join("  " + x for x in lines)


__all__ = ["Request", "LaunchError", "ConfigError", "validate", "sbatch_text", "submit_slurm", "submit_local",
           "wait", "parse_array", "RankProgram", "progress_line"]
