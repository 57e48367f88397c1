"""A run's pods read live: from the parts' aggregates (``parts/part<k>.json``, each world's
rank 0 gathers its pods' heartbeats there every ``log.aggregate_interval_s``: a few files for
thousands of pods), and, for pods no aggregate covers (a run of an older version, a part that has
not written one yet), from the per-rank HDF5 logs opened as SWMR readers, each poll reading only
the rows appended since the last (:class:`Monitor`). ``podracer status`` renders what it finds;
``podracer submit --wait`` prints a progress line from it. Reads only; writes nothing, takes no lock.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from podracer_hpc.files import heartbeat
from podracer_hpc.files.bounded import read_yaml
from podracer_hpc.files.h5log import LogError, LogTail, read_log
from podracer_hpc.files.kinds import identify, wrong_kind
from podracer_hpc.files.records import Source, read_records
from podracer_hpc.files.rundir import PoolPart, RunDir, job_id, lock_owner, owner_alive
from podracer_hpc.files.summary import read_records as read_pod_records

# The columns a status reads (LogTail reads only these, and only the rows appended since its last poll).
STATUS_COLUMNS: dict[str, tuple[str, ...]] = {
    "train": ("update", "env_steps", "wall_s", "steps_per_s"),
    "eval": ("env_steps", "return_mean"),
    "tournament": (
        "round",
        "env_steps",
        "wall_s",
        "fitness",
        "action",
        "source",
        "source_kind",
        "source_id",
        "source_rejected",
        "old_hparams",
        "new_hparams",
        "algo",
    ),
}


__all__ = [
    "StatusError",
    "PodStatus",
    "Monitor",
    "find_pod_logs",
    "pod_fates",
    "pod_state",
    "pod_statuses",
    "check_run_dir",
    "STATUS_COLUMNS",
]

RATE_WINDOW = 10  # train rows over which a pod's steps/s is measured

READ_TRIES = 3  # a log caught mid-flush is read again after a short pause

# from this many pods on, a pod's state is read from its part's aggregate (up to two
# log.aggregate_interval_s old) rather than from its log; a smaller pool's logs are cheap and exact
AGGREGATES_FROM = 64

STALE_S = 600.0  # no rank log written for this long and no summary: the run is probably not running


class StatusError(ValueError):
    """The directory is not a run directory (the message says what one looks like).

    ``pending`` is true when it may still become one: it does not exist yet (a queued job) or
    holds nothing but the empty folders a starting run creates first.
    """

    def __init__(self, msg: str, pending: bool = False):
        super().__init__(msg)
        self.pending = pending


@dataclass
class PodStatus:
    """One rank's state, as its log shows it."""

    rank: int
    path: Path
    seed: int | None = None
    algo: str = ""  # the pod's learner (agent.algo of its log's config)
    env_steps: int = 0
    updates: int = 0
    wall_s: float = math.nan
    steps_per_s: float = math.nan  # recent throughput (last RATE_WINDOW updates)
    rounds: int | None = None  # completed tournament rounds; None without a tournament
    last_eval: float = math.nan
    best_eval: float = math.nan
    last_action: str = ""
    age_s: float = math.nan  # seconds since the log file last changed
    error: str = ""  # why the log could not be read (the row shows it instead of values)
    pool_part: str = "0/1"  # which part of a pool of several jobs writes it (its log's pool_part)
    hparams: dict[str, Any] = field(default_factory=dict)
    part: int | None = None  # the part of the pool it runs in (known from an aggregate)
    ended: str = ""  # how the pod ended, as its heartbeat says (done | stopped | hung); "" while it runs


def _beat_status(pod: int, b: dict[str, Any], path: Path, now: float) -> PodStatus:
    """A pod's state from its heartbeat (as a part's aggregate holds it)."""

    def num(k: str) -> float:
        v = b.get(k)
        return float(v) if isinstance(v, (int, float)) else math.nan

    rounds = b.get("rounds")
    return PodStatus(
        rank=pod,
        path=path,
        seed=b.get("seed") if isinstance(b.get("seed"), int) else None,
        algo=str(b.get("algo") or ""),
        env_steps=int(b.get("env_steps") or 0),
        updates=int(b.get("update") or 0),
        wall_s=num("wall_s"),
        steps_per_s=num("steps_per_s"),
        rounds=int(rounds) if isinstance(rounds, int) else None,
        last_eval=num("last_eval"),
        best_eval=num("best_eval"),
        last_action=str(b.get("last_action") or ""),
        age_s=heartbeat.age(b, now),
        part=b.get("part") if isinstance(b.get("part"), int) else None,
        ended="" if b.get("state") in (None, "running") else str(b.get("state")),
    )


