"""`podracer submit --executor slurm` on a real local Slurm cluster (4 logical nodes)."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podracer_hpc.h5log import read_log
from podracer_hpc.leaderboard import Leaderboard

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
SHORT = ["--set", "env.num_envs=128", "--set", "agent.num_minibatches=2", "--set", "log.progress_interval_s=0",
         "--set", "threads=1"]


def submit(cluster, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "podracer_hpc.cli", "submit", "jobs/quickstart.yaml",
                           "--executor", "slurm", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=cluster.env)


def start(cluster, *args: str, out: Path) -> tuple[subprocess.Popen, str]:
    """Submit with --wait in the background; returns the process and the job id."""
    f = open(out, "w")
    p = subprocess.Popen([sys.executable, "-m", "podracer_hpc.cli", "submit", "jobs/quickstart.yaml",
                          "--executor", "slurm", "--wait", *args], stdout=f, stderr=subprocess.STDOUT,
                         cwd=REPO, env=cluster.env, text=True)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        m = re.search(r"submitted Slurm job (\d+)", out.read_text())
        if m:
            return p, m.group(1)
        if p.poll() is not None:
            break
        time.sleep(0.2)
    p.kill()
    raise AssertionError(f"no job id from submit:\n{out.read_text()}")


def rounds_logged(run: Path, rank: int = 0) -> int:
    try:
        return int(len([r for r in read_log(run / "logs" / f"quickstart_rank{rank}.h5")["tournament"]["round"] if r >= 0]))
    except Exception:
        return 0


def test_refused_before_queueing(slurm_cluster, tmp_path):
    r = submit(slurm_cluster, "--partition", "gpu-nope", "--run-dir", str(tmp_path / "a"))
    assert r.returncode == 2 and "does not exist; partitions here: debug" in r.stderr
    r = submit(slurm_cluster, "--nodes", "9", "--run-dir", str(tmp_path / "a"))
    assert r.returncode == 2 and "has only 4 nodes" in r.stderr
    r = submit(slurm_cluster, "--tasks-per-node", "2", "--gpus-per-node", "1", "--run-dir", str(tmp_path / "a"))
    assert r.returncode == 2 and "one rank on one GPU" in r.stderr
    queued = slurm_cluster.run("squeue", "-h", "-n", "podracer-quickstart").stdout.strip()
    assert queued == "" and not (tmp_path / "a").exists()


def test_two_node_tournament(slurm_cluster, tmp_path):
    run = tmp_path / "run"
    r = submit(slurm_cluster, "--nodes", "2", "--tasks-per-node", "2", "--time", "5", "--wait",
               "--run-dir", str(run), "--set", "total_env_steps=65536", "--set", "tournament.interval_env_steps=16384",
               *SHORT)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["pods"] == 4 and summary["rounds"] == 4
    nodes = {read_log(run / "logs" / f"quickstart_rank{k}.h5")["attrs"]["slurm"]["SLURM_NODEID"] for k in range(4)}
    assert nodes == {"0", "1"}  # one MPI world over two logical nodes
    assert "rounds 4" in r.stderr  # live progress read from the logs


def test_array_tasks_join_the_shared_leaderboard(slurm_cluster, tmp_path):
    run = tmp_path / "sweep"
    # One pod per task: two MPI jobs starting at once on the logical nodes of ONE host can mix up
    # MPICH's shared-memory set-up (docs/local-slurm.md); on a real cluster they are separate hosts.
    r = submit(slurm_cluster, "--tasks-per-node", "1", "--array", "3%2", "--time", "5", "--wait",
               "--run-dir", str(run), "--set", "total_env_steps=32768", "--set", "tournament.interval_env_steps=16384",
               *SHORT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len([line for line in r.stdout.splitlines() if line.startswith("{")]) == 3
    joins = {}
    for t in range(3):
        log = read_log(run / f"task{t}" / "logs" / "quickstart_rank0.h5")
        joins[t] = [s for a, s in zip(log["tournament"]["action"], log["tournament"]["source"]) if a == "join"]
    assert joins[2], f"task 2 starts after a first task ended and must join from the leaderboard: {joins}"
    assert not (joins[0] and joins[1]), "with %2 the first two tasks start together on an empty leaderboard"
    assert Leaderboard(run / "leaderboard").list()


def test_preempted_tournament_requeues_and_loses_nothing(slurm_cluster, tmp_path):
    budget = ["--set", "total_env_steps=245760", "--set", "tournament.interval_env_steps=40960",
              "--set", "eval.interval_env_steps=40960", "--set", "log.checkpoint_interval_s=1000", *SHORT]
    run = tmp_path / "run"
    proc, job = start(slurm_cluster, "--nodes", "2", "--tasks-per-node", "2", "--time", "5",
                      "--run-dir", str(run), *budget, out=tmp_path / "submit.out")
    try:
        end = time.monotonic() + 150
        while rounds_logged(run) < 2 and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.5)
        assert rounds_logged(run) >= 2, (tmp_path / "submit.out").read_text()
        slurm_cluster.run("scancel", "--signal=USR2", job)  # Slurm's warning, as before a preemption
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "submit.out").read_text()
    assert proc.returncode == 0, out
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert summary["rounds"] == 6
    per_pod = -(-245760 // (128 * 16)) * 128 * 16
    assert summary["env_steps"] == 4 * per_pod  # the same as an uninterrupted run
    for k in range(4):
        log = read_log(run / "logs" / f"quickstart_rank{k}.h5")
        assert list(log["tournament"]["round"]) == [0, 1, 2, 3, 4, 5], f"rank {k}"  # each round once
        steps = log["train"]["env_steps"]
        assert len(steps) == len(set(steps)) and steps[-1] == per_pod  # no update logged twice
        assert log["attrs"]["slurm"].get("SLURM_RESTART_COUNT") == "1"  # it really was requeued
    board = Leaderboard(run / "leaderboard")
    for e in board.list():
        board.load(e.id)
    err = "".join(p.read_text() for p in (run / "slurm").rglob("*_0_log.err"))
    assert "resuming from" in err


def test_cancelled_job_ends_wait_with_a_clear_error(slurm_cluster, tmp_path):
    run = tmp_path / "run"
    proc, job = start(slurm_cluster, "--tasks-per-node", "2", "--time", "5", "--run-dir", str(run),
                      "--set", "total_env_steps=10000000", *SHORT, out=tmp_path / "submit.out")
    try:
        slurm_cluster.wait_squeue_state(job, "RUNNING", timeout=60)
        slurm_cluster.run("scancel", job)
        t0 = time.monotonic()
        proc.wait(timeout=60)
        assert time.monotonic() - t0 < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "submit.out").read_text()
    assert proc.returncode == 2
    assert f"Slurm job {job} ended CANCELLED" in out and "_log.err" in out
