"""The shared-filesystem leaderboard: immutable entries, validation, races, permissions."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import stat
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from podracer_hpc.files import safeio
from podracer_hpc.pool import entryfiles
from podracer_hpc.pool import leaderboard as lb_mod
from podracer_hpc.pool.entry import Entry
from podracer_hpc.pool.entryfiles import LeaderboardWarning
from podracer_hpc.pool.leaderboard import (
    EntryCorrupt,
    EntryGone,
    EntryRefused,
    InvalidEntryId,
    Leaderboard,
    make_entry_id,
    plan_prune,
    validate_entry_id,
)


def state(x: float) -> dict[str, torch.Tensor]:
    return {"actor.weight": torch.full((3, 2), x), "optim.step": torch.tensor([int(x)], dtype=torch.int64)}


def meta(pod=0, rnd=1, steps=1000, job="4242_7"):
    return {"job": job, "pod": pod, "round": rnd, "env_steps": steps, "hparams": {"lr": 3e-4}}


@pytest.fixture
def lb(tmp_path: Path) -> Leaderboard:
    return Leaderboard(tmp_path / "board")


def flip_byte(path: Path, offset_from_end: int = 5) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))


def rewrite_sidecar(lb: Leaderboard, eid: str, **changes) -> None:
    p = lb.sidecar_path(eid)
    d = json.loads(p.read_text())
    d.update(changes)
    p.write_text(json.dumps(d))


# --------------------------------------------------------------------------- basics


def test_publish_list_load_roundtrip(lb: Leaderboard):
    ids = [lb.publish(state(s), s, meta(pod=i, rnd=3)) for i, s in enumerate([1.0, 5.0, 3.0])]
    listed = lb.list()
    assert [e.score for e in listed] == [5.0, 3.0, 1.0]
    best = listed[0]
    assert best.id == ids[1] and best.pod == 1 and best.job == "4242_7" and best.round == 3
    assert best.env_steps == 1000 and best.hparams == {"lr": 3e-4} and best.created > 0
    assert best.meta == meta(pod=1, rnd=3) and len(best.sha256) == 64
    assert best.id.startswith("4242_7-1-3-")
    tensors, m = lb.load(best.id)
    torch.testing.assert_close(tensors["actor.weight"], torch.full((3, 2), 5.0))
    assert tensors["optim.step"].dtype == torch.int64
    assert m == meta(pod=1, rnd=3)
    assert lb.candidates() == listed
    assert lb.candidates(top_k=1) == [best]
    assert lb.info(best.id) == best
    # a second Leaderboard object on the same directory (another rank) sees the same
    assert Leaderboard(lb.root).list() == listed


def test_ties_sorted_by_id_and_numpy_scores(lb: Leaderboard):
    a = lb.publish(state(1), np.float32(2.0), meta())
    b = lb.publish(state(1), 2, meta())
    assert [e.id for e in lb.list()] == sorted([a, b])


def test_entries_are_immutable(lb: Leaderboard, monkeypatch: pytest.MonkeyPatch):
    a = lb.publish(state(1.0), 1.0, meta())
    b = lb.publish(state(1.0), 1.0, meta())
    assert a != b and len(lb.list()) == 2  # same publisher, same round: still two entries
    before = lb.tensors_path(a).read_bytes(), lb.sidecar_path(a).read_bytes()
    # force an id collision: the second publish must fail and leave the first entry intact
    fixed = uuid.UUID(int=0xABC)
    monkeypatch.setattr(lb_mod.uuid, "uuid4", lambda: fixed)
    c = lb.publish(state(2.0), 9.0, meta())
    with pytest.raises(FileExistsError, match="immutable"):
        lb.publish(state(3.0), 10.0, meta())
    assert lb.load(c)[0]["actor.weight"][0, 0].item() == 2.0
    assert (lb.tensors_path(a).read_bytes(), lb.sidecar_path(a).read_bytes()) == before
    assert not [p for p in lb.entries_dir.iterdir() if p.name.startswith(".")]  # no temp left


@pytest.mark.parametrize(
    "bad",
    ["../x", "..", ".", "", "a/b", "/etc/passwd", "a.b", "x\x00y", " a", "-a", "_a", "a\\b", "é", "a" * 201, 123, None],
)
def test_invalid_entry_ids_are_rejected(lb: Leaderboard, bad):
    with pytest.raises(InvalidEntryId):
        validate_entry_id(bad)
    with pytest.raises(InvalidEntryId):
        lb.load(bad)
    with pytest.raises(InvalidEntryId):
        lb.info(bad)


def test_make_entry_id_sanitizes():
    eid = make_entry_id("../../evil job.v2", "0/1", "3.5")
    assert validate_entry_id(eid) == eid and "/" not in eid and "." not in eid
    assert make_entry_id("-x", 0, 0)[0].isalnum()
    assert len({make_entry_id("j", 0, 0) for _ in range(100)}) == 100


# --------------------------------------------------------------------------- corruption, foreign files


def test_flipped_byte_is_rejected_with_the_entry_name(lb: Leaderboard):
    eid = lb.publish(state(1.0), 1.0, meta())
    flip_byte(lb.tensors_path(eid))
    with pytest.raises(EntryCorrupt, match=f"{eid}.*checksum mismatch"):
        lb.load(eid)


def test_flipped_byte_with_matching_sidecar_is_still_rejected(lb: Leaderboard):
    """Even if someone 'fixes' the sidecar digest, the file's own checksum catches the flip."""
    import hashlib

    eid = lb.publish(state(1.0), 1.0, meta())
    flip_byte(lb.tensors_path(eid))
    rewrite_sidecar(lb, eid, sha256=hashlib.sha256(lb.tensors_path(eid).read_bytes()).hexdigest())
    with pytest.raises(EntryCorrupt, match=f"{eid}.*checksum mismatch"):
        lb.load(eid)


