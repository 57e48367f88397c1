"""The ``gymnasium`` task (podracer_hpc/envs/gym_task.py, envs/gym_adapter.py): any installed
gymnasium env, Box or Discrete, steps in a pod as gymnasium steps it, trains, is refused with a
clear message when it cannot run, and a run says that it is not checkpointed exactly."""

from __future__ import annotations

import json
import os
import signal

import gymnasium as gym
import numpy as np
import pytest
import torch

from podracer_hpc.config import load_config
from podracer_hpc.docfield import ConfigError
from podracer_hpc.envs import build_env, make_env

SMALL = [
    "env.num_envs=4",
    "agent.rollout_steps=32",
    "agent.num_minibatches=2",
    "total_env_steps=256",
    "eval.interval_env_steps=128",
    "eval.episodes=2",
    "eval.final_episodes=2",
    "tournament.mode=none",
    "threads=1",
    "log.progress_interval_s=0",
]


def gym_cfg(env_id: str, *more: str):
    return load_config(None, ["env.name=gymnasium", f"env.gymnasium.id={env_id}", *more])


def reference(env_id: str, n: int, max_episode_steps: int):
    """gymnasium's own SyncVectorEnv with same-step autoreset, built by hand."""
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, max_episode_steps=max_episode_steps)] * n,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


@pytest.mark.parametrize("env_id", ["Acrobot-v1", "MountainCarContinuous-v0"])
def test_a_pod_steps_a_gymnasium_env_as_gymnasium_steps_it(env_id):
    """Same seed, same actions: observations, rewards, flags and final observations equal
    gymnasium's, through autoresets (a 25-step time limit), with the episode totals right."""
    n, steps, limit = 3, 60, 25
    env = build_env(gym_cfg(env_id, f"env.max_episode_steps={limit}").env, n, seed=7)
    ref = reference(env_id, n, limit)
    assert env.backend == "gymnasium-sync" and env.max_episode_steps == limit and env.num_envs == n
    np.testing.assert_array_equal(env.reset(7).numpy(), ref.reset(seed=7)[0])
    rng = np.random.default_rng(0)
    totals, ended = np.zeros(n), []
    for _ in range(steps):
        if env.discrete:
            a = rng.integers(0, env.num_actions, n)
            obs, r, term, trunc, info = env.step(torch.as_tensor(a))
        else:
            a = rng.uniform(-1, 1, (n, env.act_dim)).astype(np.float32)
            obs, r, term, trunc, info = env.step(torch.as_tensor(a))
        o2, r2, t2, tr2, i2 = ref.step(a)
        np.testing.assert_allclose(obs.numpy(), o2, rtol=0, atol=0)
        np.testing.assert_allclose(r.numpy(), r2.astype(np.float32))
        assert term.tolist() == t2.tolist() and trunc.tolist() == (tr2 & ~t2).tolist()
        totals += r2
        for i in np.flatnonzero(t2 | tr2):
            np.testing.assert_array_equal(info["final_obs"][i].numpy(), i2["final_obs"][i])
            assert info["episode_return"][i].item() == pytest.approx(totals[i]) and info["done"][i]
            ended.append(int(info["episode_length"][i]))
            totals[i] = 0
    assert ended and all(1 <= k <= limit for k in ended) and limit in ended  # the time limit cut some
    env.close()


def test_box_discrete_and_unusual_spaces_reach_the_pod_in_its_shapes():
    mc = build_env(gym_cfg("MountainCarContinuous-v0").env, 2)
    assert (mc.obs_dim, mc.act_dim, mc.discrete, mc.action_low, mc.action_high) == (2, 1, False, -1.0, 1.0)
    assert mc.max_episode_steps == 999  # the spec's own time limit
    acro = build_env(gym_cfg("Acrobot-v1").env, 2)
    assert (acro.obs_dim, acro.discrete, acro.num_actions, acro.max_episode_steps) == (6, True, 3, 500)
    lake = build_env(gym_cfg("FrozenLake-v1", "env.gymnasium.kwargs={is_slippery: false}").env, 2)
    obs = lake.reset(0)  # a Discrete observation is one-hot
    assert lake.obs_dim == 16 and obs.tolist() == [[1.0] + [0.0] * 15] * 2
    obs, *_ = lake.step(torch.tensor([2, 1]))  # right, down on the deterministic lake: cells 1 and 4
    assert obs.argmax(1).tolist() == [1, 4]


