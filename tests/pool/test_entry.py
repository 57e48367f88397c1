"""The one leaderboard entry record: a sidecar written before it was one record lists into it, a
collective round's kept listing (``rounds/<i>.json``) reads and writes the same bytes as before,
and the rules' tuples read as entries."""

from __future__ import annotations

import json
import math
import shutil

from helpers import REPO

from podracer_hpc.pod import entry_kind
from podracer_hpc.pool.entry import Entry, entries_of
from podracer_hpc.pool.leaderboard import Leaderboard

FIXTURE = REPO / "tests" / "fixtures" / "run-before-layout" / "leaderboard"
# The kept listing of the fixture's leaderboard as the code before one Entry record wrote it
# (rounds.Listed.to_json of each listed entry), byte for byte.
OLD_LISTING = (
    '[["local-0-0-8c052bcd2126", -1498.413599876687, 4096, {"episodes": 2, "mean": -1498.413599876687, '
    '"returns": [-1800.5569343566895, -1196.2702653966844], "se": 302.1433344800025, "seed": 976903388}, '
    '"ppo mlp 32x32 relu norm"]]'
)


def test_an_old_sidecar_lists_into_an_entry_and_its_listing_row_is_the_old_one(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "lb")
    (e,) = Leaderboard(tmp_path / "lb", accept_unkeyed=True, read_only=True).list()
    assert isinstance(e, Entry)
    assert (e.id, e.env_steps, e.pod, e.job, e.round) == ("local-0-0-8c052bcd2126", 4096, 0, "local", 0)
    assert e.hparams["learning_rate"] == 0.001 and len(e.sha256) == 64 and e.created > 0
    assert e.kind is None and e.returns is None  # what the sidecar says; a round adds the rest
    assert e.eval["seed"] == 976903388 and len(e.eval["returns"]) == 2
    row = Entry(e.id, e.score, e.env_steps, meta=e.meta, kind=entry_kind(e.meta)).to_listing()
    assert json.dumps([row]) == OLD_LISTING


def test_a_kept_listing_reads_back_into_the_same_bytes():
    rows = json.loads(OLD_LISTING)
    entries = [Entry.from_listing(r) for r in rows]
    assert entries[0].kind == "ppo mlp 32x32 relu norm" and entries[0].eval["episodes"] == 2
    assert json.dumps([e.to_listing() for e in entries]) == OLD_LISTING


def test_shorter_listing_rows_of_older_versions_read():
    old = Entry.from_listing(["a", 2, 10])
    assert (old.id, old.score, old.env_steps, old.eval, old.kind) == ("a", 2.0, 10, None, None)
    assert Entry.from_listing(["b", 1.5]).env_steps is None
    assert Entry.from_listing(["c", 1.0, None, None, "sac"]).to_listing() == ["c", 1.0, None, None, "sac"]


def test_tuples_read_as_entries_in_the_old_candidate_order():
    e, f, g = entries_of([("x", 3), ("y", "2.5", 100, (1.0, 2.0)), ["z", 1.0, None, None, "td3"]])
    assert (e.id, e.score, e.env_steps, e.returns, e.kind) == ("x", 3.0, None, None, None)
    assert (f.score, f.env_steps, f.returns) == (2.5, 100, (1.0, 2.0))
    assert g.kind == "td3" and math.isfinite(g.score)
    same = Entry("w", 1.0)
    assert Entry.of(same) is same