def test_truncated_file_is_rejected(lb: Leaderboard):
    eid = lb.publish(state(1.0), 1.0, meta())
    p = lb.tensors_path(eid)
    p.write_bytes(p.read_bytes()[:20])
    with pytest.raises(EntryCorrupt, match=eid):
        lb.load(eid)


def _install_foreign(lb: Leaderboard, eid: str, write) -> None:
    import hashlib

    write(lb.tensors_path(eid))
    sha = hashlib.sha256(lb.tensors_path(eid).read_bytes()).hexdigest()
    sidecar = {"format": lb_mod.SIDECAR_FORMAT, "version": 3, "id": eid, "score": 99.0, "sha256": sha}
    sidecar["hmac"] = lb_mod._sidecar_hmac(lb.secret(create=True), sidecar)  # a group member, who has the secret
    sidecar["sidecar_sha256"] = lb_mod._sidecar_digest(sidecar)
    lb.sidecar_path(eid).write_text(json.dumps(sidecar))


def test_foreign_safetensors_is_rejected(lb: Leaderboard):
    _install_foreign(lb, "foreign-0-0-000000000000", lambda p: save_file({"w": torch.zeros(2)}, str(p)))
    assert lb.list()[0].id == "foreign-0-0-000000000000"  # the sidecar looks fine...
    with pytest.raises(EntryCorrupt, match="not one written by podracer-hpc"):
        lb.load("foreign-0-0-000000000000")  # ...but the file is refused


def test_wrong_kind_and_swapped_files_are_rejected(lb: Leaderboard):
    _install_foreign(lb, "ckpt-0-0-000000000000", lambda p: safeio.save(p, state(1), {}, kind="pod-state"))
    with pytest.raises(EntryCorrupt, match="expected a 'leaderboard-entry'"):
        lb.load("ckpt-0-0-000000000000")
    a = lb.publish(state(1.0), 1.0, meta())
    _install_foreign(lb, "swap-0-0-000000000000", lambda p: p.write_bytes(lb.tensors_path(a).read_bytes()))
    with pytest.raises(EntryCorrupt, match="holds entry"):
        lb.load("swap-0-0-000000000000")


