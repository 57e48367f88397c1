"""This machine: a job's ranks under ``mpiexec``, behind the signal relay, no cluster needed;
and any other command (a study's RLlib run) with its output in a run directory's log."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from podracer_hpc.config import Config
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.launch.errors import LaunchError
from podracer_hpc.launch.request import Request, run_dir_for, task_overrides
from podracer_hpc.launch.watch import Launched, summary_signature

__all__ = ["find_mpiexec", "start_command", "stop", "submit"]


def find_mpiexec() -> str:
    """The mpiexec next to this interpreter (the venv's mpich wheel), else the one on PATH."""
    from podracer_hpc.cluster.mpirun import MpiexecNotFound
    from podracer_hpc.cluster.mpirun import find_mpiexec as find

    try:
        return find()
    except MpiexecNotFound as e:
        raise LaunchError(str(e)) from None


def start_command(
    cmd: list[str], run_dir: Path, launched: Launched, env: dict[str, str] | None = None, log: Path | None = None
) -> None:
    """Start ``cmd`` in its own session, its output appended to ``log`` (default
    ``<run_dir>/launch.log``); add it to ``launched`` (watched by :func:`watch.wait` like a job)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = log or RunDir(run_dir).launch_log
    launched.stale_summaries.append(summary_signature(run_dir))
    with open(log, "ab") as f:
        f.write(f"$ {shlex.join(cmd)}\n".encode())
        f.flush()
        launched.procs.append(
            subprocess.Popen(
                cmd,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )
        )
    launched.run_dirs.append(run_dir)
    launched.logs.append(log)


def submit(req: Request, cfg: Config, parts: list[int] | None = None) -> Launched:
    """Start the job's ranks on this machine with mpiexec (array tasks up to %P at a time).

    Each run is ``python -m podracer_hpc.cluster.mpirun -n <ranks> ...``: the signal relay in front of
    mpiexec (podracer_hpc/cluster/mpirun.py), so that USR1/USR2/TERM sent to the pid printed here stop
    every rank with a checkpoint (exit 75), as on Slurm. ``parts``: those parts of a pool of
    several jobs (--pods-per-job), each its own mpiexec world of the part's pods, all at once.
    """
    launched = Launched("local", [])
    mpiexec = find_mpiexec()
    if parts is not None:
        base = RunDir(run_dir_for(req, cfg))
        for g in parts:
            cmd = [
                sys.executable,
                "-m",
                "podracer_hpc.cluster.mpirun",
                "--mpiexec",
                mpiexec,
                "-n",
                str(req.job_ranks),
                sys.executable,
                "-m",
                "podracer_hpc.cli",
                "train",
                str(Path(req.job_file).resolve()),
                "--run-dir",
                str(base.root),
                "--pool-part",
                f"{g}/{req.jobs}",
                *sum((["--set", s] for s in req.overrides), []),
            ]
            start_command(cmd, base.root, launched, log=base.part_launch_log(g))
            launched.parts.append(range(g * req.job_ranks, (g + 1) * req.job_ranks))
        return launched
    for t in req.array or [None]:
        sets, d = task_overrides(req, cfg, t)
        cmd = [
            sys.executable,
            "-m",
            "podracer_hpc.cluster.mpirun",
            "--mpiexec",
            mpiexec,
            "-n",
            str(req.ranks),
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "train",
            str(Path(req.job_file).resolve()),
            "--run-dir",
            str(d),
            *sum((["--set", s] for s in sets), []),
        ]
        if req.array_parallelism:
            while sum(p.poll() is None for p in launched.procs) >= req.array_parallelism:
                time.sleep(0.2)
        start_command(cmd, d, launched)
    return launched


def stop(launched: Launched, timeout_s: float = 60.0) -> None:
    """Stop what is still running of ``launched`` (SIGTERM: behind the relay every rank checkpoints;
    a plain command just ends), waiting up to ``timeout_s`` before SIGKILL."""
    import signal

    for p in launched.procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
    end = time.monotonic() + timeout_s
    for p in launched.procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
