"""The RLlib baseline (baselines/rllib): a tiny run writes podracer's HDF5 schema, and analysis reads it.

RLlib lives in its own environment (.venv-rllib, see baselines/rllib/README.md). The test runs the
baseline with ray importable in this interpreter, else with .venv-rllib/bin/python; it skips,
saying why, when neither has ray.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from podracer_hpc.files.h5log import EVAL_COLUMNS, SCHEMA_VERSION, TRAIN_COLUMNS, read_log

ROOT = Path(__file__).resolve().parents[2]
VENV_PY = ROOT / ".venv-rllib" / "bin" / "python"


def _rllib_python() -> str | None:
    if importlib.util.find_spec("ray") is not None:
        return sys.executable
    if VENV_PY.exists():
        ok = subprocess.run([str(VENV_PY), "-c", "import ray.rllib"], capture_output=True, timeout=120)
        if ok.returncode == 0:
            return str(VENV_PY)
    return None


PY = _rllib_python()
needs_ray = pytest.mark.skipif(
    PY is None,
    reason="ray[rllib] is not importable in this interpreter and .venv-rllib is missing or broken; "
    "create it as baselines/rllib/README.md says to run the RLlib baseline test",
)


def test_job_files_parse():
    """The job files load without ray (only yaml)."""
    sys.path.insert(0, str(ROOT))
    from baselines.rllib.train import load_config

    for job, task in (("jobs/rllib/pendulum.yaml", "pendulum"), ("jobs/rllib/cartpole.yaml", "cartpole")):
        cfg = load_config(ROOT / job)
        assert cfg["task"] == task and cfg["env"]["name"] == task and cfg["system"] == "rllib"
        assert cfg["eval"]["episodes"] == 20
    with pytest.raises(ValueError):
        load_config(ROOT / "jobs/rllib/pendulum.yaml", ["bogus=1"])


def test_a_resource_point_sets_learners_env_runners_and_the_learning_rate():
    """resources.pods = P: P learners (a local one for P = 1), 2 env runners each stepping the pod's
    envs, RLlib's sqrt(P) learning-rate rule; keys written in the job file win."""
    sys.path.insert(0, str(ROOT))
    from baselines.rllib.train import ConfigError, load_config

    job = ROOT / "jobs/rllib/pendulum.yaml"
    cfg = load_config(job, ["resources.pods=4", "resources.gpus_per_pod=1", "resources.envs_per_pod=128"])
    r = cfg["rllib"]
    assert r["learners"] == {"num_learners": 4, "num_gpus_per_learner": 1.0}
    assert r["env_runners"]["num_env_runners"] == 8 and r["env_runners"]["num_envs_per_env_runner"] == 64
    assert r["training"]["lr"] == pytest.approx(0.0002 * 2) and r["training"]["train_batch_size_per_learner"] == 1024
    assert cfg["env"]["num_envs"] == 128 and cfg["env"]["num_envs_total"] == 512  # per learner, as a pod's
    one = load_config(job, ["resources.pods=1"])["rllib"]
    assert one["learners"]["num_learners"] == 0 and one["training"]["lr"] == 0.0002  # RLlib's local learner
    own = load_config(job, ["resources.pods=2", "rllib.learners.num_learners=1", "resources.lr_scaling=none"])
    assert own["rllib"]["learners"]["num_learners"] == 1 and own["rllib"]["training"]["lr"] == 0.0002
    fit = load_config(job, ["resources.pods=2", "resources.cpus=2"])["rllib"]  # 2 learners + 4 runners on 2 cores
    assert fit["learners"]["num_cpus_per_learner"] == fit["env_runners"]["num_cpus_per_env_runner"] == 2 / 6
    gpu = load_config(job, ["resources.pods=2", "resources.cpus=2", "resources.gpus_per_pod=1"])["rllib"]
    assert "num_cpus_per_learner" not in gpu["learners"] and gpu["env_runners"]["num_cpus_per_env_runner"] == 0.5
    roomy = load_config(job, ["resources.pods=1", "resources.cpus=8"])["rllib"]
    assert "num_cpus_per_env_runner" not in roomy["env_runners"]  # enough cores: RLlib's default of 1 each
    plain = load_config(job)  # no point: the job as written (one local learner)
    assert plain["rllib"]["learners"] == {} and plain["rllib"]["env_runners"]["num_env_runners"] == 2
    for bad in (
        ["resources.pods=0"],
        ["resources.pods=2", "resources.envs_per_pod=5"],
        ["resources.pods=2", "resources.lr_scaling=cubic"],
    ):
        with pytest.raises(ConfigError):
            load_config(job, bad)


