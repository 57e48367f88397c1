"""A rank's signs of life and the deadline on its waits for every rank.

- Its pod's heartbeat (files/heartbeat.py), beaten by the rank program between updates.
- The deadline of every wait for all ranks (``tournament.meeting_timeout_s``; 0: the larger of
  MEETING_FLOOR_S and MEETING_ROUNDS x the pod's longest time from one round to the next): the
  communicator asks :meth:`Vigil.overdue` while the rank waits (cluster/mpi.py ``Comm.watch``).
- A wait that missed it (:meth:`Vigil.hung`): the ranks that did not come are named on stderr and
  in ``parts/part<k>.hung.json``, and the world ends with EXIT_HUNG.
- The world's rank 0 gathers its part's heartbeats into ``parts/part<k>.json`` (:meth:`Vigil.aggregate`).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable

from podracer_hpc.cluster.caches import node_name
from podracer_hpc.cluster.mpi import Comm, MeetingTimeout, stop_tree_neighbours
from podracer_hpc.config import Config
from podracer_hpc.files import heartbeat
from podracer_hpc.files.rundir import EXIT_HUNG, PoolPart, RunDir, job_id

__all__ = ["HEARTBEAT_S", "MEETING_FLOOR_S", "MEETING_ROUNDS", "Vigil"]

MEETING_FLOOR_S = 300.0
MEETING_ROUNDS = 3.0
HEARTBEAT_S = 30.0  # the longest time between two heartbeats of a training pod (a quarter of the deadline if shorter)


class Vigil:
    """One rank's heartbeat and deadlines (see the module docstring)."""

    def __init__(self, cfg: Config, comm: Comm, rundir: RunDir, part: PoolPart, index: int, say: Callable[[str], None]):
        self.cfg, self.comm, self.rundir, self.part, self.index, self.say = cfg, comm, rundir, part, index, say
        self.round_s = 0.0  # the longest time between two of this pod's rounds (the derived deadline)
        self.next_check = 0.0  # monotonic time of the next look at the heartbeats while a wait is long
        self.last_aggregate = -math.inf
        self.hb: heartbeat.Heartbeat | None = None
        self.flush: Callable[[], None] = lambda: None  # the rank's log, flushed before the world ends

    def open(self, device: str) -> heartbeat.Heartbeat:
        """This pod's heartbeat, and the deadline on every wait for all ranks from now on."""
        fixed = {
            "rank": self.comm.rank,
            "part": self.part.index,
            "host": node_name(),
            "node": os.environ.get("SLURMD_NODENAME") or node_name(),  # Slurm's name of it
            "device": device,
            "pid": os.getpid(),
            "job": job_id(),
            "seed": self.cfg.seed + self.index,
            "algo": self.cfg.agent.algo,
            "total": self.cfg.total_env_steps,
            "state": "running",
        }
        self.hb = heartbeat.Heartbeat(self.rundir, self.index, fixed, min(HEARTBEAT_S, self.timeout() / 4))
        if self.comm.rank == 0:
            heartbeat.clear_part(self.rundir, self.part.index)  # a hang record is of an earlier start
        self.hb.beat("starting", force=True)
        self.comm.watch = self.overdue
        return self.hb

    def timeout(self) -> float:
        """The deadline of a wait for every rank: ``tournament.meeting_timeout_s``, or (0) the
        larger of MEETING_FLOOR_S and MEETING_ROUNDS x the longest time this pod took from one
        round to the next (its training, evaluation and meeting)."""
        t = self.cfg.tournament.meeting_timeout_s
        return t if t > 0 else max(MEETING_FLOOR_S, MEETING_ROUNDS * self.round_s)

    def overdue(self, waited_s: float, seq: int) -> bool:
        """Whether wait ``seq`` (every rank's ``seq``-th wait for all: the same on every rank) is
        overdue. While it waits a rank keeps beating, saying which wait it is at; once it has
        waited the deadline it looks (every quarter deadline) at the heartbeats of its neighbours
        in the ranks' tree (cluster/mpi.py: every rank is watched by its parent and children, and
        a rank reads at most ceil(log2 N) + 1 small files): a neighbour that is not at this wait
        and has given no sign of life for the deadline is hung."""
        limit = self.timeout()
        self.hb.interval_s = min(HEARTBEAT_S, limit / 4)
        if self.hb.record.get("wait") != seq:
            self.hb.beat(f"waiting for every rank (wait {seq})", force=True, wait=seq)
        else:
            self.hb.beat()
        now = time.monotonic()
        if waited_s < limit or now < self.next_check:
            return False
        self.next_check = now + max(1.0, limit / 4)
        start = self.part.pods(self.comm.size).start
        watched = [start + r for r in stop_tree_neighbours(self.comm.rank, self.comm.size)]
        beats, t = heartbeat.read_beats(self.rundir, watched), time.time()
        return any(
            (beats.get(p) or {}).get("wait", -1) < seq and heartbeat.age(beats.get(p), t) >= limit for p in watched
        )

    def hung(self, e: MeetingTimeout) -> None:
        """A wait missed its deadline: name every rank of this world that did not come (pool
        index, world rank, host, device, last update, what it was doing) on stderr and in
        ``parts/part<k>.hung.json``, then end the world with EXIT_HUNG (the checkpoints are intact)."""
        limit = self.timeout()
        beats, t = heartbeat.read_beats(self.rundir, self.part.pods(self.comm.size)), time.time()
        absent = [
            p
            for p in self.part.pods(self.comm.size)
            if p != self.index and (beats.get(p) or {}).get("wait", -1) < e.seq
        ]
        silent = [p for p in absent if heartbeat.age(beats.get(p), t) >= limit]
        busy = [p for p in absent if p not in silent]
        what = {"notices": "the stop notices", "meeting": "a meeting"}.get(e.what, f"a {e.what}")
        derived = "" if self.cfg.tournament.meeting_timeout_s else ", derived"
        self.say(
            f"{what} (wait {e.seq}) missed its deadline of {limit:.0f} s (tournament.meeting_timeout_s{derived}): "
            f"{len(silent)} rank(s) did not come and gave no sign of life:\n  "
            + "\n  ".join(heartbeat.describe(p, beats.get(p), t) for p in silent)
            + (f"\n  still busy (not hung): pod(s) {', '.join(map(str, busy))}" if busy else "")
            + f"\nending this world (exit {EXIT_HUNG}); the checkpoints are intact: the same command resumes "
            + ("this part" if self.part.count > 1 else "the run")
        )
        keys = ("rank", "host", "node", "device", "pid", "job", "update", "env_steps", "doing")

        def named(p: int) -> dict[str, Any]:
            b, silent_s = beats.get(p) or {}, heartbeat.age(beats.get(p), t)
            return {"pod": p, **{k: b.get(k) for k in keys}, "silent_s": None if silent_s == math.inf else silent_s}

        record = {
            "job": job_id(),
            "pool_part": str(self.part),
            "wait": e.what,
            "seq": e.seq,
            "waited_s": round(e.waited_s, 1),
            "deadline_s": limit,
            "detected_by": {"pod": self.index, "rank": self.comm.rank, "host": self.hb.record.get("host")},
            "hung": [named(p) for p in silent],
            "busy": busy,
        }
        try:
            heartbeat.write_hang(self.rundir, self.part.index, record)
        except OSError as err:
            self.say(f"could not write {self.rundir.part_hang(self.part.index)} ({err})")
        self.hb.beat(f"ended the world: {what} missed its deadline", force=True, state="hung")
        self.flush()
        self.comm.abort(EXIT_HUNG)

    def aggregate(self, pool_size: int, state: str = "running", force: bool = False) -> None:
        """Rank 0 of the world, every ``log.aggregate_interval_s``: its pods' heartbeats in one
        record (``parts/part<k>.json``), what ``podracer status`` and ``--wait`` read."""
        now = time.monotonic()
        if self.comm.rank != 0 or (not force and now - self.last_aggregate < self.cfg.log.aggregate_interval_s):
            return
        self.last_aggregate = now
        beats = heartbeat.read_beats(self.rundir, self.part.pods(self.comm.size))
        record = {
            "job": job_id(),
            "pool_part": str(self.part),
            "world_size": self.comm.size,
            "pool_size": pool_size,
            "state": state,
            "deadline_s": self.timeout(),  # a watcher takes a part silent this long as hung (launch/retry.py)
            "interval_s": self.cfg.log.aggregate_interval_s,
            "hosts": sorted({str(b.get("host")) for b in beats.values()}),
            "pods": [beats[p] for p in sorted(beats)],
        }
        try:
            heartbeat.write_aggregate(self.rundir, self.part.index, record)
        except OSError as err:
            self.say(f"could not write {self.rundir.part_aggregate(self.part.index)} ({err})")
