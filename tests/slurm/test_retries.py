"""Failed parts come back alone (podracer submit --wait --retries K) on the local Slurm cluster: a
part whose rank is SIGKILLed is resubmitted from its checkpoints with its node excluded; a part the
user cancelled is not; and the chaos of a real site (one rank hung by SIGSTOP, one SIGKILLed, one
node drained) ends with the pool complete. One pod per part, each part on a node of its own
(--cpus-per-task 2 of the nodes' 2): two multi-rank MPI jobs starting at once on the logical nodes of
one host can mix up MPICH's set-up (docs/local-slurm.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import slurm_rank_pids, wait_for

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
UPDATE = 64 * 16  # num_envs x quickstart's rollout_steps
ARGS = [
    "jobs/quickstart.yaml",
    "--executor",
    "slurm",
    "--mpi",
    "pmi2",
    "--tasks-per-node",
    "1",
    "--cpus-per-task",
    "2",
    "--pods-per-job",
    "1",
    "--time",
    "5",
    "--poll-slurm",
    "2",
    "--set",
    f"total_env_steps={24 * UPDATE}",
    "--set",
    f"tournament.interval_env_steps={4 * UPDATE}",
    "--set",
    f"eval.interval_env_steps={8 * UPDATE}",
    "--set",
    "tournament.sync=async",
    "--set",
    "tournament.meeting_timeout_s=6",
    "--set",
    "log.aggregate_interval_s=1",
    "--set",
    "eval.episodes=2",
    "--set",
    "eval.final_episodes=2",
    "--set",
    "env.num_envs=64",
    "--set",
    "agent.num_minibatches=1",
    "--set",
    "log.progress_interval_s=0",
    "--set",
    "threads=1",
]


def start(cluster, run: Path, nodes: int, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "podracer_hpc.cli", "submit", *ARGS, "--nodes", str(nodes), "--run-dir", str(run)]
        + ["--wait", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**cluster.env, **(env or {})},
    )


def beat(run: Path, pod: int) -> dict:
    try:
        return json.loads((run / "heartbeats" / f"pod{pod}.json").read_text())
    except (OSError, ValueError):
        return {}


def part_job(run: Path, part: int) -> str:
    try:
        return json.loads((run / "pool.json").read_text())["parts"][str(part)]["job"]
    except (OSError, ValueError, KeyError):
        return ""


def rank_pids(job: str) -> list[int]:
    base, _, task = job.partition("_")
    return (
        slurm_rank_pids(SLURM_ARRAY_JOB_ID=base, SLURM_ARRAY_TASK_ID=task)
        if task
        else slurm_rank_pids(SLURM_JOB_ID=job)
    )


def rows(run: Path) -> list[dict]:
    path = run / "retries.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def status(cluster, run: Path) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "status", str(run)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=cluster.env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_crashed_part_is_retried_from_its_checkpoints_without_its_node(slurm_cluster_noacct, tmp_path):
    cluster, run = slurm_cluster_noacct, tmp_path / "pool"
    p = start(cluster, run, 2, "--retries", "1", env={"PODRACER_INJECT_SLOW": "1:3"})
    try:
        wait_for(lambda: beat(run, 1).get("update", 0) >= 4, 180, "pod 1's fourth update")
        old, node = part_job(run, 1), beat(run, 1)["node"]
        for pid in rank_pids(old):
            os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=300)
    finally:
        p.kill()
    assert p.returncode == 0, err
    [row] = rows(run)
    assert row["part"] == 1 and row["old_job"] == old and row["excluded"] == [node] and row["attempt"] == 1, row
    assert row["new_job"] == part_job(run, 1) != old and row["reason"].startswith("failed"), row
    assert f"part 1: job {old} failed" in err and f"excluding {node}" in err, err
    assert beat(run, 1)["node"] != node and beat(run, 1)["job"] == row["new_job"]  # elsewhere, by the new job
    for pod in (0, 1):
        assert json.loads((run / "pods" / f"pod{pod}.json").read_text())["state"] == "done"
        assert (run / "checkpoints" / f"rank{pod}.safetensors").exists()
    text = status(cluster, run)
    assert f"retried 1: job {old} -> {row['new_job']} (failed" in text and f"excluded {node}" in text, text


def test_a_part_the_user_cancelled_is_not_retried(slurm_cluster, tmp_path):
    cluster, run = slurm_cluster, tmp_path / "pool"
    p = start(cluster, run, 1, "--retries", "2", env={"PODRACER_INJECT_SLOW": "0:3"})
    try:
        wait_for(lambda: beat(run, 0).get("update", 0) >= 1, 180, "pod 0's first update")
        job = part_job(run, 0)
        cluster.run("scancel", job)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 1, err
    assert f"not retried: cancelled by you (uid {os.getuid()})" in err, err
    assert rows(run) == [] and part_job(run, 0) == job


def test_chaos_a_hung_rank_a_killed_rank_and_a_drained_node(slurm_cluster_noacct, tmp_path):
    """A pool of 3 parts on 3 of the 4 nodes: pod 0 stopped (SIGSTOP: its part goes silent, the
    watcher cancels it as hung), pod 1 SIGKILLed, pod 2's node drained while it runs (it finishes
    there; nothing new lands on it). With --retries 2 the pool completes, every pod's final
    checkpoint is there, each retry avoids its bad node and the drained one, and status tells the
    truth at each poll."""
    cluster, run = slurm_cluster_noacct, tmp_path / "pool"
    p = start(cluster, run, 3, "--retries", "2", env={"PODRACER_INJECT_SLOW": "0:3,1:3,2:5"})
    drained = ""
    try:
        wait_for(lambda: all(beat(run, k).get("update", 0) >= 3 for k in range(3)), 240, "every pod's third update")
        jobs = {k: part_job(run, k) for k in range(3)}
        nodes = {k: beat(run, k)["node"] for k in range(3)}
        assert len(set(nodes.values())) == 3, nodes
        drained = nodes[2]
        cluster.run("scontrol", "update", f"nodename={drained}", "state=drain", "reason=chaos")
        for pid in rank_pids(jobs[0]):
            os.kill(pid, signal.SIGSTOP)
        for pid in rank_pids(jobs[1]):
            os.kill(pid, signal.SIGKILL)
        text = status(cluster, run)  # pod 1 killed, pod 0 stopped (not yet past its deadline)
        assert f"part 2: job {jobs[2]} RUNNING" in text, text
        wait_for(lambda: {r["part"] for r in rows(run)} == {0, 1}, 180, "both retries")
        text = status(cluster, run)
        for r in rows(run):
            assert f"part {r['part']}: job {r['new_job']}" in text and f"retried 1: job {jobs[r['part']]}" in text, text
        out, err = p.communicate(timeout=300)
    finally:
        p.kill()
        if drained:
            cluster.run("scontrol", "update", f"nodename={drained}", "state=resume", check=False)
    assert p.returncode == 0, err
    by_part = {r["part"]: r for r in rows(run)}
    assert sorted(by_part) == [0, 1] and all(r["attempt"] == 1 for r in by_part.values()), by_part
    assert by_part[0]["reason"].startswith("hung") and by_part[0]["excluded"] == [nodes[0]], by_part[0]
    assert by_part[1]["reason"].startswith("failed") and by_part[1]["excluded"] == [nodes[1]], by_part[1]
    for k in (0, 1):
        assert beat(run, k)["node"] not in (nodes[k], drained) and beat(run, k)["job"] == by_part[k]["new_job"]
    assert beat(run, 2)["node"] == drained and beat(run, 2)["job"] == jobs[2]  # finished where it ran
    for pod in range(3):
        assert json.loads((run / "pods" / f"pod{pod}.json").read_text())["state"] == "done"
        assert (run / "checkpoints" / f"rank{pod}.safetensors").exists()
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["pods"] == 3 and summary["env_steps"] == 3 * 24 * UPDATE, summary
    text = status(cluster, run)
    assert "finished" in text.splitlines()[0] and "HUNG" not in text, text
    assert text.count("retried 1:") == 2, text