def test_list_skips_foreign_and_broken_json_with_warning(lb: Leaderboard):
    good = lb.publish(state(1.0), 1.0, meta())
    d = lb.entries_dir
    (d / "notes.json").write_text(json.dumps({"hello": 1}))  # valid name, foreign content
    (d / "broken-0-0-000000000000.json").write_text('{"format": "podracer-hpc-leader')  # not JSON
    (d / "x.y.json").write_text("{}")  # not an entry name
    (d / "list.json").write_text("[1, 2]")  # JSON but not an object
    (d / "README.txt").write_text("not ours")  # ignored silently
    (d / ".tmpfile.json.123.tmp").write_text("{")  # a writer's temp: ignored silently
    rewrite_target = lb.publish(state(1.0), 2.0, meta())
    rewrite_sidecar(lb, rewrite_target, id="someone-else")  # sidecar names another entry
    with pytest.warns(LeaderboardWarning) as rec:
        listed = lb.list()
    assert [e.id for e in listed] == [good]
    assert len(rec) == 6  # the edited sidecar is skipped and quarantined: two lines
    msgs = " ".join(str(w.message) for w in rec)
    assert "foreign" in msgs and "not valid JSON" in msgs and "not a leaderboard entry name" in msgs
    assert "sidecar checksum mismatch" in msgs and (lb.entries_dir / f".{rewrite_target}.json.corrupt").exists()


# --------------------------------------------------------------------------- NaN


def test_nan_scores(lb: Leaderboard):
    for bad in [float("nan"), float("inf"), "1.0", None, True]:
        with pytest.raises(ValueError, match="finite"):
            lb.publish(state(0), bad, meta())
    ok = lb.publish(state(0), 0.5, meta())
    nan_id = lb.publish(state(0), 1.0, meta())
    rewrite_sidecar(lb, nan_id, version=1, sidecar_sha256=None)  # a legacy (version 1) sidecar...
    p = lb.sidecar_path(nan_id)
    p.write_text(p.read_text().replace('"score": 1.0', '"score": NaN'))  # ...with a NaN score
    null_id = lb.publish(state(0), 1.0, meta())
    rewrite_sidecar(lb, null_id, score=None, version=1, sidecar_sha256=None)
    lb = Leaderboard(lb.root, accept_unkeyed=True)  # legacy sidecars are read only when asked for
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a NaN entry is skipped quietly: not a candidate, not an error
        assert [e.id for e in lb.list()] == [ok]
    assert np.isnan(lb.info(nan_id).score)
    lb.prune(top_k=5)
    assert lb.sidecar_path(nan_id).exists()  # prune leaves what it does not list alone


# --------------------------------------------------------------------------- races


def test_reader_loses_race_to_prune(lb: Leaderboard):
    ids = [lb.publish(state(s), s, meta(pod=int(s))) for s in (1.0, 2.0, 3.0)]
    seen = lb.list()  # the reader lists: best is ids[2]
    # meanwhile another job publishes better agents and prunes to the top 2
    lb.publish(state(8.0), 8.0, meta())
    lb.publish(state(9.0), 9.0, meta())
    removed = lb.prune(top_k=2)
    assert set(ids) <= set(removed)
    with pytest.raises(EntryGone, match=ids[2]):
        lb.load(seen[0].id)
    fresh = lb.publish(state(4.0), 4.0, meta())
    eid, tensors, _ = lb.load_best_available([*seen, fresh])
    assert eid == fresh and tensors["actor.weight"][0, 0].item() == 4.0
    with pytest.raises(EntryGone, match="none of the 3"):
        lb.load_best_available(seen)


def test_tensors_gone_after_sidecar_read(lb: Leaderboard):
    a = lb.publish(state(5.0), 5.0, meta())
    b = lb.publish(state(1.0), 1.0, meta())
    os.unlink(lb.tensors_path(a))  # a pruner deleted the tensors right after we read the sidecar
    with pytest.raises(EntryGone):
        lb.load(a)
    assert lb.load_best_available([lb.info(b), a])[0] == b  # an entry or its id
    assert lb.load_best_available([a, lb.info(b)])[0] == b


