"""bench/leaderboard_fsops.py's simulated MPI world (ranks taking turns) and its collective path,
at a tiny size: the collectives give MPI's results, ranks run one at a time, a failing rank frees
the others, and the strace count attributes calls to every pod."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "leaderboard_fsops.py"


def _bench():
    spec = importlib.util.spec_from_file_location("leaderboard_fsops", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_world(mod, n: int, body) -> tuple[list, list[BaseException]]:
    world, out, errors = mod.World(n), [None] * n, []

    def run(rank: int) -> None:
        try:
            world.begin(rank)
            out[rank] = body(mod.ThreadComm(world, rank))
            world.end(rank)
        except threading.BrokenBarrierError as e:
            errors.append(e)
        except Exception as e:  # noqa: BLE001 - the test's failing rank
            errors.append(e)
            world.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    world.go()
    for t in threads:
        t.join(timeout=60)  # a deadlock guard, not a speed check
    assert not any(t.is_alive() for t in threads), "a rank is still waiting: the world deadlocked"
    return out, errors


def test_world_collectives_give_mpi_results_one_rank_at_a_time():
    mod = _bench()
    running, most, order = [0], [0], []

    def step(rank: int) -> None:  # the work between two collectives
        running[0] += 1
        most[0] = max(most[0], running[0])
        order.append(rank)
        running[0] -= 1

    def body(comm):
        step(comm.rank)
        gathered = comm.allgather(comm.rank * 10)
        step(comm.rank)
        root = comm.bcast(f"from {comm.rank}", root=0)
        comm.barrier()
        again = comm.allgather((comm.rank, gathered[-1]))
        return gathered, root, again, comm.size

    out, errors = _run_world(mod, 5, body)
    assert errors == []
    for gathered, root, again, size in out:
        assert gathered == [0, 10, 20, 30, 40] and root == "from 0" and size == 5
        assert again == [(r, 40) for r in range(5)]  # a later collective does not clobber an earlier result
    assert most[0] == 1  # never two ranks at once
    assert order == [0, 1, 2, 3, 4] * 2  # each step, rank after rank


def test_world_a_failing_rank_frees_every_other():
    mod = _bench()

    def body(comm):
        comm.allgather(comm.rank)
        if comm.rank == 2:
            raise ValueError("rank 2 fails")
        comm.barrier()
        return "done"

    out, errors = _run_world(mod, 4, body)
    assert out == [None] * 4  # nobody got past the broken barrier
    assert [type(e) for e in errors].count(ValueError) == 1
    assert sum(isinstance(e, threading.BrokenBarrierError) for e in errors) == 3


@pytest.mark.parametrize("rule", ["elegantrl", "pbt"])
def test_collective_worker_runs_real_rounds(tmp_path, rule):
    """The worker's collective path in this process: the real Pool writes every round's listing."""
    import podracer_hpc.pool.rounds as pool_mod

    mod, real_decide = _bench(), pool_mod.decide
    args = argparse.Namespace(pods=[6], mode="collective", rule=rule, rounds=2, run_dir=str(tmp_path / "run"))
    assert mod.worker(args) == 0
    # the worker shares one rank's decisions among its threads; later tests in this process get
    # the real rule back (a leaked patch once handed a one-pod pool a six-pod world's decisions)
    assert pool_mod.decide is real_decide
    rounds = sorted(p.name for p in (tmp_path / "run" / "rounds").iterdir())
    assert len(rounds) == 2, rounds
    assert list((tmp_path / "run" / "leaderboard").rglob("*.safetensors"))  # the round's best were published


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_collective_counts_are_attributed_to_every_pod(tmp_path):
    """Under strace, 4 pods, collective PBT: the calls are counted per pod, rank 0 (the lister) the busiest."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, str(BENCH), "--pods", "4", "--modes", "collective", "--rules", "pbt", "--rounds", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    (row,) = out["rows"]
    assert row["pods"] == 4 and row["mode"] == "collective" and row["rule"] == "pbt"
    assert row["metadata"] > 0 and row["metadata_max"] > row["metadata"]  # rank 0 lists and writes the listing
    assert row["by_call"].get("openat", 0) > 0
