"""launch/watch.py (more of it: tests/launch/test_launch.py, tests/slurm/test_submit.py for --wait):
`podracer submit --wait` on a run that is already complete takes the summary the
run left (its ranks say so and write nothing) instead of waiting for a new one."""

import hashlib
import json

import pytest
from helpers import mpiexec_or_skip, run_cli

TINY = ["total_env_steps=2048", "env.num_envs=64", "agent.rollout_steps=16", "eval.episodes=2", "threads=1"]
TINY += ["eval.final_episodes=4", "log.progress_interval_s=0"]


def _files(root):
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "launch.log"  # the launcher's own log of each submission grows
    }


@pytest.mark.mpi
def test_submitting_a_complete_run_again_returns_its_summary_and_trains_nothing(tmp_path):
    mpiexec_or_skip()
    run = tmp_path / "run"
    args = ["submit", "jobs/pendulum.yaml", "--executor", "local", "--wait", "--timeout", "240", "--run-dir", str(run)]
    args += [a for kv in TINY for a in ("--set", kv)]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    before = _files(run)
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr + (run / "launch.log").read_text()
    assert json.loads(again.stdout.strip().splitlines()[-1]) == summary
    assert "is complete" in (run / "launch.log").read_text()
    assert _files(run) == before  # no checkpoint, log, record or summary written again


@pytest.mark.parametrize(("value", "seconds"), [(None, 30.0), ("2", 2.0), ("0.5", 30.0), ("soon", 30.0), ("inf", 30.0)])
def test_how_often_a_wait_asks_slurm_comes_from_the_environment(monkeypatch, value, seconds):
    from podracer_hpc.launch.watch import SLURM_POLL_ENV, slurm_poll_s

    if value is None:
        monkeypatch.delenv(SLURM_POLL_ENV, raising=False)
    else:
        monkeypatch.setenv(SLURM_POLL_ENV, value)
    assert slurm_poll_s() == seconds