def find_pod_logs(run_dir: Path) -> dict[int, Path]:
    """``{pod: log path}`` by pool index (the run directory's layout is rundir.py's)."""
    return RunDir(run_dir).pod_logs()


def check_run_dir(run_dir: Path) -> None:
    what = (
        "a run directory is what `podracer train --run-dir DIR` writes: DIR/config.yaml and DIR/logs/<name>_rank<r>.h5"
    )
    if not run_dir.exists():
        raise StatusError(
            f"{run_dir}: no such directory ({what}; a job still waiting in the queue has none yet)", pending=True
        )
    if not run_dir.is_dir():  # what it is and which run directory to pass instead (kinds.py)
        raise StatusError(str(wrong_kind(identify(run_dir), ("run",))))
    if not RunDir(run_dir).looks_like_run():
        found = identify(run_dir)
        if found.kind in ("folder", "leaderboard") and found.run is not None:
            raise StatusError(str(wrong_kind(found, ("run",))))
        if _only_empty_run_folders(run_dir):
            raise StatusError(
                f"{run_dir} holds no config.yaml and no logs yet: not a run directory, or one "
                "whose job is just starting",
                pending=True,
            )
        hint = ""
        subs = sorted(p.name for p in run_dir.iterdir() if p.is_dir() and (p / "config.yaml").exists())
        if subs:
            hint = f"; run directories inside it: {', '.join(subs[:6])}{' ...' if len(subs) > 6 else ''}"
        raise StatusError(
            f"{run_dir} is not a podracer run directory: no config.yaml and no logs/*_rank<r>.h5 ({what}){hint}"
        )


def _only_empty_run_folders(run_dir: Path) -> bool:
    """Nothing in ``run_dir`` but (empty) folders a starting run creates."""
    for p in run_dir.iterdir():
        if RunDir.is_lock(p.name):  # a starting writer takes its lock first
            continue
        if p.name not in ("logs", "checkpoints", "leaderboard") or not p.is_dir():
            return False
        if any(q.is_file() for q in p.rglob("*")):
            return False
    return True


def _read(path: Path) -> dict[str, Any]:
    """read_log, retried: a file caught while its writer opens or extends it may fail once."""
    for i in range(READ_TRIES):
        try:
            return read_log(path)
        except (LogError, OSError, KeyError, ValueError, RuntimeError) as e:
            if i == READ_TRIES - 1:
                raise LogError(str(e)) from None
            time.sleep(0.2)
    raise AssertionError("unreachable")


def _short_source(src: Source) -> str:
    """An entry ``local-2-3-97d9795f388a`` -> ``pod2 r3``; a pod -> ``pod1``; others unchanged."""
    name = src.entry
    if name is not None:
        s = f"{'' if name.job == 'local' else name.job + ':'}pod{name.pod} r{name.round}"
    else:
        s = f"pod{src.id}" if src.kind == "pod" else src.id or src.kind
    return f"rejected {s}" if src.rejected else s


