"""The launcher without a cluster: requests refused before queueing, the generated sbatch text."""

import os
import sys
from pathlib import Path

import pytest

from podracer_hpc import launch
from podracer_hpc.config import load_config

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"


@pytest.mark.parametrize("spec,ids,par", [
    ("3", [0, 1, 2], 0), ("0-4%2", [0, 1, 2, 3, 4], 2), ("1,3,5", [1, 3, 5], 0), ("2-3,7%1", [2, 3, 7], 1),
])
def test_parse_array(spec, ids, par):
    assert launch.parse_array(spec) == (ids, par)


@pytest.mark.parametrize("spec", ["", "a", "3-1", "1,,x", "%2"])
def test_parse_array_rejects(spec):
    with pytest.raises(launch.LaunchError, match="--array"):
        launch.parse_array(spec)


def req(**kw):
    base = dict(job_file="jobs/quickstart.yaml", overrides=[], executor="local")
    return launch.Request(**{**base, **kw})


@pytest.mark.parametrize("kw,msg", [
    ({"nodes": 0}, "--nodes must be >= 1"),
    ({"tasks_per_node": 0}, "--tasks-per-node must be >= 1"),
    ({"tasks_per_node": 4, "gpus_per_node": 2}, "a pod is one rank on one GPU"),
    ({"time_min": 0}, "--time must be >= 1"),
    ({"nodes": 2}, "runs on this machine"),
    ({"job_file": "jobs/nope.yaml"}, "not found"),
    ({"mpi": "ucx"}, "--mpi must be"),
])
def test_impossible_requests_fail_before_anything_runs(kw, msg):
    with pytest.raises(launch.LaunchError, match=msg):
        launch.validate(req(**kw))


def test_bad_config_fails_before_anything_runs():
    with pytest.raises(launch.ConfigError, match="unknown config key 'agent.lr'"):
        launch.validate(req(overrides=["agent.lr=1"]))


def test_slurm_without_sbatch_says_so(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(launch.LaunchError, match="no sbatch here"):
        launch.validate(req(executor="slurm"))


def test_array_tasks_get_own_dirs_seeds_and_a_shared_leaderboard(tmp_path):
    r = req(array=[0, 2], run_dir=str(tmp_path / "sweep"))
    cfg = load_config(r.job_file)
    sets, d = launch.task_overrides(r, cfg, 2)
    assert d == tmp_path / "sweep" / "task2"
    assert "seed=2000" in sets and f"tournament.leaderboard_dir={tmp_path / 'sweep' / 'leaderboard'}" in sets
    r.shared_leaderboard = False
    sets, _ = launch.task_overrides(r, cfg, 2)
    assert not any(s.startswith("tournament.leaderboard_dir") for s in sets)


@pytest.mark.parametrize("name,kw", [
    ("submit_2x2", dict(nodes=2, tasks_per_node=2, time_min=10)),
    ("submit_dgx_array", dict(nodes=4, tasks_per_node=8, gpus_per_node=8, partition="batch", account="rl",
                              time_min=240, mpi="pmix", array=[0, 1, 2], array_parallelism=2)),
])
def test_generated_sbatch_matches_golden(name, kw):
    """submitit's sbatch text for a request, with the machine-specific paths replaced."""
    r = req(executor="slurm", run_dir="/scratch/runs/qs", **kw)
    cfg = load_config(r.job_file)
    text = launch.sbatch_text(r, cfg).replace(sys.executable, "PYTHON")
    golden = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), f"regenerate with UPDATE_GOLDEN=1 if the change is intended:\n{text}"


def test_local_submit_runs_and_waits(tmp_path, capsys):
    r = req(tasks_per_node=2, run_dir=str(tmp_path / "run"),
            overrides=["total_env_steps=40960", "tournament.interval_env_steps=20480", "log.progress_interval_s=0"])
    cfg = launch.validate(r)
    launched = launch.submit_local(r, cfg)
    summaries = launch.wait(launched, timeout_s=240, poll_s=0.5)
    assert summaries[0]["pods"] == 2 and summaries[0]["rounds"] == 2
    assert "2 pods" in capsys.readouterr().err


def test_local_failure_names_the_log(tmp_path):
    r = req(tasks_per_node=1, run_dir=str(tmp_path / "run"), overrides=["total_env_steps=4096"])
    cfg = launch.validate(r)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "rank0.safetensors").write_bytes(b"garbage")  # a corrupt resume
    launched = launch.submit_local(r, cfg)
    with pytest.raises(launch.LaunchError, match=r"failed \(exit 2\); see .*launch.log"):
        launch.wait(launched, timeout_s=120, poll_s=0.5)
