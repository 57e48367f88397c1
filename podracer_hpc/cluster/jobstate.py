"""What Slurm says about jobs: ``scontrol`` (live jobs, and ended ones for MinJobAge seconds), else
``sacct`` (accounting, if any). No submitit, no MPI: ``podracer status`` and ``--wait`` ask here.

A monitor asks about many jobs at once: :func:`slurm_job_states` makes one ``scontrol -o show
job <id>`` call per distinct job (an array's tasks are one job: one call answers for all of them,
the pending remainder included) and, only for tasks slurmctld no longer knows, one ``sacct``
call. :func:`slurm_job_state` asks about one job.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Iterable

__all__ = [
    "JobEnd",
    "SlurmJobState",
    "job_end",
    "parse_end",
    "parse_scontrol",
    "parse_sacct",
    "slurm_job_state",
    "slurm_job_states",
    "srun_failed_nodes",
    "task_ids",
]

TIMEOUT_S = 30


@dataclass
class SlurmJobState:
    """What Slurm says about one job: ``state`` is "" when nothing knows it (any more)."""

    state: str
    reason: str = ""
    restarts: int = 0
    exit_code: str = ""
    source: str = ""  # scontrol | sacct
    nodes: str = ""  # the nodes it runs on (scontrol's NodeList; "" when none yet, or from sacct)


def _scontrol_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for tok in text.split():
        k, eq, v = tok.partition("=")
        if eq and k not in fields:
            fields[k] = v
    return fields


def task_ids(spec: str) -> list[int]:
    """The task indices of an array task spec as Slurm prints it: ``4``, ``2-99``, ``2-99%4``
    (at most 4 at once), ``1,3,5-7``, ``0-9:2`` (a step), ``[2-5]``."""
    out: list[int] = []
    for part in spec.strip("[]").split("%")[0].split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if not m:
            continue
        lo = int(m[1])
        hi = int(m[2]) if m[2] else lo
        out += range(lo, hi + 1, int(m[3]) if m[3] else 1)
    return out


def parse_scontrol(text: str) -> dict[str, SlurmJobState]:
    """``scontrol -o show job`` output (one job or array record per line) as ``{job id: state}``;
    an array task is ``<array job>_<task>``, a record that stands for several pending tasks
    gives each of them."""
    out: dict[str, SlurmJobState] = {}
    for line in text.splitlines():
        f = _scontrol_fields(line)
        if "JobId" not in f:
            continue
        restarts = int(f["Restarts"]) if f.get("Restarts", "").isdigit() else 0
        st = SlurmJobState(
            f.get("JobState", "UNKNOWN"),
            f.get("Reason", ""),
            restarts,
            f.get("ExitCode", ""),
            "scontrol",
            "" if f.get("NodeList", "(null)") == "(null)" else f.get("NodeList", ""),
        )
        array, tasks = f.get("ArrayJobId", ""), f.get("ArrayTaskId", "")
        if array and tasks and array != "(null)":
            for t in task_ids(tasks):
                out[f"{array}_{t}"] = st
        else:
            out[f["JobId"]] = st
    return out


def parse_sacct(text: str) -> dict[str, SlurmJobState]:
    """``sacct -n -X -P -o JobID,State,ExitCode`` output as ``{job id: state}`` (``123_4``, and
    ``123_[5-9]`` for tasks that never started)."""
    out: dict[str, SlurmJobState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[1]:
            continue
        job, state, code = parts[0], parts[1].split()[0], parts[2] if len(parts) > 2 else ""
        base, us, tasks = job.partition("_")
        st = SlurmJobState(state, "", 0, code, "sacct")
        if us:
            for t in task_ids(tasks):
                out.setdefault(f"{base}_{t}", st)
        else:
            out.setdefault(job, st)
    return out


def _run(cmd: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def slurm_job_states(job_ids: Iterable[str]) -> dict[str, SlurmJobState | None]:
    """The states of ``job_ids`` (plain ids and ``<array>_<task>`` ids), in as few scheduler calls
    as Slurm allows: one ``scontrol`` call per distinct job (all tasks of one array: one call),
    then one ``sacct`` call for the ids slurmctld no longer knows (their state is "" when
    accounting does not know them either). An id whose state could not be asked right now
    (slurmctld busy) maps to None: ask again later."""
    ids = list(dict.fromkeys(str(j) for j in job_ids))
    bases = list(dict.fromkeys(j.split("_")[0] for j in ids))
    known: dict[str, SlurmJobState] = {}
    unanswered: set[str] = set()
    for base in bases:
        out = _run(["scontrol", "-o", "show", "job", base])
        if out is not None and out.returncode == 0 and out.stdout.strip():
            known.update(parse_scontrol(out.stdout))
        elif out is None or "invalid job id" not in (out.stderr + out.stdout).lower():
            unanswered.add(base)  # slurmctld did not answer: not the same as "gone"
    result: dict[str, SlurmJobState | None] = {}
    gone = [j for j in ids if j not in known and j.split("_")[0] not in unanswered]
    acct: dict[str, SlurmJobState] = {}
    if gone:
        out = _run(
            [
                "sacct",
                "-n",
                "-X",
                "-P",
                "-j",
                ",".join(dict.fromkeys(j.split("_")[0] for j in gone)),
                "-o",
                "JobID,State,ExitCode",
            ]
        )
        if out is not None and out.returncode == 0:
            acct = parse_sacct(out.stdout)
    for j in ids:
        tasks = [k for k in known if k.startswith(j + "_")] if "_" not in j and j not in known else []
        if j in known or tasks:  # an array's own id: its first task, as `scontrol show job` lists it first
            result[j] = known[j] if j in known else known[tasks[0]]
        elif j.split("_")[0] in unanswered:
            result[j] = None
        else:
            result[j] = acct.get(j, SlurmJobState(""))
    return result


def slurm_job_state(job_id: str) -> SlurmJobState | None:
    """The job's state, from slurmctld (``scontrol``: live jobs, and ended ones for MinJobAge
    seconds, with or without accounting), else from ``sacct`` (accounting, if any).

    Returns None when Slurm could not be asked right now (slurmctld busy): ask again later.
    """
    return slurm_job_states([job_id])[job_id]


@dataclass
class JobEnd:
    """How a job that ended ended: its state, who cancelled it (``by_uid``: sacct's ``CANCELLED by
    UID``; None when unknown: no accounting, or not cancelled), its exit code and its nodes."""

    state: str
    by_uid: int | None = None
    exit_code: str = ""
    nodes: str = ""


def parse_end(text: str, job_id: str) -> JobEnd | None:
    """``sacct -n -X -P -o JobID,State,ExitCode,NodeList`` output: the record of ``job_id`` (an
    array task ``123_4`` as sacct prints it), None when it is not there."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or parts[0] != job_id or not parts[1]:
            continue
        words = parts[1].split()
        uid = int(words[2]) if len(words) == 3 and words[1] == "by" and words[2].isdigit() else None
        return JobEnd(words[0], uid, parts[2], "" if parts[3] in ("None assigned", "(null)") else parts[3])
    return None


def job_end(job_id: str) -> JobEnd | None:
    """How ``job_id`` ended, from accounting (``sacct``: the state, who cancelled it, the nodes),
    else from slurmctld (``scontrol``, for MinJobAge seconds: no canceller); None when neither knows."""
    out = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State,ExitCode,NodeList"])
    end = parse_end(out.stdout, job_id) if out is not None and out.returncode == 0 else None
    if end is not None:
        return end
    st = slurm_job_state(job_id)
    return JobEnd(st.state, None, st.exit_code, st.nodes) if st is not None and st.state else None


_SRUN_FAILED = re.compile(r"^srun: error: ([^\s:]+): tasks? [0-9,\-]+: (.+)$", re.M)


def srun_failed_nodes(text: str) -> list[str]:
    """The nodes srun names in a job's output for tasks that died or exited non-zero
    (``srun: error: n2: task 1: Killed``, ``srun: error: n1: tasks 0-1: Exited with exit code 3``),
    in the order named; tasks killed by srun itself after another task failed
    (``Terminated``, ``Killed`` after a ``--kill-on-bad-exit``) come after the first."""
    first: list[str] = []
    for node, what in _SRUN_FAILED.findall(text):
        if node not in first:
            first.append(node)
    return first
