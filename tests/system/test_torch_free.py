"""`podracer config` and `podracer submit --dry-run` import no torch: a task's
options are declared in modules that need none (envs/classic_tasks.py, envs/mujoco_tasks.py,
trading/task.py, envs/gym_task.py, envs/jax_task.py), its env class is named and imported only when a pod builds it
(registry.Lazy). Checked with `python -X importtime` in a fresh process, as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def imported(*args: str) -> set[str]:
    """The top-level packages a fresh `podracer ARGS` process imported (its -X importtime lines)."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "podracer_hpc.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
        env={**os.environ, "PATH": "/nonexistent"},
    )  # no Slurm
    assert r.returncode == 0, r.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in r.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.parametrize(
    "args",
    [
        ("config",),
        ("config", "jobs/halfcheetah.yaml"),
        ("config", "jobs/trading_quickstart.yaml"),
        ("submit", "jobs/quickstart.yaml", "--executor", "local", "--tasks-per-node", "4", "--dry-run"),
        ("submit", "jobs/halfcheetah.yaml", "--executor", "slurm", "--mpi", "pmi2", "--dry-run"),
    ],
)
def test_config_and_dry_run_import_no_torch(args):
    mods = imported(*args)
    assert "podracer_hpc" in mods  # the check itself works
    assert not {"torch", "mpi4py", "mujoco", "jax"} & mods, sorted({"torch", "mpi4py", "mujoco", "jax"} & mods)


def test_a_pod_still_builds_every_declared_task_s_env():
    """The declarations name real classes: each resolves to what the old registry held."""
    from podracer_hpc.envs import TASKS, registry
    from podracer_hpc.envs.cartpole import CartPole
    from podracer_hpc.trading.env import StockTradingEnv

    assert TASKS["cartpole"] is CartPole and TASKS["stock_trading"] is StockTradingEnv
    for name in registry.names():
        assert callable(TASKS[name]), name
    assert registry.names()[:3] == ["pendulum", "cartpole", "stock_trading"]  # the sections' order as before


def test_status_of_a_tournament_and_backtest_help_import_no_torch(tmp_path):
    """`podracer status` reads logs, records and the leaderboard's JSON sidecars; `backtest --help`
    only its arguments: neither loads torch (seconds of start-up on a login node)."""
    run = tmp_path / "run"
    fast = ["total_env_steps=2048", "env.num_envs=64", "agent.rollout_steps=16", "eval.episodes=2"]
    fast += ["eval.final_episodes=2", "tournament.interval_env_steps=1024", "tournament.warmup_env_steps=0"]
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "train", "jobs/quickstart.yaml", "--run-dir", str(run), "--quiet"]
        + [a for kv in fast for a in ("--set", kv)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert any((run / "leaderboard" / "entries").glob("*.safetensors"))  # status has a leaderboard to show
    mods = imported("status", str(run))
    assert "podracer_hpc" in mods and "h5py" in mods  # it did read the logs
    assert "torch" not in mods and "safetensors" not in mods
    mods = imported("backtest", "--help")
    assert "podracer_hpc" in mods and "torch" not in mods
