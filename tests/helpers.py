"""Small helpers shared by test modules (import as ``from helpers import ...``)."""

import pytest

from podracer_hpc.launch import LaunchError, find_mpiexec


def mpiexec_or_skip() -> str:
    """The mpiexec the launcher would use; skip (saying why) where there is none."""
    try:
        return find_mpiexec()
    except LaunchError as e:
        pytest.skip(str(e))


def assert_mujoco_contract(env, task: str, n: int, obs_dim: int, act_dim: int) -> None:
    """A MuJoCo adapter's shapes, dtypes and device on CPU, after a reset and one zero-action step."""
    import pytest
    import torch

    assert (env.obs_dim, env.act_dim, env.discrete, env.max_episode_steps) == (obs_dim, act_dim, False, 1000)
    assert env.action_low == pytest.approx(-0.4 if task == "humanoid" else -1.0) == -env.action_high
    obs = env.reset(0)
    assert obs.shape == (n, obs_dim) and obs.dtype == torch.float32 and obs.device == torch.device("cpu")
    obs, rew, term, trunc, info = env.step(torch.zeros(n, act_dim))
    assert obs.shape == (n, obs_dim) and obs.dtype == torch.float32
    assert rew.shape == (n,) and rew.dtype == torch.float32
    assert term.dtype == trunc.dtype == info["done"].dtype == torch.bool and term.shape == (n,)
    assert info["final_obs"].shape == (n, obs_dim)
    assert info["episode_return"].dtype == torch.float64 and info["episode_length"].dtype == torch.int64
    assert torch.isfinite(obs).all() and torch.isfinite(rew).all()
