"""Failed parts come back alone: ``podracer submit --wait --retries K`` and ``podracer resume
RUN_DIR --retries K`` resubmit a part whose job failed, hung or was ended by the system, from its
checkpoints, up to K times, with ``--exclude`` of the node that failed.

What is retried (:func:`judge`, pure):

- a world that ended itself because a rank missed a meeting's deadline (exit 76,
  ``parts/part<k>.hung.json``): the hung ranks' nodes are excluded;
- a part whose every pod went silent while Slurm says it runs (a frozen node, a stopped process:
  nobody in its world can tell): the watcher cancels it, records the hang, and retries it
  excluding the silent pods' nodes (:meth:`Retrier.running`);
- FAILED (a rank crashed: the node srun names first in the job's output, else the job's nodes),
  NODE_FAIL and BOOT_FAIL (the job's nodes), OUT_OF_MEMORY (the job's nodes), PREEMPTED,
  TIMEOUT and DEADLINE (no node is at fault), CANCELLED by another user than you (an admin,
  the system);
- never: CANCELLED by you (sacct's ``CANCELLED by <your uid>``; without accounting nobody can
  tell who cancelled, and a cancel is taken as yours), a job that completed, a job Slurm no longer
  knows.

Every retry is a row of ``retries.jsonl`` (files/retries.py) and of the watcher's output; K
bounds a part's retries over every watcher (the rows are counted), and a part's excluded nodes
are kept in ``pool.json``.
"""

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
from podracer_hpc.files import heartbeat
from podracer_hpc.files.retries import append_retry, read_retries, retries_of
from podracer_hpc.files.rundir import EXIT_HUNG, RunDir
from podracer_hpc.launch.errors import JobError
from podracer_hpc.launch.watch import Job, Launched

__all__ = ["Retrier", "Verdict", "judge", "silent_nodes"]

# states retried, what the row says, and whether the job's nodes are suspect
RETRIED = {
    "FAILED": ("failed", True),
    "NODE_FAIL": ("node failure", True),
    "BOOT_FAIL": ("node boot failure", True),
    "OUT_OF_MEMORY": ("out of memory", True),
    "PREEMPTED": ("preempted", False),
    "TIMEOUT": ("time limit", False),
    "DEADLINE": ("deadline", False),
}
SILENCE_MARGIN_S = 10.0  # beyond a part's deadline before the watcher takes its silence as a hang


@dataclass
class Verdict:
    """Whether a job's end is retried, why (the row's reason), and the nodes to exclude."""

    retry: bool
    reason: str
    nodes: list[str] = field(default_factory=list)


