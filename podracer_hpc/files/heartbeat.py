"""Signs of life on the shared filesystem: a pod's heartbeat, a part's aggregate, a part's hang.

- **Heartbeat** (``heartbeats/pod<i>.json``, :class:`Heartbeat`): each pod rewrites a small JSON
  record of where it is (host, device, pid, job, what it is doing, its last update, env steps,
  evaluation, rounds) at most every ``interval_s`` between updates, and at once when it begins to
  wait at a meeting (``wait``: the number of the meeting it waits at). A rank that is stopped or
  stuck stops beating: its record's age is how long it has given no sign of life.
- **Aggregate** (``parts/part<k>.json``): a world's rank 0 gathers its pods' heartbeats into one
  record every ``log.aggregate_interval_s`` (and at its end, with the part's final state), so a
  status of 4,096 pods reads a handful of files instead of 4,096 logs.
- **Hang** (``parts/part<k>.hung.json``): a meeting that missed its deadline names the ranks that
  did not come (pool index, world rank, host, device, last update, what they were doing).

Heartbeats and aggregates are replaced by rename without fsync: a reader sees a whole record or
the one before; after a machine crash the record is only older. Nothing here imports torch, h5py
or MPI.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from pathlib import Path
from typing import Any, Iterable

from podracer_hpc.files.atomic import atomic_write_bytes
from podracer_hpc.files.rundir import RunDir

__all__ = [
    "Heartbeat",
    "age",
    "clear_part",
    "describe",
    "read_aggregate",
    "read_aggregates",
    "read_beats",
    "read_hang",
    "write_aggregate",
    "write_hang",
]


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _replace(path: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` as JSON to a temporary name beside ``path``, then rename it there (no fsync)."""
    data = (json.dumps({k: _clean(v) for k, v in obj.items()}) + "\n").encode()
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read(path: Path) -> dict[str, Any] | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


class Heartbeat:
    """One pod's heartbeat writer. ``fixed``: what does not change while it runs (pod, rank, part,
    host, device, pid, job); :meth:`beat` adds the moving fields and writes when ``interval_s``
    has passed since the last write (or ``force``). A write that fails (a full or read-only
    filesystem) is skipped: the run's own writes report that."""

    def __init__(self, rundir: RunDir, pod: int, fixed: dict[str, Any], interval_s: float):
        self.path = rundir.heartbeat(pod)
        self.record: dict[str, Any] = {**fixed, "pod": pod, "wait": -1, "doing": "starting", "t": time.time()}
        self.interval_s = interval_s
        self.last = -math.inf  # monotonic time of the last write
        self.writes = 0

    def beat(self, doing: str | None = None, force: bool = False, **fields: Any) -> bool:
        """Update the record (``doing``, ``fields``); write it if due. Returns whether it wrote."""
        if doing is not None:
            self.record["doing"] = doing
        self.record.update(fields)
        now = time.monotonic()
        if not force and now - self.last < self.interval_s:
            return False
        self.record["t"] = time.time()
        try:
            _replace(self.path, self.record)
        except OSError:
            return False
        self.last = now
        self.writes += 1
        return True


def read_beats(rundir: RunDir, pods: Iterable[int]) -> dict[int, dict[str, Any]]:
    """The readable heartbeats of ``pods`` (a missing or torn one is left out)."""
    out = {}
    for i in pods:
        d = _read(rundir.heartbeat(i))
        if d is not None and d.get("pod") == i:
            out[i] = d
    return out


def age(beat: dict[str, Any] | None, now: float | None = None) -> float:
    """Seconds since ``beat`` was written (inf for none)."""
    if not beat or not isinstance(beat.get("t"), (int, float)):
        return math.inf
    return max(0.0, (time.time() if now is None else now) - float(beat["t"]))


def describe(pod: int, beat: dict[str, Any] | None, now: float | None = None) -> str:
    """``pod 3 (rank 1 of part 1, host n12, cuda:1, pid 4242): last update 12 (24,576 env steps),
    no sign of life for 31 s, was training``; a pod with no heartbeat says so."""
    if not beat:
        return f"pod {pod}: no heartbeat at all (it never got as far as its first update)"
    where = ", ".join(
        str(x)
        for x in (
            f"rank {beat.get('rank')}" + (f" of part {beat['part']}" if beat.get("part") is not None else ""),
            f"host {beat.get('host', '?')}",
            beat.get("device"),
            f"pid {beat.get('pid')}" if beat.get("pid") else None,
        )
        if x
    )
    steps = beat.get("env_steps")
    steps_text = f" ({steps:,} env steps)" if isinstance(steps, int) else ""
    return (
        f"pod {pod} ({where}): last update {beat.get('update', '?')}{steps_text}, no sign of life for "
        f"{age(beat, now):.0f} s, was {beat.get('doing', '?')}"
    )


def write_aggregate(rundir: RunDir, part: int, record: dict[str, Any]) -> None:
    """Part ``part``'s aggregate (``pods``: its pods' heartbeats), replaced whole."""
    _replace(rundir.part_aggregate(part), {**record, "part": part, "written": time.time()})


def read_aggregates(rundir: RunDir) -> dict[int, dict[str, Any]]:
    """Every part's aggregate there is (one listing of ``parts/``, one read per part)."""
    out: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(rundir.parts_dir)
    except OSError:
        return out
    for name in names:
        head, dot, ext = name.partition(".")
        if not (head.startswith("part") and head[4:].isdigit() and dot and ext == "json"):
            continue
        d = _read(rundir.parts_dir / name)
        if d is not None and d.get("part") == int(head[4:]) and isinstance(d.get("pods"), list):
            out[int(head[4:])] = d
    return dict(sorted(out.items()))


def read_aggregate(rundir: RunDir, part: int) -> dict[str, Any] | None:
    """Part ``part``'s aggregate, if it has written one (one read)."""
    d = _read(rundir.part_aggregate(part))
    return d if d is not None and d.get("part") == part and isinstance(d.get("pods"), list) else None


def write_hang(rundir: RunDir, part: int, record: dict[str, Any]) -> None:
    """Part ``part`` missed a meeting's deadline: ``record`` names who did not come (durable)."""
    data = {**record, "part": part, "written": time.time()}
    atomic_write_bytes(rundir.part_hang(part), (json.dumps(data, indent=1) + "\n").encode(), mode=0o644)


def read_hang(rundir: RunDir, part: int) -> dict[str, Any] | None:
    """Part ``part``'s hang record, if its latest start left one."""
    return _read(rundir.part_hang(part))


def clear_part(rundir: RunDir, part: int) -> None:
    """A part starts again: its hang record is of an earlier start (its aggregate is rewritten)."""
    rundir.part_hang(part).unlink(missing_ok=True)