class _Tracker:
    """One rank's :class:`PodStatus`, folded forward from the rows its log appended since the last poll."""

    def __init__(self, rank: int, path: Path):
        self.tail = LogTail(path, STATUS_COLUMNS)
        self.rank, self.path = rank, path
        self._fresh()

    def _fresh(self) -> None:
        self.st = PodStatus(rank=self.rank, path=self.path)
        self.window: deque[tuple[int, float]] = deque(maxlen=RATE_WINDOW + 1)  # (env steps, wall s) of recent rows
        self.train_steps = 0

    def poll(self, now: float) -> PodStatus:
        st = self.st
        try:
            st.age_s = max(0.0, now - self.path.stat().st_mtime)
            rows = self._poll_tail()
        except (LogError, OSError) as e:
            st.error = str(e).replace(str(self.path), self.path.name)
            return st
        if rows["reset"]:
            age = st.age_s
            self._fresh()
            st = self.st
            st.age_s = age
        st.error = ""
        attrs = self.tail.attrs or {}
        cfg = attrs.get("config") or {}
        st.seed = attrs.get("seed")
        st.pool_part = str(attrs.get("pool_part") or "0/1")
        st.algo = str((cfg.get("agent") or {}).get("algo", "ppo"))
        tr, ev, to = rows["train"], rows["eval"], rows["tournament"]
        n = len(tr.get("env_steps", ()))
        if n:
            steps, wall = tr["env_steps"], tr["wall_s"]
            self.window.extend(zip(steps.tolist(), wall.tolist()))
            self.train_steps = int(steps[-1])
            st.updates, st.wall_s = int(tr["update"][-1]), float(wall[-1])
            (s0, w0), (s1, w1) = self.window[0], self.window[-1]
            st.steps_per_s = (s1 - s0) / (w1 - w0) if len(self.window) > 1 and w1 > w0 else float(tr["steps_per_s"][-1])
        st.env_steps = max(st.env_steps, self.train_steps)
        r = ev.get("return_mean", np.array([]))
        if len(r):
            st.last_eval = float(r[-1])
            fin = r[np.isfinite(r)]
            if len(fin):
                st.best_eval = (
                    float(fin.max()) if not math.isfinite(st.best_eval) else max(st.best_eval, float(fin.max()))
                )
            st.env_steps = max(st.env_steps, int(ev["env_steps"][-1]))
        if (cfg.get("tournament") or {}).get("mode", "none") != "none":
            rounds = to.get("round", np.array([]))
            if st.rounds is None:
                st.rounds = 0
            if len(rounds):
                st.rounds = int(rounds[-1]) + 1
                last = read_records({k: v[-1:] for k, v in to.items()})[-1]
                action = last.action
                if action in ("copy_pod", "load_entry"):
                    action = f"{'copy' if action == 'copy_pod' else 'load'} <- {_short_source(last.source)}"
                elif last.source.rejected:
                    action = f"keep ({_short_source(last.source)})"
                st.last_action = f"r{last.round}: {action}"
                st.hparams = last.new_hparams
                # a round's row is flushed at once, the training rows before it may still be buffered
                st.env_steps = max(st.env_steps, int(last.env_steps))
        return st

    def _poll_tail(self) -> dict[str, Any]:
        """LogTail.poll, retried: a file caught while its writer opens or extends it may fail once."""
        for i in range(READ_TRIES):
            try:
                return self.tail.poll()
            except (LogError, OSError, KeyError, ValueError, RuntimeError) as e:
                if i == READ_TRIES - 1:
                    raise LogError(str(e)) from None
                time.sleep(0.2)
        raise AssertionError("unreachable")


class Monitor:
    """The pods of one run, kept up to date poll by poll: each :meth:`poll` reads only what the
    rank logs appended since the previous one (a log that did not change is not even opened), so
    a poll costs the same at the start of a run and after 10^5 rows per rank."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.trackers: dict[int, _Tracker] = {}
        self.config: dict[str, Any] = {}
        self.parts: dict[int, dict[str, Any]] = {}  # the parts' aggregates at the last poll
        self.memo: dict[str, Any] = {}  # what a reader keeps between polls (status: Slurm's last answer)

    def poll(self) -> list[PodStatus]:
        """Every pod's state now: from the parts' aggregates, and from the logs of the pods no
        aggregate covers (their directory is listed only then; a log that appeared is added)."""
        check_run_dir(self.run_dir)
        now = time.time()
        rd = RunDir(self.run_dir)
        self.parts = heartbeat.read_aggregates(rd)
        big = max([int(a.get("pool_size") or 0) for a in self.parts.values()], default=0) >= AGGREGATES_FROM
        from_beats = {
            int(b["pod"]): _beat_status(int(b["pod"]), b, rd.heartbeat(int(b["pod"])), now)
            for agg in self.parts.values()
            for b in agg["pods"]
            if big and isinstance(b, dict) and isinstance(b.get("pod"), int)
        }
        size = self.pool_size
        covered = size > 0 and all(i in from_beats for i in range(size))
        out = dict(from_beats)
        if not covered:
            for r, p in find_pod_logs(self.run_dir).items():
                if r in from_beats:
                    continue
                t = self.trackers.get(r)
                if t is None or t.path != p:
                    t = self.trackers[r] = _Tracker(r, p)
                out[r] = t.poll(now)
        if not self.config:
            self.config = _load_config(self.run_dir, self)
        return [out[r] for r in sorted(out)]

    @property
    def pool_size(self) -> int:
        """The pool's pods (all its parts), as the aggregates and the logs read so far say (0: unknown)."""
        sizes = [int(a.get("pool_size") or 0) for a in self.parts.values()]
        sizes += [
            int((t.tail.attrs or {}).get("pool_size") or (t.tail.attrs or {}).get("world_size") or 0)
            for t in self.trackers.values()
        ]
        return max(sizes, default=0)

    @property
    def rows_read(self) -> int:
        """Log rows read so far, over every rank and group (what the incremental reading saves is
        what this does not count)."""
        return sum(t.tail.rows_read for t in self.trackers.values())

    def job_ids(self) -> list[str]:
        """The Slurm job ids the ranks' logs name (their latest start), ``<array>_<task>`` for an array task."""
        ids = [str(a["job"]) for a in self.parts.values() if a.get("job") and a.get("job") != "local"]
        for t in self.trackers.values():
            ids_ = (t.tail.attrs or {}).get("slurm") or {}
            if isinstance(ids_, dict) and ids_.get("SLURM_JOB_ID"):
                ids.append(job_id({str(k): str(v) for k, v in ids_.items()}))
        return list(dict.fromkeys(ids))


