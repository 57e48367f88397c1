"""podracer's batched envs as gymnasium vector envs (podracer_hpc/gym_envs.py): made by
``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")`` and stepped through
gymnasium's API, they give what a pod's own env gives for the same seed and actions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import podracer_hpc.gym_envs as gym_envs
from podracer_hpc.config import load_config
from podracer_hpc.pod import Pod

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("task, steps", [("pendulum", 450), ("cartpole", 300)])
def test_gymnasium_steps_podracer_envs_as_the_pod_steps_them(task, steps):
    """A pod (its env, seed and policy) and make_vec of the same task side by side: the pod's
    actions go to both; observations, rewards, flags and the final observations of finished
    episodes are equal through autoresets (pendulum: time limits; cartpole: terminations)."""
    cfg = load_config(None, [f"env.name={task}", "env.num_envs=8", "eval.episodes=2", "seed=3"])
    pod = Pod(cfg)
    vec = gym.make_vec(gym_envs.GYM_IDS[task], num_envs=8, vectorization_mode="vector_entry_point", seed=pod.seed)
    assert isinstance(vec.unwrapped, gym_envs.PodracerVectorEnv)
    assert vec.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    obs, info = vec.reset(seed=pod.seed)
    np.testing.assert_array_equal(obs, pod.obs.numpy())
    assert vec.observation_space.contains(obs) and info == {}
    gen = torch.Generator().manual_seed(0)
    finished = 0
    for _ in range(steps):
        action, _ = pod.agent.act(pod.agent.normalize_obs(pod.obs, update=False), gen)
        env_action = pod.to_env_action(action)
        a = env_action.numpy()
        assert vec.action_space.contains(a.astype(vec.action_space.dtype))
        pod.obs, r, term, trunc, pinfo = pod.env.step(env_action)
        obs, reward, terminated, truncated, info = vec.step(a)
        np.testing.assert_array_equal(obs, pod.obs.numpy())
        np.testing.assert_array_equal(reward, r.numpy().astype(np.float64))
        assert reward.dtype == np.float64 and obs.dtype == np.float32
        np.testing.assert_array_equal(terminated, term.numpy())
        np.testing.assert_array_equal(truncated, trunc.numpy())
        done = pinfo["done"].numpy()
        if done.any():
            finished += int(done.sum())
            np.testing.assert_array_equal(info["_final_obs"], done)
            for i in np.flatnonzero(done):
                np.testing.assert_array_equal(info["final_obs"][i], pinfo["final_obs"][i].numpy())
            assert all(info["final_obs"][i] is None for i in np.flatnonzero(~done))
        else:
            assert "final_obs" not in info
    assert finished >= 8  # every env ended an episode at least once
    vec.close()


def test_gymnasiums_episode_statistics_wrapper_counts_the_pods_episode_totals():
    vec = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.make_vec(
            "podracer/Task-v0",
            num_envs=3,
            vectorization_mode="vector_entry_point",
            task="pendulum",
            max_episode_steps=7,
            seed=1,
        )
    )
    raw = gym_envs.PodracerVectorEnv(3, task="pendulum", max_episode_steps=7, seed=1)
    vec.reset(seed=1)
    raw.env.reset(1)
    for t in range(7):
        a = np.full((3, 1), 0.5 * (t % 3) - 0.5, np.float32)
        _, _, _, _, info = vec.step(a)
        *_, pinfo = raw.env.step(torch.as_tensor(a))
    assert info["_episode"].all() and info["episode"]["l"].tolist() == [7, 7, 7]
    np.testing.assert_allclose(info["episode"]["r"], pinfo["episode_return"].numpy(), rtol=1e-6)


def test_the_spaces_are_the_tasks():
    pend = gym.make_vec("podracer/Pendulum-v0", num_envs=2, vectorization_mode="vector_entry_point")
    assert pend.single_action_space == gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    assert pend.single_observation_space.shape == (3,) and pend.observation_space.shape == (2, 3)
    cart = gym.make_vec("podracer/CartPole-v0", num_envs=5, vectorization_mode="vector_entry_point")
    assert cart.single_action_space == gym.spaces.Discrete(2) and cart.action_space.shape == (5,)
    with pytest.raises(ValueError, match="do not render"):
        gym_envs.PodracerVectorEnv(2, task="pendulum", render_mode="human")
    with pytest.raises(ValueError, match="unknown task 'doom'"):
        gym_envs.PodracerVectorEnv(2, task="doom")


def test_the_module_id_registers_the_envs_in_a_fresh_interpreter():
    """gymnasium's ``module:id`` form imports podracer_hpc.gym_envs first (no plugin hook in gymnasium 1.x)."""
    code = (
        "import gymnasium as gym, sys\n"
        "e = gym.make_vec('podracer_hpc.gym_envs:podracer/Pendulum-v0', num_envs=3, "
        "vectorization_mode='vector_entry_point')\n"
        "o, _ = e.reset(seed=0)\n"
        "print(type(e).__name__, o.shape, 'torch' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["PodracerVectorEnv", "(3,", "3)", "True"]
    r = subprocess.run(
        [sys.executable, "-c", "import sys, podracer_hpc.gym_envs; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert r.stdout.strip() == "False", r.stderr  # registering costs no torch import
