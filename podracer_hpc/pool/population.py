"""Every pod's latest agents, for asynchronous PBT, read a bounded sample at a time.

Part of the leaderboard's files (:mod:`podracer_hpc.pool.leaderboard` owns their format: every
bucket is a leaderboard directory of the same immutable, checksummed entries):

    <leaderboard>/population/layout.json     {"buckets": B}: fixed by the first pod that comes
    <leaderboard>/population/<bucket>/       a pod's entries, by a hash of its job and rank
"""

from __future__ import annotations

import json
import math
import os
import zlib
from pathlib import Path
from typing import Any

import torch

from podracer_hpc.files.bounded import read_json
from podracer_hpc.files.records import parse_entry_id
from podracer_hpc.pool.entry import Entry
from podracer_hpc.pool.entryfiles import count_op, make_private_dir, warn, write_new
from podracer_hpc.pool.leaderboard import EntryCorrupt, EntryGone, Leaderboard, sanitize, validate_entry_id

__all__ = ["PODS_PER_BUCKET", "POPULATION_DIR", "Population", "auto_buckets"]


POPULATION_DIR = "population"  # under the leaderboard's root, beside entries/
PODS_PER_BUCKET = 16  # an automatic bucket count aims at this many pods per bucket


def auto_buckets(pool_size: int) -> int:
    """Buckets for a pool of ``pool_size`` pods: a power of two near ``pool_size / 16``."""
    want = max(1, math.ceil(max(1, int(pool_size)) / PODS_PER_BUCKET))
    return 1 << (want - 1).bit_length()


