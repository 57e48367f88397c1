"""``podracer jobs RUN_DIR`` and ``podracer cancel RUN_DIR|JOB [--requeue]``: a run's Slurm jobs.

A run directory knows its jobs by name, without asking Slurm: submitit's per-job folders
(``slurm/<job>/``, ``<array>_<task>`` for an array task), a template job's output
(``slurm-<job>.out``) and a pool's ``pool.json`` (the last job of each part). Their states come
from one ``scontrol`` call per distinct job (:func:`jobstate.slurm_job_states`).

Cancelling: ``--requeue`` sends the warning signal (``scancel --signal=USR2 --full``: every rank
finishes its update and checkpoints, and the job is requeued: rank 0 of a submitit job, the batch
shell of a template job, both trap the signal); without it ``scancel`` ends the job for good (the
ranks checkpoint on SIGTERM and exit 75; nothing requeues a CANCELLED job). Either way nothing
trained is lost, and the same submit command (or ``sbatch`` of the same template) resumes it.
A pending job cannot take a signal: ``--requeue`` leaves it queued.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from podracer_hpc.cluster import jobstate
from podracer_hpc.files.bounded import read_json
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.launch.errors import LaunchError
from podracer_hpc.launch.watch import still_active

__all__ = ["cancel", "jobs_of", "jobs_table"]

_JOB = re.compile(r"^[0-9]+(_[0-9]+)?$")
_TEMPLATE_OUT = re.compile(r"^slurm-([0-9]+(?:_[0-9]+)?)\.out$")


def jobs_of(run_dir: Path) -> dict[str, str]:
    """``{job id: what it ran}`` that the run directory names (newest job ids last)."""
    rd = RunDir(run_dir)
    found: dict[str, str] = {}
    folder = rd.root / "slurm"
    if folder.is_dir():
        for p in folder.iterdir():
            if _JOB.match(p.name):
                found[p.name] = "podracer submit"
    for p in rd.root.glob("slurm-*.out"):
        m = _TEMPLATE_OUT.match(p.name)
        if m:
            found[m.group(1)] = "template"
    try:
        pool = read_json(rd.pool_file, what="pool record")
        for part, job in sorted((pool.get("parts") or {}).items(), key=lambda kv: int(kv[0])):
            if job.get("executor") == "slurm" and job.get("job"):
                found[str(job["job"])] = f"part {part} of the pool"
    except (OSError, ValueError, AttributeError):
        pass

    def key(j: str) -> tuple[int, int]:
        a, _, b = j.partition("_")
        return int(a), int(b or -1)

    return {j: found[j] for j in sorted(found, key=key)}


def _run_dir_or_job(target: str) -> tuple[Path | None, dict[str, str]]:
    if _JOB.match(target) and not Path(target).exists():
        return None, {target: "job"}
    d = Path(target)
    if not d.is_dir():
        raise LaunchError(f"{target}: neither a run directory nor a Slurm job id (12345 or 12345_7)")
    jobs = jobs_of(d)
    if not jobs:
        raise LaunchError(
            f"{d}: no Slurm job of this run directory is known (no slurm/<job>/ folder, "
            "slurm-<job>.out or pool.json): was it run on this machine (--executor local)?"
        )
    return d, jobs


def _states(jobs: list[str]) -> dict[str, Any]:
    if shutil.which("scontrol") is None:
        raise LaunchError("no scontrol here: run this on a login node of the cluster that runs the job")
    return jobstate.slurm_job_states(jobs)


def jobs_table(target: str) -> list[str]:
    """Lines: each job of a run directory (or one job) with its state, reason, requeues and exit code."""
    _, jobs = _run_dir_or_job(target)
    states = _states(list(jobs))
    lines = [f"{'job':<14} {'state':<24} {'requeues':>8} {'exit':>6}  what"]
    for j, what in jobs.items():
        st = states.get(j)
        if st is None:
            lines.append(f"{j:<14} {'(slurmctld did not answer)':<24} {'':>8} {'':>6}  {what}")
            continue
        label = st.state or "gone (no record)"
        if st.reason and st.reason not in ("None", "(null)", ""):
            label += f" ({st.reason})"
        lines.append(f"{j:<14} {label:<24} {st.restarts:>8} {st.exit_code or '':>6}  {what}")
    return lines


def _live(st: Any) -> bool:
    return st is not None and bool(st.state) and still_active(st.state)


def cancel(target: str, requeue: bool) -> list[str]:
    """Cancel (or, ``requeue``, checkpoint and requeue) the queued and running jobs of a run
    directory, or one job; returns what was done, a line per job. Raises LaunchError when nothing
    could be asked or no job of it is queued or running."""
    _, jobs = _run_dir_or_job(target)
    states = _states(list(jobs))
    live = [j for j in jobs if _live(states.get(j))]
    if not live:
        raise LaunchError(f"{target}: none of its jobs ({', '.join(jobs)}) is queued or running; nothing to cancel")
    out = []
    for j in live:
        st = states[j]
        if requeue and st.state == "PENDING":
            out.append(f"job {j}: PENDING, left queued (a pending job takes no signal; it starts from its checkpoints)")
            continue
        cmd = ["scancel", "--signal=USR2", "--full", j] if requeue else ["scancel", j]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise LaunchError(f"{' '.join(cmd)} failed: {(r.stderr or r.stdout).strip()}")
        out.append(
            f"job {j}: "
            + (
                "warning signal sent: its ranks checkpoint, then it is requeued and resumes"
                if requeue
                else "cancelled: its ranks checkpoint and end (exit 75); the same submit command resumes the run"
            )
        )
    return out