def test_load_best_available_skips_corrupt_with_warning(lb: Leaderboard):
    a = lb.publish(state(5.0), 5.0, meta())
    b = lb.publish(state(1.0), 1.0, meta())
    flip_byte(lb.tensors_path(a))
    with pytest.warns(LeaderboardWarning, match=a):
        assert lb.load_best_available(lb.list())[0] == b
    assert [e.id for e in lb.list()] == [b]  # quarantined after the first rejection
    assert lb.load_best_available([a, b], skip_corrupt=False)[0] == b  # gone, so skipped
    c = lb.publish(state(7.0), 7.0, meta())
    flip_byte(lb.tensors_path(c))
    with pytest.raises(EntryCorrupt), pytest.warns(LeaderboardWarning, match="quarantined"):
        lb.load_best_available([c, b], skip_corrupt=False)


def test_prune_is_idempotent_and_cleans_stale_files(lb: Leaderboard):
    for s in range(6):
        lb.publish(state(s), float(s), meta())
    assert len(lb.prune(top_k=3)) == 3
    assert lb.prune(top_k=3) == []
    assert [e.score for e in lb.list()] == [5.0, 4.0, 3.0]
    d = lb.entries_dir
    old = time.time() - 3600
    stale_tmp, fresh_tmp = d / ".x.safetensors.abc.tmp", d / ".y.json.abc.tmp"
    orphan, fresh_orphan = d / "j-0-0-0123456789ab.safetensors", d / "j-0-0-0123456789ac.safetensors"
    foreign = d / "model.safetensors"
    for p in (stale_tmp, fresh_tmp, orphan, fresh_orphan, foreign):
        p.write_bytes(b"x")
    for p in (stale_tmp, orphan, foreign):
        os.utime(p, (old, old))
    lb.prune(top_k=3)
    assert not stale_tmp.exists() and not orphan.exists()
    assert fresh_tmp.exists() and fresh_orphan.exists() and foreign.exists()
    assert len(lb.list()) == 3
    lb.prune(top_k=0)
    assert lb.list() == []


# --------------------------------------------------------------------------- concurrency


def _writer(root: str, wid: int, n: int, top_k: int, q) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(wid)
    board = Leaderboard(root)
    out = []
    for i in range(n):
        s = float(rng.normal())
        out.append((board.publish(state(s), s, meta(pod=wid, rnd=i, job="array_%d" % wid)), s))
        board.prune(top_k)
    q.put(("writer", out))


def _reader(root: str, done, q) -> None:
    """Lists and loads the best available entry until the writers are done (and once more).
    Bounded by time, not by tries: on a loaded host the writers may not have published anything
    yet after thousands of tries on an empty board."""
    torch.set_num_threads(1)
    board = Leaderboard(root)
    loaded, errors = 0, []
    deadline = time.monotonic() + 120
    while True:
        last = done.is_set() or time.monotonic() > deadline
        try:
            eid, tensors, m = board.load_best_available(board.list())
            assert tensors["actor.weight"].shape == (3, 2) and "pod" in m
            loaded += 1
        except EntryGone:
            time.sleep(0.001)  # nothing listed yet, or pruned under us: try again
        except Exception as e:  # anything else is a bug
            errors.append(repr(e))
        if last:
            break
    q.put(("reader", (loaded, errors)))


