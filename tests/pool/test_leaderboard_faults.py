"""The leaderboard under real faults: 8 concurrent processes, SIGKILLed writers, tampered entries.

Everything here runs real processes on a real directory (no mocks). The worker processes come
from a multiprocessing ``forkserver`` that has imported torch and this module once: each is a
fresh process forked from that clean, single-threaded server (never a fork of the test process,
whose torch thread pools may be running), without paying torch's import time eight times over.

Every entry written here encodes its identity in its tensors: ``ident = [writer, index]`` and
``w`` is drawn from a generator seeded by ``(writer, index)``, so any loaded entry can be checked
bit-exact against what its publisher wrote, from its metadata alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import mpiexec_or_skip

from podracer_hpc.pool.entryfiles import LeaderboardWarning
from podracer_hpc.pool.leaderboard import EntryCorrupt, EntryGone, Leaderboard

REPO = Path(__file__).resolve().parents[2]

N_POOL = 8  # concurrent processes on one leaderboard
PER_WORKER = 6  # entries each of them publishes (per phase)
LOADS_PER_PUBLISH = 2  # random listed entries each of them loads after each publish
TOP_K = 5  # the prune phase keeps this many
BIG = 8_000_000  # float32 elements of a "large" entry: 32 MB


# --------------------------------------------------------------------------- entries with an identity


def entry_tensors(wid: int, i: int, numel: int = 48 * 48) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1_000_003 * (wid + 1) + i)
    return {"ident": torch.tensor([wid, i], dtype=torch.int64), "w": torch.randn(numel, generator=g)}


def entry_score(wid: int, i: int) -> float:
    return float(np.random.default_rng([wid, i, 7]).normal())  # distinct with probability 1


def verify(board: Leaderboard, eid: str, numel: int = 48 * 48) -> tuple[int, int]:
    """Load ``eid`` and check it bit-exact against what its publisher wrote; returns (writer, index)."""
    tensors, meta = board.load(eid)
    wid, i = int(meta["pod"]), int(meta["round"])
    want = entry_tensors(wid, i, numel)
    if set(tensors) != set(want) or not all(torch.equal(tensors[k], want[k]) for k in want):
        raise AssertionError(f"{eid}: tensors differ from what writer {wid} published as #{i}")
    return wid, i


def _wait_for(pred, timeout: float, what: str, poll: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def _ctx() -> mp.context.BaseContext:
    """A forkserver that has imported torch, the leaderboard and this module (the workers' code)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "podracer_hpc.pool.leaderboard", __name__])
    return ctx


# --------------------------------------------------------------------------- worker processes


def pool_worker(root_a: str, root_b: str, sync: str, wid: int) -> None:
    """Phase 1: publish + load on ``root_a`` (no prune). Phase 2: publish + prune + load on ``root_b``."""
    torch.set_num_threads(1)
    warnings.simplefilter("error", LeaderboardWarning)  # a half-visible file would raise in list()
    rng = random.Random(wid)
    sync_dir = Path(sync)
    out: dict = {"wid": wid}

    def barrier(name: str) -> None:
        (sync_dir / f"{name}.{wid}").touch()
        _wait_for(lambda: len(list(sync_dir.glob(f"{name}.*"))) >= N_POOL, 120, f"barrier {name}")

    (sync_dir / f"ready.{wid}").touch()
    _wait_for(lambda: (sync_dir / "go").exists(), 120, "go")
    for phase, root, prune in (("noprune", root_a, False), ("prune", root_b, True)):
        board = Leaderboard(root)
        published, loaded, gone, errors = [], 0, 0, []
        t_first = time.time()
        for i in range(PER_WORKER):
            try:
                eid = board.publish(entry_tensors(wid, i), entry_score(wid, i), {"job": phase, "pod": wid, "round": i})
                published.append(eid)
                if prune:
                    board.prune(TOP_K)
            except Exception as e:  # noqa: BLE001  (reported to the test)
                errors.append(f"publish/prune #{i}: {e!r}")
            for _ in range(LOADS_PER_PUBLISH):
                try:
                    listed = board.list()
                    if listed:
                        verify(board, rng.choice(listed).id)
                        loaded += 1
                except EntryGone as e:  # only a prune may pull an entry from under a reader
                    gone += 1
                    if not prune:
                        errors.append(f"EntryGone without any prune: {e}")
                except Exception as e:  # noqa: BLE001
                    errors.append(f"load: {e!r}")
        out[phase] = {
            "published": published,
            "loaded": loaded,
            "gone": gone,
            "errors": errors,
            "span": [t_first, time.time()],
        }
        barrier(f"done-{phase}")
    (sync_dir / f"result.{wid}.json").write_text(json.dumps(out))


def kill_writer(root: str, go: str, report: str, wid: int) -> None:
    """Publish 32 MB entries in a loop until killed; appends 'start I' / 'done ID SECONDS' lines to ``report``."""
    torch.set_num_threads(1)
    board = Leaderboard(root)
    with open(report, "a", buffering=1) as out:
        out.write("ready\n")
        _wait_for(lambda: Path(go).exists(), 120, "go")
        i = 0
        while True:
            t = entry_tensors(wid, i, BIG)
            out.write(f"start {i}\n")
            t0 = time.perf_counter()
            eid = board.publish(t, entry_score(wid, i), {"job": "kill", "pod": wid, "round": i})
            out.write(f"done {eid} {time.perf_counter() - t0:.4f}\n")
            i += 1


class Report:
    """Reads a writer's report file line by line as it grows (only complete lines)."""

    def __init__(self, path: Path):
        self.path, self.seen = path, 0

    def lines(self) -> list[str]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        return text[: text.rfind("\n") + 1].splitlines()

    def next(self, timeout: float = 60) -> list[str]:
        _wait_for(lambda: len(self.lines()) > self.seen, timeout, f"a line in {self.path}", poll=0.001)
        self.seen += 1
        return self.lines()[self.seen - 1].split()


# --------------------------------------------------------------------------- (a) 8 processes at once


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """Run the 8 workers once (both phases); the tests below check the two boards."""
    base = tmp_path_factory.mktemp("pool")
    root_a, root_b, sync = base / "board_a", base / "board_b", base / "sync"
    sync.mkdir()
    for r in (root_a, root_b):
        Leaderboard(r)
    ctx = _ctx()
    procs = [ctx.Process(target=pool_worker, args=(str(root_a), str(root_b), str(sync), w)) for w in range(N_POOL)]
    try:
        for p in procs:
            p.start()
        _wait_for(lambda: len(list(sync.glob("ready.*"))) == N_POOL or any(p.exitcode for p in procs), 120, "workers")
        (sync / "go").touch()  # all 8 start publishing at the same moment
        for p in procs:
            p.join(timeout=120)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * N_POOL, "a worker failed (its traceback is in the captured stderr)"
    results = [json.loads((sync / f"result.{w}.json").read_text()) for w in range(N_POOL)]
    return {"a": Leaderboard(root_a), "b": Leaderboard(root_b), "results": results}


def _list_strict(board: Leaderboard):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return board.list()


def test_eight_processes_publish_and_load_at_once_nothing_lost(pool):
    res = [r["noprune"] for r in pool["results"]]
    assert [e for r in res for e in r["errors"]] == []
    assert sum(r["gone"] for r in res) == 0
    assert sum(r["loaded"] for r in res) == N_POOL * PER_WORKER * LOADS_PER_PUBLISH  # every load verified
    published = [eid for r in res for eid in r["published"]]
    assert len(published) == len(set(published)) == N_POOL * PER_WORKER
    assert max(r["span"][0] for r in res) < min(r["span"][1] for r in res), "the 8 workers never overlapped"

    board = pool["a"]
    listed = _list_strict(board)
    assert {e.id for e in listed} == set(published)  # nothing lost
    assert [e.score for e in listed] == sorted((e.score for e in listed), reverse=True)
    seen = set()
    for e in listed:
        wid, i = verify(board, e.id)
        assert e.score == entry_score(wid, i) and e.pod == wid and e.round == i
        seen.add((wid, i))
    assert seen == {(w, i) for w in range(N_POOL) for i in range(PER_WORKER)}
    names = sorted(p.name for p in board.entries_dir.iterdir())
    assert len(names) == 2 * len(published) and not [n for n in names if n.startswith(".")]


def test_eight_processes_with_concurrent_prune_keep_exactly_the_top_k(pool):
    res = [r["prune"] for r in pool["results"]]
    assert [e for r in res for e in r["errors"]] == []  # EntryGone is the only race a reader may lose
    assert sum(r["loaded"] for r in res) > 0
    published = {eid: None for r in res for eid in r["published"]}
    assert len(published) == N_POOL * PER_WORKER
    assert max(r["span"][0] for r in res) < min(r["span"][1] for r in res), "the 8 workers never overlapped"

    board = pool["b"]
    listed = _list_strict(board)  # no prune here: the workers' own prunes must have left the top K
    scores = {}
    for e in listed:
        wid, i = verify(board, e.id)
        scores[e.id] = entry_score(wid, i)
    every = sorted(((entry_score(w, i), w, i) for w in range(N_POOL) for i in range(PER_WORKER)), reverse=True)
    assert sorted(scores.values(), reverse=True) == [s for s, _, _ in every[:TOP_K]]
    assert [e.id for e in listed] == [e.id for e in sorted(listed, key=lambda e: -scores[e.id])]
    assert set(scores) <= set(published)
    names = sorted(p.name for p in board.entries_dir.iterdir())
    assert len(names) == 2 * TOP_K and not [n for n in names if n.startswith(".")], names
    assert board.prune(TOP_K, stale_after_s=0) == []  # idempotent: nothing left to do


# --------------------------------------------------------------------------- (b) SIGKILL mid-write


def _writer_files(d: Path, wid: int) -> tuple[list[str], list[str]]:
    """(hidden temp files, orphan tensor files) of writer ``wid`` in ``d``."""
    names = {p.name for p in d.iterdir()}
    tmp = [n for n in names if n.startswith(f".kill-{wid}-") and n.endswith(".tmp")]
    orphans = [
        n
        for n in names
        if n.startswith(f"kill-{wid}-")
        and n.endswith(".safetensors")
        and n[: -len(".safetensors")] + ".json" not in names
    ]
    return tmp, orphans


def test_sigkilled_writers_leave_no_visible_partial_entry(tmp_path):
    """Four writers of 32 MB entries, each SIGKILLed once: one while its tensor temp file is
    provably being written (caught with SIGSTOP, checked, then killed), three at random moments
    of a write (uniform over its measured duration)."""
    root = tmp_path / "board"
    board = Leaderboard(root)
    d = board.entries_dir
    n_writers = 4
    gos = [tmp_path / f"go{w}" for w in range(n_writers)]
    reports = [Report(tmp_path / f"report{w}.txt") for w in range(n_writers)]
    ctx = _ctx()
    procs = [
        ctx.Process(target=kill_writer, args=(str(root), str(gos[w]), str(reports[w].path), w))
        for w in range(n_writers)
    ]
    rng = random.Random()  # a different set of kill moments every run
    caught = []  # what each kill interrupted
    try:
        for p in procs:
            p.start()
        for rep in reports:
            assert rep.next() == ["ready"]
        for w, p in enumerate(procs):
            gos[w].touch()
            if w == 0:  # kill while the tensor temp file exists
                deadline = time.monotonic() + 20
                while True:
                    assert time.monotonic() < deadline, "never saw writer 0's temp file"
                    tmp, _ = _writer_files(d, w)
                    if any(".safetensors." in n for n in tmp):
                        os.kill(p.pid, signal.SIGSTOP)
                        tmp, _ = _writer_files(d, w)
                        if any(".safetensors." in n for n in tmp):
                            os.kill(p.pid, signal.SIGKILL)
                            caught.append("tensor temp file")
                            break
                        os.kill(p.pid, signal.SIGCONT)
                    time.sleep(0.001)
            else:  # kill at a random moment of the second write
                rep = reports[w]
                assert rep.next()[0] == "start"
                line = rep.next()
                assert line[0] == "done", line
                duration = float(line[2])
                assert rep.next()[0] == "start"
                delay = rng.uniform(0, duration)
                time.sleep(delay)
                os.kill(p.pid, signal.SIGKILL)
                caught.append(f"{delay:.3f}s into a {duration:.3f}s write")
            p.join(timeout=30)
            assert p.exitcode == -signal.SIGKILL
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    # completed publishes reported before the kills
    done = {w: [ln.split()[1] for ln in rep.lines() if ln.startswith("done ")] for w, rep in enumerate(reports)}

    debris = [n for w in range(n_writers) for n in sum(_writer_files(d, w), [])]
    assert debris, f"no kill left a temp or orphan file ({caught}): the test did not exercise a partial write"
    listed = _list_strict(board)  # temp files and orphan tensors are ignored, silently
    listed_ids = {e.id for e in listed}
    all_done = {eid for ids in done.values() for eid in ids}
    assert all_done <= listed_ids, caught  # every reported publish is there
    for w in range(n_writers):  # at most the in-flight entry of each writer completed unreported
        assert len([e for e in listed if e.pod == w and e.id not in all_done]) <= 1, caught
    for e in listed:
        wid, i = verify(board, e.id, BIG)  # whole and bit-exact
        assert e.score == entry_score(wid, i)

    assert board.prune(top_k=1000, stale_after_s=0) == []  # removes the debris, no entry
    left = {p.name for p in d.iterdir()} - {f"{e}{ext}" for e in listed_ids for ext in (".json", ".safetensors")}
    assert not left, f"left after prune(stale_after_s=0): {sorted(left)}"
    assert len(list(d.iterdir())) == 2 * len(listed_ids)
    assert [e.id for e in _list_strict(board)] == [e.id for e in listed]


# --------------------------------------------------------------------------- (c) tampered entries


def _payload_offset(blob: bytes) -> int:
    (n,) = struct.unpack("<Q", blob[:8])
    return 8 + n


def forge_sidecar(board: Leaderboard, eid: str) -> None:
    """Make the sidecar's sha256 match whatever the tensors file now holds, and its own digests
    match the edited sidecar (a deliberate forgery by someone who holds the leaderboard's secret,
    a group member, that gets past the listing's checks: the tensor file's own are left)."""
    from podracer_hpc.pool.leaderboard import _sidecar_digest, _sidecar_hmac

    p = board.sidecar_path(eid)
    d = json.loads(p.read_text())
    d["sha256"] = hashlib.sha256(board.tensors_path(eid).read_bytes()).hexdigest()
    d["hmac"] = _sidecar_hmac(board.secret(), d)
    d["sidecar_sha256"] = _sidecar_digest(d)
    p.write_text(json.dumps(d))


def tamper_payload(board: Leaderboard, eid: str) -> None:
    """Change bytes in the middle of the tensor data, then forge the sidecar to match."""
    p = board.tensors_path(eid)
    blob = bytearray(p.read_bytes())
    mid = (_payload_offset(blob) + len(blob)) // 2
    blob[mid : mid + 4] = bytes(b ^ 0x5A for b in blob[mid : mid + 4])
    p.write_bytes(bytes(blob))
    forge_sidecar(board, eid)


def test_tampered_entries_with_forged_digests_are_rejected_and_skipped(tmp_path):
    board = Leaderboard(tmp_path / "board")
    ids = {i: board.publish(entry_tensors(0, i), float(10 - i), {"pod": 0, "round": i}) for i in range(3)}
    a, b, c = ids[0], ids[1], ids[2]  # scores 10, 9, 8
    tamper_payload(board, a)  # payload changed, sidecar digest edited to match
    shutil.copyfile(board.tensors_path(c), board.tensors_path(b))  # tensors replaced by another entry's
    forge_sidecar(board, b)

    assert [e.id for e in board.list()] == [a, b, c]  # the sidecars look fine...
    with pytest.warns(LeaderboardWarning) as rec:  # ...but loading skips both, naming them
        eid, tensors, meta = board.load_best_available(board.list())
    assert eid == c and torch.equal(tensors["w"], entry_tensors(0, 2)["w"]) and meta["round"] == 2
    msgs = [str(w.message) for w in rec]
    skipped = [m for m in msgs if "trying the next candidate" in m]
    assert len(skipped) == 2 and a in skipped[0] and b in skipped[1]
    assert "checksum mismatch" in skipped[0] and f"holds entry '{c}'" in skipped[1]
    # Both are quarantined: out of every reader's listing, the evidence kept aside.
    assert [e.id for e in board.list()] == [c]
    assert (board.entries_dir / f".{a}.json.corrupt").exists() and (board.entries_dir / f".{b}.json.corrupt").exists()
    with pytest.raises(EntryGone):
        board.load(a)
    # A direct load of a fresh forgery raises, naming the entry.
    d = board.publish(entry_tensors(0, 3), 1.0, {"pod": 0, "round": 3})
    tamper_payload(board, d)
    with pytest.raises(EntryCorrupt, match=f"leaderboard entry {d}: .*checksum mismatch"):
        board.load(d)


# --------------------------------------------------------------------------- (c) ... under mpiexec


SENTINEL = 4242.0  # every network weight of the corrupt entry: a pod that used it would show it


@pytest.fixture(scope="module")
def corrupt_run(tmp_path_factory):
    """A 2-pod quickstart run against a leaderboard that holds a corrupt entry with a huge score
    (and one genuine, modest entry): elastic join at start and both rounds want the corrupt one."""
    mpiexec = mpiexec_or_skip()
    from podracer_hpc.config import load_config
    from podracer_hpc.pod import Pod

    base = tmp_path_factory.mktemp("corrupt_run")
    run_dir, lb_dir = base / "R", base / "B"
    sets = [
        "total_env_steps=16384",
        "tournament.interval_env_steps=8192",
        "eval.interval_env_steps=8192",
        f"tournament.leaderboard_dir={lb_dir}",
    ]
    board = Leaderboard(lb_dir)
    torch.manual_seed(0)
    pod = Pod(load_config(REPO / "jobs" / "quickstart.yaml", sets), rank=0, device="cpu")
    pod.train_iteration()  # an agent with optimizer state: a loadable entry
    tensors, meta = pod.agent_tensors()
    good = board.publish(tensors, -300.0, {**meta, "job": "seed", "pod": 0, "round": 0})
    bad_tensors = {
        k: torch.full_like(v, SENTINEL) if k.startswith("net.") and v.is_floating_point() else v
        for k, v in tensors.items()
    }
    bad = board.publish(bad_tensors, 1.0e6, {**meta, "job": "tamper", "pod": 0, "round": 0})
    tamper_payload(board, bad)  # (not loaded here: the first load would quarantine it)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PODRACER_COMM", None)
    cmd = [
        mpiexec,
        "-n",
        "2",
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(run_dir),
        "--quiet",
        *sum((["--set", s] for s in sets), []),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO, env=env)
    return {"r": r, "run": run_dir, "board": board, "good": good, "bad": bad}


@pytest.mark.mpi
def test_corrupt_high_score_entry_is_rejected_clearly_and_never_used(corrupt_run):
    from podracer_hpc.files import safeio
    from podracer_hpc.files.h5log import read_log

    r, bad, good = corrupt_run["r"], corrupt_run["bad"], corrupt_run["good"]
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["pods"] == 2 and summary["rounds"] == 2
    # A clear line names the rejected entry and says why.
    lines = [ln for ln in r.stderr.splitlines() if bad in ln]
    assert lines, f"no stderr line names the corrupt entry {bad}:\n{r.stderr}"
    assert any("checksum mismatch" in ln or "corrupt" in ln for ln in lines), lines
    assert f"joined from leaderboard entry {bad}" not in r.stderr
    # both pods fell through to the genuine entry and evaluated it first (a join takes only an
    # agent that beats the pod's fresh one on the same start states; one update of training may not)
    took = r.stderr.count(f"joined from leaderboard entry {good}")
    assert took + r.stderr.count(f"skipping leaderboard entry {good}: it does not beat a fresh agent") == 2
    rejected_rows = 0
    for rank in range(2):
        t = read_log(corrupt_run["run"] / "logs" / f"quickstart_rank{rank}.h5")["tournament"]
        assert [x for x in t["round"] if x >= 0] == [0, 1]  # (a join may be logged as round -1)
        for rnd, action, source in zip(t["round"], t["action"], t["source"]):
            assert source != bad, "a pod used the corrupt entry"
            if rnd < 0:
                assert source == good, (action, source)
            if bad in source:
                assert source == f"rejected:{bad}" and action == "keep"
                rejected_rows += 1
        # Nothing of the corrupt entry reached a pod: no weight anywhere near the sentinel.
        tensors, _, _ = safeio.load(corrupt_run["run"] / "checkpoints" / f"rank{rank}.safetensors", "pod-state")
        worst = max(v.abs().max().item() for k, v in tensors.items() if k.startswith("net.") and v.numel())
        assert math.isfinite(worst) and worst < SENTINEL / 2, worst
    # Rejected once at the join, then quarantined: no round could draw it again.
    assert rejected_rows == 0
    assert (corrupt_run["board"].entries_dir / f".{bad}.json.corrupt").exists()


@pytest.mark.mpi
def test_corrupt_entry_does_not_survive_the_run(corrupt_run):
    """After pods rejected it, the corrupt entry should leave the listing (quarantined or deleted),
    or it blocks every later round of every job on this board (here: all 4 decisions were 'rejected')."""
    assert corrupt_run["r"].returncode == 0
    assert corrupt_run["bad"] not in {e.id for e in corrupt_run["board"].list()}