def _hung_nodes(hang: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for h in hang.get("hung") or []:
        node = isinstance(h, dict) and (h.get("node") or h.get("host"))
        if node and node not in out:
            out.append(str(node))
    return out


def judge(
    end: jobstate.JobEnd | None, hang: dict[str, Any] | None, log_text: str, own: Verdict | None, uid: int
) -> Verdict:
    """How a job that ended without completing its part is handled: ``end`` (what Slurm says),
    ``hang`` (the part's hang record of this job, if any), ``log_text`` (the job's output: srun
    names the node of a task that died), ``own`` (the watcher cancelled it itself: its verdict),
    ``uid`` (the user's)."""
    if own is not None:
        return own
    if hang is not None:
        return Verdict(True, f"hung (exit {EXIT_HUNG}): a rank missed a meeting's deadline", _hung_nodes(hang))
    if end is None or not end.state:
        return Verdict(False, "Slurm keeps no record of how it ended (gone from the queue, no accounting)")
    if end.state == "CANCELLED":
        if end.by_uid is None:
            return Verdict(False, "cancelled (Slurm keeps no record of who cancelled it: taken as yours)")
        if end.by_uid == uid:
            return Verdict(False, f"cancelled by you (uid {uid})")
        return Verdict(True, f"cancelled by uid {end.by_uid} (not you: the system or an administrator)")
    if end.state not in RETRIED:
        return Verdict(False, f"ended {end.state}")
    what, suspect = RETRIED[end.state]
    code = f", exit code {end.exit_code}" if end.exit_code and end.exit_code not in ("0:0", "") else ""
    if end.exit_code.split(":")[0] == str(EXIT_HUNG):
        what = f"hung (exit {EXIT_HUNG})"
    named = jobstate.srun_failed_nodes(log_text)[:1] if end.state == "FAILED" else []
    nodes = named or ([n for n in end.nodes.split(",") if n] if suspect and end.nodes else [])
    return Verdict(True, f"{what}{code}" + (f" (srun: a task died on {named[0]})" if named else ""), nodes)


def silent_nodes(
    beats: dict[int, dict[str, Any]], pods: range, job: str, limit_s: float, now: float
) -> list[str] | None:
    """The nodes of a part whose every pod (heartbeats ``beats`` of job ``job``) has been silent
    ``limit_s`` or more; None when a pod of it still beats, or has not beaten in this job yet."""
    if not pods or any((beats.get(p) or {}).get("job") != job for p in pods):
        return None
    if any(heartbeat.age(beats.get(p), now) < limit_s for p in pods):
        return None
    return sorted({str(b.get("node") or b.get("host")) for b in beats.values()})


def _log_text(path: Path, limit: int = 1 << 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


class Retrier:
    """The retry hook of :func:`watch.wait` for the jobs of ``launched``: ``resubmit(part,
    exclude)`` submits a part again (returns its new job); ``retries``: K."""

    def __init__(
        self,
        launched: Launched,
        retries: int,
        resubmit: Callable[[int, list[str]], Job],
        excluded: dict[int, list[str]],
        out: Any = None,
    ):
        self.launched, self.retries, self.resubmit, self.out = launched, retries, resubmit, out or sys.stderr
        self.rundir = RunDir(launched.run_dirs[0])
        self.excluded = {k: list(v) for k, v in excluded.items()}
        self.own: dict[str, Verdict] = {}  # jobs the watcher cancelled itself, and why

    def part(self, i: int) -> int:
        """The pool part job i runs (0: a job of its own)."""
        if not self.launched.parts:
            return 0
        r = self.launched.parts[i]
        return r.start // len(r)

    def pods(self, i: int) -> range:
        return self.launched.parts[i] if self.launched.parts else range(self.launched.pool_jobs or 0)

    def ended(self, i: int, error: JobError) -> Job:
        """Job i ended without completing: its replacement, or ``error`` (with why it is not retried)."""
        job, k = self.launched.jobs[i], self.part(i)
        hang = heartbeat.read_hang(self.rundir, k)
        hang = hang if hang is not None and str(hang.get("job")) == job.job_id else None
        verdict = judge(
            jobstate.job_end(job.job_id), hang, _log_text(job.log), self.own.pop(job.job_id, None), os.getuid()
        )
        done = len(retries_of(read_retries(self.rundir), k))
        if not verdict.retry:
            raise JobError(f"{error}\nnot retried: {verdict.reason}", error.exit_code) from None
        if done >= self.retries:
            raise JobError(
                f"{error}\nnot retried: part {k} has had its {self.retries} retries ({verdict.reason})"
            ) from None
        exclude = list(dict.fromkeys([*self.excluded.get(k, []), *verdict.nodes]))
        new = self.resubmit(k, exclude)
        self.excluded[k] = exclude
        append_retry(self.rundir, k, job.job_id, new.job_id, verdict.reason, exclude, done + 1)
        print(
            f"part {k}: job {job.job_id} {verdict.reason}: retry {done + 1} of {self.retries} as job {new.job_id}"
            + (f", excluding {','.join(exclude)}" if exclude else "")
            + f" (from its checkpoints; {self.rundir.retries_file})",
            file=self.out,
            flush=True,
        )
        return new

    def running(self, i: int) -> None:
        """Job i runs: if every pod of its part has been silent past the part's deadline (its
        aggregate says it; only then are its heartbeats read), cancel it as hung."""
        job, k = self.launched.jobs[i], self.part(i)
        if job.job_id in self.own:
            return
        agg = heartbeat.read_aggregate(self.rundir, k)
        if agg is None or str(agg.get("job")) != job.job_id or agg.get("state") != "running":
            return
        limit = float(agg.get("deadline_s") or 300.0) + max(SILENCE_MARGIN_S, 2 * float(agg.get("interval_s") or 0))
        now = time.time()
        if heartbeat.age({"t": agg.get("written")}, now) < limit:
            return
        pods = self.pods(i)
        beats = heartbeat.read_beats(self.rundir, pods)
        nodes = silent_nodes(beats, pods, job.job_id, limit, now)
        if nodes is None:
            return
        quiet = min(heartbeat.age(b, now) for b in beats.values())
        reason = f"hung: every pod silent for {quiet:.0f} s (deadline {limit:.0f} s) while Slurm ran it"
        record = {
            "job": job.job_id,
            "wait": "silence",
            "seq": -1,
            "waited_s": round(quiet, 1) if math.isfinite(quiet) else None,
            "deadline_s": limit,
            "detected_by": {"watcher": f"pid {os.getpid()}"},
            "hung": [
                {
                    "pod": p,
                    **{x: beats[p].get(x) for x in ("rank", "host", "node", "device", "pid", "job", "update", "doing")},
                }
                for p in sorted(beats)
            ],
            "busy": [],
        }
        try:
            heartbeat.write_hang(self.rundir, k, record)
        except OSError:
            pass  # the verdict below still names them
        self.own[job.job_id] = Verdict(True, reason, nodes)
        print(
            f"part {k}: job {job.job_id} {reason}; cancelling it (nodes {','.join(nodes)})", file=self.out, flush=True
        )
        subprocess.run(["scancel", job.job_id], check=False, capture_output=True, timeout=60)