def test_concurrent_writers_pruners_and_readers(tmp_path: Path):
    root = str(tmp_path / "board")
    Leaderboard(root)
    ctx = mp.get_context("fork")
    q, done = ctx.Queue(), ctx.Event()
    n_writers, per_writer, top_k = 4, 5, 4
    writers = [ctx.Process(target=_writer, args=(root, w, per_writer, top_k, q)) for w in range(n_writers)]
    reader = ctx.Process(target=_reader, args=(root, done, q))
    procs = [reader, *writers]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in writers]
    done.set()
    results.append(q.get(timeout=60))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    published = [x for kind, r in results if kind == "writer" for x in r]
    assert len(published) == n_writers * per_writer
    assert len({eid for eid, _ in published}) == len(published)  # unique ids
    ((loaded, errors),) = [r for kind, r in results if kind == "reader"]
    assert errors == [] and loaded > 0

    board = Leaderboard(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no half-written or broken file is ever seen
        board.prune(top_k)
        listed = board.list()
    expected = sorted(published, key=lambda x: (-x[1], x[0]))[:top_k]
    assert [(e.id, e.score) for e in listed] == expected  # the global top K survived
    for e in listed:
        tensors, m = board.load(e.id)
        assert tensors["actor.weight"][0, 0].item() == pytest.approx(e.score)
    names = sorted(p.name for p in board.entries_dir.iterdir())
    assert len(names) == 2 * top_k and not [n for n in names if n.startswith(".")]


# --------------------------------------------------------------------------- permissions


def test_directories_and_files_are_not_world_accessible(lb: Leaderboard):
    eid = lb.publish(state(1.0), 1.0, meta())
    for d in (lb.root, lb.entries_dir):
        mode = d.stat().st_mode
        assert mode & 0o007 == 0 and mode & stat.S_ISGID, oct(mode)
    for p in (lb.tensors_path(eid), lb.sidecar_path(eid)):
        assert p.stat().st_mode & 0o007 == 0, oct(p.stat().st_mode)


def test_existing_world_readable_dir_warns(tmp_path: Path):
    d = tmp_path / "open"
    (d / "entries").mkdir(parents=True)
    os.chmod(d / "entries", 0o755)
    with pytest.warns(LeaderboardWarning, match="accessible by all users"):
        Leaderboard(d)


# --------------------------------------------------------------------------- integrity of what decides


def test_an_edited_score_never_ranks_and_is_quarantined(lb: Leaderboard):
    """The chaos run's case: a sidecar edited to score 1e9 was trusted. Now its own digest fails."""
    honest = lb.publish(state(1.0), 1.0, meta())
    forged = lb.publish(state(2.0), 2.0, meta())
    rewrite_sidecar(lb, forged, score=1e9)
    with pytest.warns(LeaderboardWarning, match="sidecar checksum mismatch"):
        assert [e.id for e in lb.list()] == [honest]
    assert (lb.entries_dir / f".{forged}.json.corrupt").exists()
    with pytest.raises(EntryGone):
        lb.load(forged)


def test_an_edited_score_with_a_recomputed_digest_is_refused(lb: Leaderboard):
    """Whoever also recomputes the (unkeyed) sidecar digest is caught by the keyed one: the entry
    never ranks nor loads, and its files stay as they are (evidence)."""
    honest = lb.publish(state(1.0), 1.0, meta())
    forged = lb.publish(state(2.0), 2.0, meta())
    p = lb.sidecar_path(forged)
    d = json.loads(p.read_text())
    d["score"] = 1e9
    d["sidecar_sha256"] = lb_mod._sidecar_digest(d)
    p.write_text(json.dumps(d))
    with pytest.warns(LeaderboardWarning, match="forged or from another leaderboard"):
        assert [e.id for e in lb.list()] == [honest]
    with pytest.raises(EntryRefused, match="forged or from another leaderboard"):
        lb.load(forged)
    assert p.exists()  # refused, not quarantined


def test_an_unkeyed_sidecar_with_a_recomputed_digest_is_refused_on_load(lb: Leaderboard):
    """A reader that accepts unkeyed (older) entries still has the checksummed copy of the
    score in the tensor file: an edited score ranks but is never loaded."""
    forged = lb.publish(state(2.0), 2.0, meta())
    p = lb.sidecar_path(forged)
    d = json.loads(p.read_text())
    d.update(score=1e9, version=2)
    del d["hmac"]
    d["sidecar_sha256"] = lb_mod._sidecar_digest(d)
    p.write_text(json.dumps(d))
    with pytest.warns(LeaderboardWarning, match="written before entries were keyed"):
        assert lb.list() == []  # refused by default
    old = Leaderboard(lb.root, accept_unkeyed=True)
    assert old.list()[0].score == 1e9  # it ranks (the digest matches)...
    with pytest.raises(EntryCorrupt, match="score differ"):
        old.load(forged)  # ...but is never loaded, and leaves the listing
    assert forged not in {e.id for e in old.list()}


def test_version_1_sidecars_load_only_when_asked_for_and_their_score_is_checked(lb: Leaderboard):
    old = lb.publish(state(1.0), 1.0, meta())
    p = lb.sidecar_path(old)
    d = json.loads(p.read_text())
    d["version"] = 1
    del d["sidecar_sha256"], d["hmac"]
    p.write_text(json.dumps(d))
    with pytest.raises(EntryRefused, match="--accept-unkeyed"):
        lb.load(old)
    lb = Leaderboard(lb.root, accept_unkeyed=True)
    assert [e.id for e in lb.list()] == [old]
    tensors, m = lb.load(old)
    assert torch.equal(tensors["actor.weight"], state(1.0)["actor.weight"]) and m["pod"] == 0
    d["score"] = 50.0
    p.write_text(json.dumps(d))
    with pytest.raises(EntryCorrupt, match="score differ"):
        lb.load(old)


def test_content_ids_make_a_redone_publish_idempotent(lb: Leaderboard):
    a = lb.publish(state(1.0), 1.0, meta(), content_id=True)
    b = lb.publish(state(1.0), 1.0, meta(), content_id=True)
    c = lb.publish(state(1.0), 1.5, meta(), content_id=True)
    assert a == b != c and len(lb.list()) == 2
    lb.tensors_path(a).unlink()  # half an entry (tensors pruned as an orphan): publishing again mends it
    assert lb.publish(state(1.0), 1.0, meta(), content_id=True) == a
    assert torch.equal(lb.load(a)[0]["actor.weight"], state(1.0)["actor.weight"])


def test_a_publisher_stalled_past_stale_after_s_keeps_its_entry(lb: Leaderboard, monkeypatch: pytest.MonkeyPatch):
    """Tensors written, then a stall longer than the pruner's stale_after_s: the pruner removes
    them as an orphan before the sidecar lands. publish() must still return a whole entry."""
    real = lb_mod.write_new
    calls = []

    def stalled(path, data, mode=entryfiles.FILE_MODE, sync_dir=True):
        if path.suffix == ".json" and not calls:
            calls.append(path)
            assert lb.prune(top_k=10, stale_after_s=0) == []  # what another rank's prune does meanwhile
            assert not path.with_suffix(".safetensors").exists()  # the orphan is gone
        real(path, data, mode, sync_dir)

    monkeypatch.setattr(lb_mod, "write_new", stalled)
    eid = lb.publish(state(3.0), 3.0, meta())
    assert calls and lb.tensors_path(eid).exists()
    assert torch.equal(lb.load(eid)[0]["actor.weight"], state(3.0)["actor.weight"])


def test_prune_keeps_entries_a_round_still_needs(lb: Leaderboard):
    ids = [lb.publish(state(s), s, meta(pod=int(s))) for s in (1.0, 2.0, 3.0, 4.0)]
    assert sorted(lb.prune(top_k=2, keep=[ids[0]])) == sorted([ids[1]])
    assert {e.id for e in lb.list()} == {ids[0], ids[2], ids[3]}


def test_prune_on_a_listing_the_caller_made_keeps_what_it_did_not_see(lb: Leaderboard):
    ids = [lb.publish(state(s), s, meta(pod=int(s))) for s in (1.0, 2.0, 3.0)]
    seen = lb.list()
    newer = lb.publish(state(0.5), 0.5, meta(pod=9))  # published after the caller listed
    before = dict(entryfiles.FS_OPS)
    assert lb.prune(top_k=1, listing=seen) == [ids[1], ids[0]]
    assert entryfiles.FS_OPS.get("open", 0) == before.get("open", 0)  # no sidecar was read again
    assert {e.id for e in lb.list()} == {ids[2], newer}


@pytest.mark.parametrize(
    "top_k, keep, expect",
    [
        (2, set(), ["c", "d"]),
        (1, {"d"}, ["b", "c"]),
        (0, set(), ["a", "b", "c", "d"]),
        (9, set(), []),
    ],
)
def test_plan_prune_keeps_the_top_k_and_the_kept(top_k, keep, expect):
    infos = [Entry(i, s) for i, s in (("c", 1.0), ("a", 4.0), ("d", 0.5), ("b", 3.0))]
    assert sorted(plan_prune(infos, top_k, keep)) == expect


def test_plan_prune_keeps_the_top_k_of_each_group():
    infos = [Entry(f"{g}{i}", float(i), meta={"kind": g}) for g in "xy" for i in range(3)]
    assert sorted(plan_prune(infos, 1, group=lambda e: e.meta["kind"])) == ["x0", "x1", "y0", "y1"]
