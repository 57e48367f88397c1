"""A hung rank ends its world fast, named (a real SIGSTOP under a real mpiexec), and nothing of
the pool's other part stops."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import mpiexec_or_skip, wait_for

from podracer_hpc.files.rundir import EXIT_HUNG

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.mpi

DEADLINE = 4.0
FAST = [
    "env.num_envs=64",
    "agent.rollout_steps=16",
    "eval.episodes=4",
    "threads=1",
    "log.progress_interval_s=0",
    f"tournament.meeting_timeout_s={DEADLINE}",
    "log.aggregate_interval_s=1",
]


def env(**extra: str) -> dict:
    e = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    e.pop("PODRACER_COMM", None)
    return e


def cmd(n: int, run: Path, *sets: str, part: str = "") -> list[str]:
    args = [mpiexec_or_skip(), "-n", str(n), sys.executable, "-m", "podracer_hpc.cli", "train", "jobs/quickstart.yaml"]
    args += ["--run-dir", str(run), "--quiet", *(["--pool-part", part] if part else [])]
    return args + sum((["--set", s] for s in (*FAST, *sets)), [])


def test_a_stopped_rank_ends_a_collective_world_within_the_deadline_named(tmp_path):
    """Rank 1 of 3 stops itself (SIGSTOP) after update 3, before round 0 (at update 4): ranks 0
    and 2 wait at the round; within the deadline (+ slack for a loaded machine) the world ends with
    EXIT_HUNG, and the message and the part's record name pod 1, its host, pid and what it did."""
    run = tmp_path / "run"
    sets = ("total_env_steps=16384", "tournament.interval_env_steps=4096", "eval.interval_env_steps=4096")
    t0 = time.monotonic()
    p = subprocess.Popen(
        cmd(3, run, *sets),
        cwd=REPO,
        env=env(PODRACER_INJECT_HANG="1:3"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = p.communicate(timeout=240)
    took = time.monotonic() - t0
    assert p.returncode == EXIT_HUNG, err
    hung = json.loads((run / "parts" / "part0.hung.json").read_text())
    assert [h["pod"] for h in hung["hung"]] == [1] and hung["busy"] == []
    h = hung["hung"][0]
    assert h["rank"] == 1 and h["host"] and h["device"] == "cpu" and h["pid"] and h["doing"] == "training"
    assert h["silent_s"] >= DEADLINE and hung["deadline_s"] == DEADLINE and hung["wait"] == "meeting"
    assert "missed its deadline of 4 s" in err and f"pid {h['pid']}" in err and "pod 1 (rank 1" in err, err
    # from the stop to the end: the deadline, a quarter deadline between looks, and start-up and
    # training of 4 updates on a shared 2-core machine
    stopped_at = json.loads((run / "heartbeats" / "pod1.json").read_text())["t"]
    ended_at = hung["written"]
    assert ended_at - stopped_at < DEADLINE + 15, (ended_at - stopped_at, took)
    wait_for(lambda: not alive(h["pid"]), 10, "the stopped rank to end with its world")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (or is stopped): not gone, not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_hung_rank_of_one_part_of_an_async_pool_leaves_the_other_part_to_finish(tmp_path):
    """A pool of 2 parts x 2 pods (async rounds, what --pods-per-job starts): pod 3 (rank 1 of
    part 1) stops itself; its partner finishes training and waits at the end; the deadline ends
    part 1 with EXIT_HUNG, naming pod 3, while part 0 completes (exit 0, both pods done)."""
    run = tmp_path / "pool"
    sets = (
        "total_env_steps=16384",
        "tournament.sync=async",
        "tournament.interval_env_steps=4096",
        "eval.interval_env_steps=8192",
    )
    procs = [
        subprocess.Popen(
            cmd(2, run, *sets, part=f"{k}/2"),
            cwd=REPO,
            env=env(PODRACER_INJECT_HANG="3:3"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(2)
    ]
    res = [p.communicate(timeout=300) for p in procs]
    assert procs[0].returncode == 0, res[0][1]
    assert procs[1].returncode == EXIT_HUNG, res[1][1]
    hung = json.loads((run / "parts" / "part1.hung.json").read_text())
    assert [h["pod"] for h in hung["hung"]] == [3] and hung["hung"][0]["rank"] == 1
    assert hung["detected_by"]["pod"] == 2 and "pod 3 (rank 1 of part 1" in res[1][1]
    assert not (run / "parts" / "part0.hung.json").exists()
    for pod in (0, 1):
        rec = json.loads((run / "pods" / f"pod{pod}.json").read_text())
        assert rec["state"] == "done"
    agg = json.loads((run / "parts" / "part0.json").read_text())
    assert agg["state"] == "done" and [b["pod"] for b in agg["pods"]] == [0, 1]
