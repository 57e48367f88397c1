"""The RLlib baseline (baselines/rllib): a tiny run writes podracer's HDF5 schema, and analysis reads it.

RLlib lives in its own environment (.venv-rllib, see baselines/rllib/README.md). The test runs the
baseline with ray importable in this interpreter, else with .venv-rllib/bin/python; it skips,
saying why, when neither has ray.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from podracer_hpc.h5log import EVAL_COLUMNS, SCHEMA_VERSION, TRAIN_COLUMNS, read_log

ROOT = Path(__file__).resolve().parents[1]
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
    for bad in (["resources.pods=0"], ["resources.pods=2", "resources.envs_per_pod=5"],
                ["resources.pods=2", "resources.lr_scaling=cubic"]):
        with pytest.raises(ConfigError):
            load_config(job, bad)


@needs_ray
@pytest.mark.slow
@pytest.mark.parametrize("job,task", [("jobs/rllib/pendulum.yaml", "pendulum")])
def test_tiny_run_writes_schema(tmp_path, job, task):
    run_dir = tmp_path / "rllib"
    cmd = [PY, "-m", "baselines.rllib.train", job, "--run-dir", str(run_dir), "--quiet",
           "--set", "total_env_steps=2000", "--set", "eval.interval_env_steps=1000", "--set", "eval.episodes=4",
           "--set", "resources.pods=2", "--set", "resources.env_runners_per_pod=1", "--set", "resources.envs_per_pod=4",
           "--set", "resources.cpus=2", "--set", "rllib.training.train_batch_size_per_learner=512"]
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
    assert a["resources"] == {**a["resources"], "pods": 2, "gpus": 0.0, "cpus": 2, "nodes": 1, "num_learners": 2,
                              "num_env_runners": 2, "envs_per_step": 8}
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