def test_async_and_the_envs_own_vector_entry_point_step_like_the_reference():
    """async equals sync (gymnasium's workers, same seeds); vector_entry_point runs the env's own
    batched class: podracer's pendulum through gymnasium equals the pendulum task itself."""
    sync = build_env(gym_cfg("Acrobot-v1").env, 2, seed=3)
    asyn = build_env(gym_cfg("Acrobot-v1", "env.gymnasium.vectorization=async").env, 2, seed=3)
    assert asyn.backend == "gymnasium-async"
    np.testing.assert_array_equal(sync.reset(3).numpy(), asyn.reset(3).numpy())
    for t in range(20):
        a = torch.tensor([t % 3, (t + 1) % 3])
        for x, y in zip(sync.step(a)[:4], asyn.step(a)[:4]):
            assert torch.equal(x, y)
    asyn.close()
    own = build_env(
        gym_cfg(
            "podracer_hpc.gym_envs:podracer/Pendulum-v0",
            "env.gymnasium.vectorization=vector_entry_point",
            "env.max_episode_steps=30",
        ).env,
        4,
        seed=5,
    )
    pend = make_env("pendulum", 4, seed=5, max_episode_steps=30)
    assert own.backend == "gymnasium-vector_entry_point" and own.max_episode_steps == 30
    assert torch.equal(own.reset(5), pend.reset(5))
    g = torch.Generator().manual_seed(1)
    for _ in range(70):  # two autoresets
        a = 4 * torch.rand(4, 1, generator=g) - 2
        (o1, r1, t1, tr1, i1), (o2, r2, t2, tr2, i2) = own.step(a), pend.step(a)
        assert torch.equal(o1, o2) and torch.allclose(r1, r2) and torch.equal(t1, t2) and torch.equal(tr1, tr2)
        assert torch.equal(i1["final_obs"][i1["done"]], i2["final_obs"][i2["done"]])


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ([], "env.gymnasium.id: set it to the id of an installed gymnasium env"),
        (["env.gymnasium.id=Acrobat-v1"], "env.gymnasium.id: gymnasium cannot make 'Acrobat-v1'"),
        (
            ["env.gymnasium.id=Acrobot-v1", "env.gymnasium.kwargs={lenght: 2}"],
            "env.gymnasium.kwargs: 'Acrobot-v1' does not take {'lenght': 2}",
        ),
        (["env.gymnasium.id=Acrobot-v1", "env.gymnasium.kwargs=[1]"], "env.gymnasium.kwargs: must be a mapping"),
        (
            ["env.gymnasium.id=Acrobot-v1", "env.gymnasium.vectorization=parallel"],
            "env.gymnasium.vectorization: must be one of sync, async, vector_entry_point",
        ),
        (
            ["env.gymnasium.id=CartPole-v1", "env.gymnasium.vectorization=vector_entry_point"],
            "env.gymnasium.vectorization: CartPole-v1's own vector env resets finished envs with "
            "AutoresetMode.NEXT_STEP",
        ),
        (["env.gymnasium.id=Blackjack-v1"], "its observation space is Tuple("),
        (["env.gymnasium.id=Acrobot-v1", "agent.algo=sac"], "agent.algo: sac needs continuous actions; Acrobot-v1"),
        (["env.gymnasium.id=no_such_module:Foo-v0"], "env.gymnasium.id: 'no_such_module:Foo-v0' needs a package"),
    ],
)
def test_a_gymnasium_env_a_pod_cannot_run_is_refused_by_the_config(overrides, fragment):
    with pytest.raises(ConfigError) as ei:
        load_config(None, ["env.name=gymnasium", *overrides])
    assert fragment in str(ei.value)