class Population:
    """Every pod's latest agents, for asynchronous PBT, read a bounded sample at a time.

    Layout: ``root/population/layout.json`` (the bucket count, fixed by the first pod that
    comes: ``{"buckets": B}``) and ``root/population/<bucket>/``, each a leaderboard directory
    (same immutable entries, same integrity checks). A pod's entries go to the bucket its job and
    rank hash to, and it keeps its newest ``keep_last`` there (deleting its own older ones).

    Why: when every pod kept every other pod's latest entry in one directory, each
    pod listed and read all N sidecars each round (N^2 per round over the pool: 16.8M opens at
    4,096 pods). Here a pod lists a few random buckets and reads at most ``n`` sidecars, chosen
    from the entry names (``job-pod-round-hex``) without opening anything: its work per round
    does not depend on the pool's size, and with hashed buckets of similar size the sample is
    close to uniform over the pods.
    """

    def __init__(self, root: str | os.PathLike, pool_size: int = 1, buckets: int = 0):
        self.root = Path(root)
        self.dir = self.root / POPULATION_DIR
        for d in (self.root, self.dir):
            make_private_dir(d)
        self.buckets = self._layout(buckets or auto_buckets(pool_size))
        self._boards: dict[tuple[int, bool], Leaderboard] = {}
        self.keyring = Leaderboard(self.root, POPULATION_DIR, create=False)  # the secret, read once for every bucket

    def _layout(self, want: int) -> int:
        """The bucket count of this population: the first pod's choice, read by all later ones."""
        path = self.dir / "layout.json"
        for _ in range(2):
            count_op("open")
            try:
                d = read_json(path, what="population layout")
                b = int(d["buckets"])
                if b < 1:
                    raise ValueError(b)
                return b
            except FileNotFoundError:
                try:
                    write_new(path, json.dumps({"buckets": int(want), "pods_per_bucket": PODS_PER_BUCKET}).encode())
                    return int(want)
                except FileExistsError:
                    continue  # another pod wrote it first: read its choice
            except (OSError, ValueError, TypeError, KeyError) as e:
                raise EntryCorrupt(f"{path}: not a population layout ({e}); delete it to start the population over")
        raise EntryCorrupt(f"{path}: cannot be read or written")

    def bucket_of(self, job: Any, pod: Any) -> int:
        """The bucket of a pod (stable across restarts: a hash of its job and rank as ids spell them)."""
        return zlib.crc32(f"{sanitize(job)}/{sanitize(pod, 16)}".encode()) % self.buckets

    def board(self, bucket: int, create: bool = False) -> Leaderboard:
        """One bucket's directory (``create``: made if missing, for a publisher; readers only read)."""
        if (bucket, create) not in self._boards:
            self._boards[bucket, create] = Leaderboard(
                self.root, f"{POPULATION_DIR}/{bucket:04d}", create=create, secret_of=self.keyring
            )
        return self._boards[bucket, create]

    def board_of(self, entry_id: str) -> Leaderboard:
        """The bucket directory an entry id belongs to (from the job and rank its name carries)."""
        name = parse_entry_id(validate_entry_id(entry_id))
        if name is None:
            raise EntryGone(f"{entry_id} is not a population entry id (job-pod-round-hex)")
        return self.board(self.bucket_of(name.job, name.pod))

    def publish(self, tensors: dict[str, torch.Tensor], score: float, meta: dict[str, Any], keep_last: int = 2) -> str:
        """Write this pod's agent (``meta`` has ``job`` and ``pod``) and delete its own entries but the
        newest ``keep_last`` (2: a reader that listed the previous one can still load it)."""
        job, pod = meta.get("job", "local"), meta.get("pod", 0)
        board = self.board(self.bucket_of(job, pod), create=True)
        eid = board.publish(tensors, score, meta, content_id=True)
        mine = sorted(
            ((n.round, i) for i, n in self._names(board) if (n.job, n.pod) == (sanitize(job), int(pod))), reverse=True
        )
        board.remove(i for _, i in mine[keep_last:] if i != eid)
        return eid

    def _names(self, board: Leaderboard) -> list[tuple[str, Any]]:
        """``(id, parsed name)`` of the complete entries (sidecars) of one bucket: one listing, no opens."""
        count_op("scandir")
        try:
            names = [
                x.name[: -len(".json")]
                for x in os.scandir(board.entries_dir)
                if x.name.endswith(".json") and not x.name.startswith(".")
            ]
        except FileNotFoundError:
            return []
        return [(i, n) for i in names if (n := parse_entry_id(i)) is not None]

    def sample(self, rng: Any, n: int, exclude: tuple[Any, Any] | None = None) -> list[Entry]:
        """The latest entry of up to ``n`` pods drawn at random (``rng``: a numpy Generator), best
        first; ``exclude``: a ``(job, pod)`` left out (the caller). Lists random buckets until it has
        ``n`` pods or has listed ``max(2, ceil(2n / 16))`` of them; reads only the chosen sidecars."""
        if n <= 0:
            return []
        skip = (sanitize(exclude[0]), int(exclude[1])) if exclude is not None else None
        latest: dict[tuple[str, int], tuple[int, str, int]] = {}
        max_listed = max(2, math.ceil(2 * n / PODS_PER_BUCKET))
        for listed, b in enumerate(rng.permutation(self.buckets).tolist()):
            if listed >= max_listed or len(latest) >= n:
                break
            for eid, name in self._names(self.board(b)):
                key = (name.job, name.pod)
                if key != skip and (key not in latest or name.round > latest[key][0]):
                    latest[key] = (name.round, eid, b)
        chosen = sorted(latest.values(), key=lambda x: x[1])
        if len(chosen) > n:
            chosen = [chosen[i] for i in sorted(rng.choice(len(chosen), size=n, replace=False).tolist())]
        out = []
        for _, eid, b in chosen:
            try:
                info = self.board(b).info(eid)
            except EntryGone:
                continue  # its pod published again and retired it meanwhile
            except EntryCorrupt as e:
                warn(f"{e}; skipped")
                continue
            if math.isfinite(info.score):
                out.append(info)
        out.sort(key=lambda e: (-e.score, e.id))
        return out

    def load(
        self, entry_id: str, device: str | torch.device = "cpu"
    ) -> tuple[str, dict[str, torch.Tensor], dict[str, Any]]:
        """Load a population entry (as :meth:`Leaderboard.load_best_available` of one candidate)."""
        return self.board_of(entry_id).load_best_available([entry_id], device=device, skip_corrupt=False)
