"""cluster/mpirun.py under a real mpiexec: Ctrl-C (SIGINT) to ``podracer mpirun`` stops every rank
with a checkpoint, and every rank names SIGINT, not the SIGTERM that carried it through mpiexec."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.mpi
def test_ctrl_c_is_named_sigint_to_every_rank(tmp_path):
    from helpers import mpiexec_or_skip

    mpiexec_or_skip()
    run, out = tmp_path / "run", tmp_path / "out"
    sets = ["total_env_steps=50000000", "env.num_envs=64", "threads=1", "eval.episodes=2", "log.progress_interval_s=0"]
    cmd = [sys.executable, "-m", "podracer_hpc.cli", "mpirun", "-n", "2", sys.executable, "-m", "podracer_hpc.cli"]
    cmd += ["train", "jobs/pendulum.yaml", "--run-dir", str(run)] + [a for kv in sets for a in ("--set", kv)]
    p = subprocess.Popen(
        cmd,
        stdout=open(out, "w"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end and p.poll() is None and len(re.findall(r"\] pod \d/2 on ", out.read_text())) < 2:
            time.sleep(0.3)
        time.sleep(2)  # both ranks past their start (a signal during start-up is kept too)
        assert p.poll() is None, out.read_text()
        os.kill(p.pid, signal.SIGINT)  # what Ctrl-C sends the relay
        assert p.wait(timeout=180) == 75, out.read_text()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = out.read_text()
    assert "podracer mpirun: SIGINT: asking every rank" in text, text
    assert len(re.findall(r"stopped by signal SIGINT", text)) == 2, text
    assert "SIGTERM" not in text, text
    for k in range(2):
        assert (run / "checkpoints" / f"rank{k}.safetensors").exists(), k
