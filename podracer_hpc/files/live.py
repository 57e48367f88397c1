"""A run's pods read live from their logs: the per-rank HDF5 logs opened as SWMR readers, so a
run can be watched while it trains, and each poll reads only the rows appended since the last
(:class:`Monitor`). ``podracer status`` renders what it finds; ``podracer submit --wait`` prints
a progress line from it. Reads only; writes nothing, takes no lock.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from podracer_hpc.files.bounded import read_yaml
from podracer_hpc.files.h5log import LogError, LogTail, read_log
from podracer_hpc.files.records import Source, read_records
from podracer_hpc.files.rundir import RunDir, job_id

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
    "find_rank_logs",
    "pod_state",
    "pod_statuses",
    "check_run_dir",
    "STATUS_COLUMNS",
]

RATE_WINDOW = 10  # train rows over which a pod's steps/s is measured

READ_TRIES = 3  # a log caught mid-flush is read again after a short pause

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
    hparams: dict[str, Any] = field(default_factory=dict)


def find_rank_logs(run_dir: Path) -> dict[int, Path]:
    """``{rank: log path}`` (the run directory's layout is rundir.py's)."""
    return RunDir(run_dir).rank_logs()


def check_run_dir(run_dir: Path) -> None:
    what = (
        "a run directory is what `podracer train --run-dir DIR` writes: DIR/config.yaml and DIR/logs/<name>_rank<r>.h5"
    )
    if not run_dir.exists():
        raise StatusError(
            f"{run_dir}: no such directory ({what}; a job still waiting in the queue has none yet)", pending=True
        )
    if not run_dir.is_dir():
        raise StatusError(f"{run_dir} is a file, not a run directory ({what})")
    if not RunDir(run_dir).looks_like_run():
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

    def poll(self) -> list[PodStatus]:
        """Every rank's state now (a rank whose log appeared since the last poll is added)."""
        check_run_dir(self.run_dir)
        now = time.time()
        out = []
        for r, p in find_rank_logs(self.run_dir).items():
            t = self.trackers.get(r)
            if t is None or t.path != p:
                t = self.trackers[r] = _Tracker(r, p)
            out.append(t.poll(now))
        if not self.config:
            self.config = _load_config(self.run_dir, self)
        return out

    @property
    def rows_read(self) -> int:
        """Log rows read so far, over every rank and group (what the incremental reading saves is
        what this does not count)."""
        return sum(t.tail.rows_read for t in self.trackers.values())

    def job_ids(self) -> list[str]:
        """The Slurm job ids the ranks' logs name (their latest start), ``<array>_<task>`` for an array task."""
        ids = []
        for t in self.trackers.values():
            ids_ = (t.tail.attrs or {}).get("slurm") or {}
            if isinstance(ids_, dict) and ids_.get("SLURM_JOB_ID"):
                ids.append(job_id({str(k): str(v) for k, v in ids_.items()}))
        return list(dict.fromkeys(ids))


def pod_statuses(run_dir: str | Path) -> list[PodStatus]:
    """The state of every rank of a run, read from its logs (also while they are written)."""
    return Monitor(run_dir).poll()


def pod_state(p: PodStatus, total: int, ended: bool) -> str:
    """``unreadable`` (its log), ``done`` (trained its budget), ``stalled`` (no log write for
    STALE_S and the run has not ended), ``stopped`` (the run ended before it was done) or
    ``running``."""
    if p.error:
        return "unreadable"
    if total and p.env_steps >= total:
        return "done"
    if ended:
        return "stopped"
    return "stalled" if p.age_s > STALE_S else "running"


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