def test_podracer_train_refuses_a_bad_id_with_exit_2(cli, tmp_path):
    r = cli(
        "train", "jobs/gym_acrobot.yaml", "--run-dir", str(tmp_path / "run"), "--set", "env.gymnasium.id=Acrobot-v9"
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "env.gymnasium.id: gymnasium cannot make 'Acrobot-v9'" in r.stderr and not (tmp_path / "run").exists()


def test_a_pod_trains_a_gymnasium_env_and_its_resume_says_the_envs_restart(tmp_path, capsys):
    from podracer_hpc.rank.program import train

    cfg = gym_cfg("MountainCarContinuous-v0", *SMALL)
    result = train(cfg, tmp_path / "run", quiet=True, stop_after_updates=1)
    assert not result.complete
    err = capsys.readouterr().err
    assert "env backend gymnasium-sync (not checkpointed exactly: a resume restarts episodes)" in err
    result = train(cfg, tmp_path / "run", quiet=True)
    err = capsys.readouterr().err
    assert "cannot be checkpointed: the agent resumes exactly, its environments start new episodes" in err
    assert result.complete and result.summary["task"] == "gymnasium" and result.summary["env_steps"] == 256
    written = json.loads(json.dumps(result.summary))
    assert np.isfinite(written["final_return"])


def test_the_generic_gymnasium_job_learns_acrobot(tmp_path):
    """jobs/gymnasium.yaml (the template for any gymnasium env) on Acrobot-v1, at a third of its
    steps: random play scores about -500 (the time limit; measured -499 over 160 random episodes);
    the whole job reached -83 at its first evaluation (25k env steps) and -78 at 150k. The shipped
    Acrobot tournament (jobs/gym_acrobot.yaml) trains each pod with the same settings."""
    from podracer_hpc.rank.program import train

    sets = ["total_env_steps=50000", "threads=1", "eval.interval_env_steps=25000", "log.progress_interval_s=0"]
    cfg = load_config("jobs/gymnasium.yaml", sets + ["eval.final_episodes=10"])
    assert cfg.env.gymnasium.id == "Acrobot-v1" and cfg.tournament.mode == "none"
    result = train(cfg, tmp_path / "run", quiet=True)
    assert result.complete and result.summary["final_return"] > -300, result.summary
    tourney = load_config("jobs/gym_acrobot.yaml")
    assert tourney.agent == cfg.agent and tourney.env == cfg.env  # the tournament's pods: the same learner


def test_async_workers_outlive_a_warning_signal_and_end_with_their_pod(cli, tmp_path):
    """The async workers are forked from the pod: they ignore the warning signals the pod handles
    (Slurm signals every process; the pod finishes its update with its envs alive) and end when
    the pod closes them. Before, gymnasium's clean-up terminated them with SIGTERM, which they
    ignored (the pod's inherited handler): the finished run never exited."""
    env = build_env(gym_cfg("Acrobot-v1", "env.gymnasium.vectorization=async").env, 2, seed=0)
    env.reset(0)
    for p in env.env.processes:
        os.kill(p.pid, signal.SIGTERM)
    obs, *_ = env.step(torch.tensor([0, 1]))  # they still step
    assert obs.shape == (2, 6) and all(p.is_alive() for p in env.env.processes)
    env.close()
    assert not any(p.is_alive() for p in env.env.processes)
    r = cli(
        "train",
        "jobs/gym_acrobot.yaml",
        "--run-dir",
        str(tmp_path / "run"),
        "--quiet",
        "--set",
        "env.gymnasium.vectorization=async",
        "--set",
        "env.num_envs=2",
        "--set",
        "total_env_steps=256",
        "--set",
        "agent.rollout_steps=32",
        "--set",
        "eval.episodes=2",
        "--set",
        "eval.final_episodes=2",
        "--set",
        "tournament.mode=none",
        timeout=240,
    )  # it hung here, the run done, before
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["env_steps"] == 256