@needs_ray
@pytest.mark.slow
@pytest.mark.parametrize("job,task", [("jobs/rllib/pendulum.yaml", "pendulum")])
def test_tiny_run_writes_schema(tmp_path, job, task):
    run_dir = tmp_path / "rllib"
    cmd = [
        PY,
        "-m",
        "baselines.rllib.train",
        job,
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--set",
        "total_env_steps=2000",
        "--set",
        "eval.interval_env_steps=1000",
        "--set",
        "eval.episodes=4",
        "--set",
        "resources.pods=2",
        "--set",
        "resources.env_runners_per_pod=1",
        "--set",
        "resources.envs_per_pod=4",
        "--set",
        "resources.cpus=2",
        "--set",
        "rllib.training.train_batch_size_per_learner=512",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["system"] == "rllib" and summary["task"] == task and summary["env_steps"] >= 2000
    assert summary["pods"] == 2 and summary["resources"]["num_learners"] == 2  # two learners (DDP), really

    log = read_log(run_dir / "logs" / "rllib_pendulum_rank0.h5")
    a = log["attrs"]
    assert a["schema_version"] == SCHEMA_VERSION and a["system"] == "rllib"
    assert a["config"]["env"]["name"] == task and a["config"]["total_env_steps"] == 2000
    assert a["rank"] == 0 and a["world_size"] == 2 and a["pods"] == 2 and a["versions"]["ray"]
    assert a["resources"] == {
        **a["resources"],
        "pods": 2,
        "gpus": 0.0,
        "cpus": 2,
        "nodes": 1,
        "num_learners": 2,
        "num_env_runners": 2,
        "envs_per_step": 8,
    }
    assert set(log["train"]) == set(TRAIN_COLUMNS) and set(log["eval"]) == set(EVAL_COLUMNS)
    tr, ev = log["train"], log["eval"]
    assert len(tr["env_steps"]) >= 2 and np.all(np.diff(tr["env_steps"]) > 0)
    assert np.all(np.diff(tr["wall_s"]) >= 0) and np.all(np.isfinite(tr["loss"]))
    assert len(ev["env_steps"]) >= 2 and ev["env_steps"][-1] == summary["env_steps"]
    assert np.all(ev["episodes"] == 4)
    assert np.all(np.isfinite(ev["return_mean"])) and np.all(ev["return_max"] <= 0)  # Pendulum rewards <= 0
    assert (run_dir / "config.yaml").exists() and (run_dir / "summary.json").exists()

    # analysis treats it as one more system
    from analysis import aggregate

    runs = aggregate.load_runs([], labels=[f"rllib={run_dir}"])
    evals = aggregate.eval_table(runs)
    assert set(evals.unique("system")) == {"rllib"} and set(evals.unique("task")) == {task}
    assert len(evals) == len(ev["env_steps"]) and set(evals["pods"].tolist()) == {2}
    row = next(aggregate.run_table(runs).rows())
    assert (row["pods"], row["gpus"], row["cpus"], row["nodes"]) == (2, 0.0, 2.0, 1)  # the shared x axis
    # device-equivalent time: the learner's module (policy and value function, more than the
    # driver's inference-only policy) and each iteration's gradient steps of one learner give the
    # all-reduce of its 2 learners
    assert a["param_count"] > 0 and np.all(tr["grad_steps"] > 0)
    row = next(aggregate.run_table(runs, -1e9).rows())  # every evaluation reaches it
    assert row["scheme"] == "data_parallel" and row["devices_per_learner"] == 2
    assert row["allreduce_s_to_target"] > 0 and math.isfinite(row["allreduce_s_to_target"])


def test_trading_gym_env_steps_the_pods_env():
    """The RLlib baseline's gymnasium view of stock_trading is the pod's env with one account: the
    same observations and rewards, the episode's last observation at its end (needs gymnasium only)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from baselines.rllib.trading_env import TradingGymEnv
    from podracer_hpc.trading.env import StockTradingEnv

    opts = {"synthetic_stocks": 3, "synthetic_days": 200, "actions": "weights", "cost": 0.002}
    gym_env = TradingGymEnv({"trading": opts, "max_episode_steps": 5, "seed": 0})
    ref = StockTradingEnv(1, seed=0, max_episode_steps=5, **opts)
    assert gym_env.observation_space.shape == (32,) and gym_env.action_space.shape == (3,)
    assert gym_env.tickers == ref.market.data.tickers
    obs, _ = gym_env.reset(seed=11)
    robs = ref.reset(seed=11)
    np.testing.assert_array_equal(obs, robs[0].numpy())
    rng = np.random.default_rng(0)
    for t in range(5):
        a = rng.uniform(-1, 1, 3).astype(np.float32)
        obs, rew, term, trunc, _ = gym_env.step(a)
        robs, rrew, rterm, rtrunc, info = ref.step(torch.as_tensor(a[None]))
        assert rew == pytest.approx(float(rrew[0])) and (term, trunc) == (bool(rterm[0]), bool(rtrunc[0]))
        want = info["final_obs"][0] if t == 4 else robs[0]
        np.testing.assert_array_equal(obs, want.numpy())
    assert trunc and not term  # 5 steps: the time limit


def test_trading_job_file_parses_and_resolves_the_data_path(tmp_path):
    sys.path.insert(0, str(ROOT))
    from baselines.rllib.train import ConfigError, load_config

    cfg = load_config(ROOT / "jobs/rllib/trading_edge.yaml", ["trading.data=''"])
    assert cfg["task"] == "stock_trading" and cfg["env"]["trading"]["max_shares"] == 10_000_000
    assert cfg["env"]["trading"]["actions"] == "shares" and cfg["env"]["max_episode_steps"] == 252
    (tmp_path / "bars.csv").write_text("date,A\n2020-01-02,1\n")
    cfg = load_config(ROOT / "jobs/rllib/trading_edge.yaml", [f"trading.data={tmp_path / 'bars.csv'}"])
    assert Path(cfg["env"]["trading"]["data"]).is_absolute()
    with pytest.raises(ConfigError, match="cost"):
        load_config(ROOT / "jobs/rllib/trading_edge.yaml", ["trading.cost=2"])


@needs_ray
@pytest.mark.slow
def test_rllib_trading_run_writes_the_schema_and_its_policy_backtests(tmp_path):
    """RLlib on podracer's trading env: the same HDF5 schema, and the exported policy goes through
    `podracer backtest` (the same code as a pod's checkpoint)."""
    run_dir = tmp_path / "rllib"
    cmd = [
        PY,
        "-m",
        "baselines.rllib.train",
        "jobs/rllib/trading_edge.yaml",
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--set",
        "trading={synthetic_stocks: 3, synthetic_days: 400, actions: weights}",
        "--set",
        "max_episode_steps=50",
        "--set",
        "total_env_steps=1024",
        "--set",
        "eval.episodes=2",
        "--set",
        "eval.interval_env_steps=512",
        "--set",
        "rllib.env_runners.num_env_runners=1",
        "--set",
        "rllib.env_runners.num_envs_per_env_runner=2",
        "--set",
        "rllib.training.train_batch_size_per_learner=512",
        "--set",
        "rllib.training.minibatch_size=256",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["task"] == "stock_trading" and summary["env_steps"] >= 1024
    log = read_log(run_dir / "logs" / "rllib_trading_edge_rank0.h5")
    assert set(log["train"]) == set(TRAIN_COLUMNS) and set(log["eval"]) == set(EVAL_COLUMNS)
    assert log["attrs"]["config"]["env"]["trading"]["actions"] == "weights"
    assert np.all(np.isfinite(log["eval"]["return_mean"]))

    policy = run_dir / "checkpoints" / "policy.pt"
    bt = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "backtest", str(policy), "--start", "2010-06-01", "--plot", ""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bt.returncode == 0, bt.stderr[-3000:]
    res = json.loads(bt.stdout.strip().splitlines()[-1])
    assert res["agent"]["cumulative_return"] is not None and res["bars"] > 100
    assert res["agent"] != res["equal_weight"]
    # the same policy in this process, through the Python API: the checkpoint's own rules (weights)
    from podracer_hpc.tools.backtest import backtest, load_policy

    pol, cfg = load_policy(policy)
    assert cfg["env"]["trading"]["actions"] == "weights" and pol.tickers == ["SYN000", "SYN001", "SYN002"]
    again = backtest(str(policy), None, "2010-06-01", None, synthetic={"stocks": 3, "days": 400})
    assert again["agent"] == res["agent"]
