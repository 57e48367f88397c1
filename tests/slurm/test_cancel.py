"""`podracer cancel RUN_DIR [--requeue]` and `podracer jobs RUN_DIR` on the local Slurm cluster:
--requeue checkpoints, requeues and resumes with nothing lost; a plain cancel ends the job (its
--wait exits 1 naming CANCELLED) with its checkpoints kept."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_for

from podracer_hpc.files.h5log import read_log

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
UPDATE = 128 * 16  # env steps per update: num_envs x quickstart's rollout_steps
ARGS = [
    "jobs/quickstart.yaml",
    "--executor",
    "slurm",
    "--mpi",
    "pmi2",
    "--tasks-per-node",
    "2",
    "--time",
    "5",
    "--set",
    "env.num_envs=128",
    "--set",
    "agent.num_minibatches=2",
    "--set",
    "log.progress_interval_s=0",
    "--set",
    "threads=1",
    "--set",
    "eval.episodes=4",
    "--set",
    "eval.final_episodes=4",
]


def cli(cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=cluster.env,
    )


def start(cluster, run: Path, out: Path, *sets: str) -> tuple[subprocess.Popen, str]:
    f = open(out, "w")
    p = subprocess.Popen(
        [sys.executable, "-m", "podracer_hpc.cli", "submit", *ARGS, "--wait", "--run-dir", str(run), *sets],
        stdout=f,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env=cluster.env,
        text=True,
    )
    end = time.monotonic() + 60
    while time.monotonic() < end and p.poll() is None:
        m = re.search(r"submitted Slurm job (\d+)", out.read_text())
        if m:
            return p, m.group(1)
        time.sleep(0.2)
    p.kill()
    raise AssertionError(f"no job id from submit:\n{out.read_text()}")


def trained_rows(run: Path) -> int:
    try:
        return min(len(read_log(run / "logs" / f"quickstart_rank{r}.h5")["train"]["update"]) for r in (0, 1))
    except Exception:  # noqa: BLE001  (not there yet, or a read racing a flush)
        return 0


def test_cancel_requeue_checkpoints_requeues_and_resumes_with_nothing_lost(slurm_cluster_noacct, tmp_path):
    cluster, run = slurm_cluster_noacct, tmp_path / "run"
    total = 60 * UPDATE
    proc, job = start(
        cluster,
        run,
        tmp_path / "submit.out",
        "--set",
        f"total_env_steps={total}",
        "--set",
        f"tournament.interval_env_steps={15 * UPDATE}",
    )
    try:
        wait_for(lambda: trained_rows(run) >= 4, 120, "both ranks training")
        r = cli(cluster, "cancel", str(run), "--requeue")
        assert r.returncode == 0 and f"job {job}: warning signal sent" in r.stdout, r.stdout + r.stderr
        assert proc.wait(timeout=300) == 0, (tmp_path / "submit.out").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "submit.out").read_text()
    assert "requeued" in out, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary.get("complete", True) and summary["env_steps"] == 2 * total
    for rank in (0, 1):
        log = read_log(run / "logs" / f"quickstart_rank{rank}.h5")
        u = list(log["train"]["update"])
        assert u == list(range(1, total // UPDATE + 1)), (rank, u)  # every update once: nothing lost or repeated
        assert log["attrs"]["slurm"].get("SLURM_RESTART_COUNT") == "1"
    table = cli(cluster, "jobs", str(run))
    assert table.returncode == 0 and re.search(rf"^{job}\s+COMPLETED\s+1\b", table.stdout, re.M), table.stdout


def test_plain_cancel_ends_the_job_named_and_keeps_its_checkpoints(slurm_cluster_noacct, tmp_path):
    cluster, run = slurm_cluster_noacct, tmp_path / "run"
    proc, job = start(cluster, run, tmp_path / "submit.out", "--set", "total_env_steps=10000000")
    try:
        wait_for(lambda: trained_rows(run) >= 2, 120, "both ranks training")
        r = cli(cluster, "cancel", str(run))
        assert r.returncode == 0 and f"job {job}: cancelled" in r.stdout, r.stdout + r.stderr
        assert proc.wait(timeout=90) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "submit.out").read_text()
    assert f"Slurm job {job} ended CANCELLED" in out, out
    assert all((run / "checkpoints" / f"rank{r}.safetensors").exists() for r in (0, 1))
    r = cli(cluster, "cancel", str(run))  # nothing left to cancel: said, exit 2
    assert r.returncode == 2 and "nothing to cancel" in r.stderr, r.stderr
    table = cli(cluster, "jobs", str(run))
    assert table.returncode == 0 and re.search(rf"^{job}\s+CANCELLED", table.stdout, re.M), table.stdout
