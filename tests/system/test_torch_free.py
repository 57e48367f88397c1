"""`podracer config` and `podracer submit --dry-run` import no torch (issue 30 item 5): a task's
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
