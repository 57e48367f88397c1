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


# A preempted (USR2), hard-killed and requeued tournament that loses nothing: test_requeue.py.


@pytest.mark.parametrize("which", ["slurm_cluster", "slurm_cluster_noacct"])
def test_cancelled_job_ends_wait_with_a_clear_error(which, request, tmp_path):
    """--wait exits non-zero within 60 s of a scancel, naming the state and the log, with
    accounting and without it (there sacct knows nothing: scontrol still has the record)."""
    cluster = request.getfixturevalue(which)
    run = tmp_path / "run"
    proc, job = start(cluster, "--tasks-per-node", "2", "--time", "5", "--run-dir", str(run),
                      "--set", "total_env_steps=10000000", *SHORT, out=tmp_path / "submit.out")
    try:
        cluster.wait_squeue_state(job, "RUNNING", timeout=60)
        end = time.monotonic() + 90
        while not list((run / "logs").glob("*_rank1.h5")) and time.monotonic() < end:
            time.sleep(0.3)  # the ranks are training: a cancel now is a stop with checkpoints
        cluster.run("scancel", job)
        t0 = time.monotonic()
        proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "submit.out").read_text()
    assert proc.returncode == 1, out
    assert took < 60, f"--wait took {took:.0f} s to notice the cancel"
    assert f"Slurm job {job} ended CANCELLED" in out and "_log.err" in out, out
    assert '"complete": false' not in out.splitlines()[-1]  # no summary printed as if it had finished
    if which == "slurm_cluster_noacct":
        acct = cluster.run("sacct", "-n", "-X", "-j", job, check=False)
        assert job not in acct.stdout  # the no-accounting path really was taken


def test_job_that_can_never_start_is_an_error_not_a_wait(slurm_cluster_noacct, tmp_path):
    """A request beyond a partition's limit: refused before queueing when sinfo can tell; and if
    such a job is queued anyway (limits of a QOS or an association), --wait says it cannot start."""
    cluster = slurm_cluster_noacct
    cluster.run("scontrol", "create", "PartitionName=tiny", "Nodes=n4", "MaxTime=1", "State=UP")
    job = None
    try:
        r = submit(cluster, "--partition", "tiny", "--time", "5", "--wait", "--run-dir", str(tmp_path / "a"))
        assert r.returncode == 2 and "partition 'tiny' allows at most 1 minutes" in r.stderr, r.stderr
        assert cluster.run("squeue", "-h", "-p", "tiny").stdout.strip() == ""
        code = (
            "import sys, time\n"
            "from podracer_hpc import launch\n"
            "from podracer_hpc.config import load_config\n"
            f"r = launch.Request('jobs/quickstart.yaml', [], 'slurm', partition='tiny', time_min=5, "
            f"run_dir={str(tmp_path / 'b')!r})\n"
            "launched = launch.submit_slurm(r, load_config(r.job_file))\n"
            "print('JOB', launched.jobs[0].job_id, flush=True)\n"
            "t0 = time.monotonic()\n"
            "try:\n"
            "    launch.wait(launched, timeout_s=60, poll_s=0.5)\n"
            "except launch.JobError as e:\n"
            "    print(f'TOOK {time.monotonic() - t0:.1f}'); print(e); sys.exit(e.exit_code)\n"
        )
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                           env=cluster.env)
        m = re.search(r"JOB (\d+)", p.stdout)
        job = m.group(1) if m else None
        assert p.returncode == 1, p.stdout + p.stderr
        assert f"Slurm job {job} cannot start: PartitionTimeLimit" in p.stdout and f"scancel {job}" in p.stdout
        assert float(re.search(r"TOOK ([0-9.]+)", p.stdout).group(1)) < 30  # not a wait: Slurm says why at once
    finally:
        if job:
            cluster.run("scancel", job, check=False)
        cluster.run("scontrol", "delete", "PartitionName=tiny", check=False)
