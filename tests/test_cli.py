"""`podracer` as a user runs it: clear errors before anything runs, a JSON last line, a log."""

import hashlib
import json
import re

import pytest

from podracer_hpc.files.h5log import read_log

FAST = [
    "--set",
    "total_env_steps=4096",
    "--set",
    "env.num_envs=64",
    "--set",
    "agent.rollout_steps=16",
    "--set",
    "eval.interval_env_steps=2048",
    "--set",
    "eval.episodes=3",
]


def log_revision(run_dir):
    return read_log(run_dir / "logs" / "pendulum_rank0.h5")["attrs"]["git_revision"]


def test_train_prints_json_last_line_and_writes_a_log(tmp_path, cli):
    r = cli("train", "jobs/pendulum.yaml", "--run-dir", str(tmp_path), *FAST, "--set", "log.progress_interval_s=0.01")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(summary) == {
        "task",
        "pods",
        "env_steps",
        "wall_s",
        "steps_per_s",
        "best_return",
        "final_return",
        "git_revision",
        "peak_return",
        "best_return_se",
        "best_return_ci95",
        "final_episodes",
        "final_eval_seed",
        "best_pod",
        "algos",
    }
    assert summary["git_revision"] == log_revision(tmp_path)
    assert summary["task"] == "pendulum" and summary["pods"] == 1 and summary["env_steps"] == 4096
    assert summary["steps_per_s"] > 0 and summary["final_return"] <= summary["peak_return"] < 0
    # the verdict: the final evaluation on the run's common set, with its interval
    lo, hi = summary["best_return_ci95"]
    assert summary["final_episodes"] == 100 and summary["best_pod"] == 0 and lo < summary["best_return"] < hi < 0
    assert hi - lo == pytest.approx(2 * 1.984217 * summary["best_return_se"], rel=1e-5)  # t(0.975, 99)
    assert "steps/s" in r.stderr and "ETA" in r.stderr  # progress lines
    # the start line says where the pod runs: device, threads, env backend, torch build, code revision
    assert re.search(
        r"pod 0/1 on \S+ \(local 0\): CPU .*\d+ threads?.* \| env backend torch \| torch .* \| code ", r.stderr
    )
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    log = read_log(tmp_path / "logs" / "pendulum_rank0.h5")
    assert list(log["train"]["env_steps"]) == [1024, 2048, 3072, 4096]
    assert list(log["eval"]["env_steps"]) == [2048, 4096]
    assert log["eval"]["return_mean"][-1] == summary["final_return"]
    assert log["attrs"]["config"]["env"]["num_envs"] == 64
    assert log["attrs"]["seed"] == 0 and log["attrs"]["world_size"] == 1
    assert "torch" in log["attrs"]["versions"]
    for col in ("loss", "entropy", "approx_kl", "steps_per_s", "learning_rate"):
        assert len(log["train"][col]) == 4