def pod_statuses(run_dir: str | Path) -> list[PodStatus]:
    """The state of every rank of a run, read from its logs (also while they are written)."""
    return Monitor(run_dir).poll()


def pod_state(p: PodStatus, total: int, ended: bool, fate: str = "") -> str:
    """``unreadable`` (its log), ``done`` (trained its budget), ``stalled`` (no log write or
    heartbeat for STALE_S and its run or part has not ended), ``hung`` (its part ended on a missed
    deadline), ``stopped`` (its run or part ended before it was done), ``killed`` (its writer is
    gone without ending it: :func:`pod_fates`) or ``running``."""
    if p.error:
        return "unreadable"
    if (total and p.env_steps >= total) or p.ended == "done":
        return "done"
    if p.ended in ("stopped", "hung"):
        return p.ended
    if fate and fate != "running":
        return fate.split(" ", 1)[0]
    if ended and not fate:
        return "stopped"
    return "stalled" if p.age_s > STALE_S else "running"


def pod_fates(run_dir: Path, pods: list[PodStatus], ended: bool | set[int]) -> dict[int, str]:
    """How each pod's last start ended, where the run directory can tell: ``done`` or ``stopped``
    (its record: it checkpointed and ended), ``running`` (the writer holding its lock runs), or
    ``killed (resumes from update N)``: no record and its writer is gone (the lock of a process
    that no longer runs, or no lock once the run ended), so its log rows after the checkpoint's
    update N are redone by the next start. "" where nothing can tell (another host's writer).
    ``ended``: whether the run has ended, or the pods whose run or part has ended."""
    rd = RunDir(run_dir)
    records = read_pod_records(rd, [p.rank for p in pods])
    owners: dict[tuple[Path, bool], bool | None] = {}
    out: dict[int, str] = {}
    for p in pods:
        if p.rank in records:
            out[p.rank] = str(records[p.rank]["state"])
            continue
        if p.ended:  # its part's aggregate says how it ended (done, stopped, hung)
            out[p.rank] = p.ended
            continue
        lock = rd.lock_file(_part_of(p))
        pod_ended = ended if isinstance(ended, bool) else p.rank in ended
        if (lock, pod_ended) not in owners:
            rec = lock_owner(lock)
            owners[lock, pod_ended] = owner_alive(rec) if rec is not None else (False if pod_ended else None)
        alive = owners[lock, pod_ended]
        if alive:
            out[p.rank] = "running"
        elif alive is False and not p.error:
            n = checkpoint_updates(rd.checkpoint_path(p.rank))
            out[p.rank] = "killed (" + (f"resumes from update {n})" if n is not None else "starts over: no checkpoint)")
        else:
            out[p.rank] = ""
    return out


def _part_of(p: PodStatus) -> PoolPart:
    try:
        return PoolPart.parse(str(p.pool_part or "0/1"))
    except ValueError:
        return PoolPart()


def checkpoint_updates(path: Path) -> int | None:
    """The update a checkpoint holds (its header only: no torch, no checksum; None when it cannot
    tell). Opens only a regular file, without blocking."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
        if n > 1 << 24:
            return None
        head = json.loads(os.pread(fd, n, 8))
        return int(json.loads(head["__metadata__"]["meta"])["updates"])
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    finally:
        os.close(fd)


def _load_config(run_dir: Path, monitor: "Monitor") -> dict[str, Any]:
    try:
        cfg = read_yaml(RunDir(run_dir).config, what="run config")
        if isinstance(cfg, dict):
            return cfg
    except Exception:  # noqa: BLE001 - missing, being written, not YAML: the logs carry the config too
        pass
    for t in monitor.trackers.values():  # no config.yaml (copied logs only): the logs carry the config too
        cfg = (t.tail.attrs or {}).get("config")
        if isinstance(cfg, dict):
            return cfg
    return {}