def _tree(root):
    """Every file under ``root``: its bytes' sha256 and its mtime (a rewrite with the same bytes shows too)."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_rerunning_a_finished_run_says_so_and_changes_no_file(tmp_path, cli):
    assert cli("train", "jobs/pendulum.yaml", "--run-dir", str(tmp_path), *FAST).returncode == 0
    before = _tree(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    r = cli("train", "jobs/pendulum.yaml", "--run-dir", str(tmp_path), *FAST)
    assert r.returncode == 0, r.stderr
    assert (
        "is complete" in r.stderr and "nothing to do, no file changed" in r.stderr and "--force-final-eval" in r.stderr
    )
    assert "resuming" not in r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == summary  # the summary, as the run left it
    # the last lines say where the run is and what to run next (stderr: stdout ends on the JSON)
    tail = r.stderr.strip().splitlines()[-5:]
    assert (
        tail[0] == f"the run is in {tmp_path}/: summary.json (the line above), logs/ (HDF5, one per pod), checkpoints/"
    )
    assert tail[1] == "next:" and tail[2].startswith(f"  podracer status {tmp_path}   #")
    assert tail[3].startswith(f"  podracer evaluate {tmp_path} --episodes 100 --seed {summary['final_eval_seed']}   #")
    assert tail[4].startswith(f"  python -m analysis.make_figures {tmp_path} --out {tmp_path}/figures   #")
    assert _tree(tmp_path) == before  # not one file written, not one created or removed
    # another budget is another request: it trains on (and the summary grows)
    r = cli("train", "jobs/pendulum.yaml", "--run-dir", str(tmp_path), *FAST, "--set", "total_env_steps=5120")
    assert r.returncode == 0 and "resuming" in r.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["env_steps"] == 5120


def test_force_final_eval_redoes_the_verdict_and_keeps_the_throughput(tmp_path, cli):
    assert cli("train", "jobs/pendulum.yaml", "--run-dir", str(tmp_path), *FAST).returncode == 0
    first = json.loads((tmp_path / "summary.json").read_text())
    ckpt = (tmp_path / "checkpoints" / "rank0.safetensors").read_bytes()
    record = (tmp_path / "pods" / "pod0.json").stat().st_mtime_ns
    r = cli("train", "jobs/pendulum.yaml", "--run-dir", str(tmp_path), *FAST, "--force-final-eval")
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr
    again = json.loads(r.stdout.strip().splitlines()[-1])
    assert (tmp_path / "pods" / "pod0.json").stat().st_mtime_ns != record  # evaluated and recorded again
    assert (tmp_path / "checkpoints" / "rank0.safetensors").read_bytes() == ckpt  # no training: the same agent
    # the same agent on the same common set: the same verdict; the throughput is the training's, not 0
    for k in ("best_return", "best_return_ci95", "env_steps", "final_eval_seed", "steps_per_s"):
        assert again[k] == first[k], k
    assert again["steps_per_s"] > 0


def test_unknown_key_fails_before_anything_runs(tmp_path, cli):
    r = cli("train", "jobs/pendulum.yaml", "--run-dir", str(tmp_path / "r"), "--set", "agent.learning_rat=1e-3")
    assert r.returncode == 2
    assert "unknown config key 'agent.learning_rat'" in r.stderr
    assert "Did you mean 'agent.learning_rate'" in r.stderr
    assert "agent.gae_lambda" in r.stderr  # the valid keys are listed
    assert not (tmp_path / "r").exists()  # nothing was created


def test_unknown_key_in_job_file(tmp_path, cli):
    job = tmp_path / "bad.yaml"
    job.write_text("env:\n  name: pendulum\n  num_env: 8\n")
    r = cli("train", str(job), "--run-dir", str(tmp_path / "r"))
    assert r.returncode == 2 and "unknown config key 'env.num_env'" in r.stderr and "env.num_envs" in r.stderr


def test_invalid_values_and_missing_file(tmp_path, cli):
    r = cli("train", "jobs/pendulum.yaml", "--set", "env.num_envs=0")
    assert r.returncode == 2 and "env.num_envs: must be in [1, 16,777,216]" in r.stderr
    r = cli("train", "jobs/pendulum.yaml", "--set", "env.name=doom")
    assert r.returncode == 2 and "known tasks:" in r.stderr and "cartpole" in r.stderr and "pendulum" in r.stderr
    r = cli("train", "jobs/pendulum.yaml", "--set", "agent.num_minibatches=7")
    assert r.returncode == 2 and "must divide the batch" in r.stderr
    r = cli("train", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "not found" in r.stderr
    r = cli("train", "jobs/pendulum.yaml", "--set", "seed")
    assert r.returncode == 2 and "expected KEY=VALUE" in r.stderr


def test_config_lists_every_key_with_a_doc(cli):
    r = cli("config")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    keys = [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]
    for k in ("seed", "total_env_steps", "env.name", "env.num_envs", "agent.learning_rate", "device", "members"):
        assert k in keys
    # every learner's agent section is listed under its own heading, each key with a doc
    heads = [i for i, line in enumerate(lines) if line.startswith("# agent.algo:")]
    assert [lines[i].split()[2].rstrip(":") for i in heads] == ["sac", "td3"]
    sac = [line.split()[0] for line in lines[heads[0] : heads[1]] if line.startswith("agent.")]
    assert "agent.alpha" in sac and "agent.buffer_size" in sac and "agent.clip_coef" not in sac
    assert "agent.policy_delay" in [line.split()[0] for line in lines[heads[1] :] if line.startswith("agent.")]
    assert all(len(line.split()) >= 3 for line in lines if line.startswith("agent."))
    r = cli("config", "jobs/cartpole.yaml", "--set", "seed=7")
    assert r.returncode == 0 and "seed: 7" in r.stdout and "name: cartpole" in r.stdout


def test_tournament_warmup_delays_the_first_round(tmp_path, cli):
    # one pod is a tournament too (it publishes and keeps); batches of 64 x 16 = 1024 env steps
    r = cli(
        "train",
        "jobs/pendulum.yaml",
        "--run-dir",
        str(tmp_path),
        *FAST,
        "--set",
        "total_env_steps=8192",
        "--set",
        "tournament.mode=elegantrl",
        "--set",
        "tournament.interval_env_steps=2048",
        "--set",
        "tournament.warmup_env_steps=5000",
    )
    assert r.returncode == 0, r.stderr
    t = read_log(tmp_path / "logs" / "pendulum_rank0.h5")["tournament"]
    assert list(t["round"]) == [0, 1]
    assert list(t["env_steps"]) == [5120, 7168]  # the first batch at >= 5000, then every 2048


def test_a_job_s_resolved_config_shows_its_own_task_s_section_only(cli, tmp_path):
    import yaml

    from podracer_hpc.config import load_config, to_dict

    r = cli("config", "jobs/pendulum.yaml")
    assert r.returncode == 0, r.stderr
    env = yaml.safe_load(r.stdout)["env"]
    assert env["name"] == "pendulum" and not {"trading", "mujoco", "gymnasium", "jax"} & set(env), env
    assert "trading" not in r.stdout.replace("# env.trading", "")  # not one env.trading.* line
    assert r.stdout.splitlines()[-1].startswith("# env.trading, env.mujoco, env.gymnasium, env.jax: other tasks'")
    # what it prints is still the job: loaded back, the same config
    back = tmp_path / "resolved.yaml"
    back.write_text(r.stdout)
    assert to_dict(load_config(str(back))) == to_dict(load_config("jobs/pendulum.yaml"))
    env = yaml.safe_load(cli("config", "jobs/halfcheetah.yaml").stdout)["env"]
    assert "mujoco" in env and "trading" not in env
    env = yaml.safe_load(cli("config", "jobs/trading_quickstart.yaml").stdout)["env"]
    assert "trading" in env and "mujoco" not in env
    # another task's section that the job did set is shown (nothing it asked for is hidden)
    env = yaml.safe_load(cli("config", "jobs/pendulum.yaml", "--set", "env.trading.cost=0.01").stdout)["env"]
    assert env["trading"]["cost"] == 0.01


@pytest.mark.parametrize("executor", ["slurm", "local"])
def test_the_array_dry_run_lists_each_task_s_seed_and_run_directory(cli, tmp_path, executor):
    run = tmp_path / "sweep"
    r = cli(
        "submit", "jobs/quickstart.yaml", "--executor", executor, "--tasks-per-node", "2", "--array", "3%2",
        "--run-dir", str(run), "--set", "seed=7", "--dry-run", env={"PATH": "/nonexistent"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = lines.index("#   task  seed  run directory")
    assert lines[head - 1].startswith("# array: 3 tasks, at most 2 at once, 2 pods each (pod k: seed + k); ")
    assert lines[head - 1].endswith(f"one leaderboard for all: {run / 'leaderboard'}")
    rows = [line.split() for line in lines[head + 1 : head + 4]]
    assert rows == [["#", str(i), str(7 + 1000 * i), str(run / f"task{i}")] for i in range(3)]
    assert not run.exists()  # a dry run creates nothing
