"""The MuJoCo v5 tasks on the host backends (envpool, gymnasium) keep the VecEnv protocol."""

import importlib.util

import numpy as np
import pytest
import torch
from helpers import assert_hopper_autoreset, assert_mujoco_contract, random_actions

from podracer_hpc.envs import TASKS, make_env
from podracer_hpc.envs.mujoco import resolve_backend
from podracer_hpc.envs.mujoco_tasks import GYM_IDS

HAVE_MUJOCO = importlib.util.find_spec("mujoco") is not None
HAVE_ENVPOOL = importlib.util.find_spec("envpool") is not None

pytestmark = pytest.mark.skipif(not HAVE_MUJOCO, reason="mujoco not installed: pip install 'gymnasium[mujoco]'")
needs_envpool = pytest.mark.skipif(
    not HAVE_ENVPOOL,
    reason="envpool not installed (pip install envpool; it has wheels for CPython 3.11 "
    "x86_64 Linux, not for every platform)",
)
BACKENDS = [pytest.param("envpool", marks=needs_envpool), "gymnasium"]
DIMS = {"halfcheetah": (17, 6), "hopper": (11, 3), "walker2d": (17, 6), "ant": (105, 8), "humanoid": (348, 17)}


def rollout(env, actions):
    out = []
    for a in actions:
        out.append(env.step(a))
    return out


def test_registry_and_backend_choice():
    for name in GYM_IDS:
        assert name in TASKS
    assert resolve_backend("auto") == ("envpool" if HAVE_ENVPOOL else "gymnasium")
    with pytest.raises(ValueError, match="unknown MuJoCo backend"):
        make_env("hopper", 2, backend="bullet")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("task", list(DIMS))
def test_shapes_dtypes_device(task, backend):
    N = 3
    env = make_env(task, N, "cpu", seed=0, backend=backend)
    assert env.backend == backend
    assert_mujoco_contract(env, task, N, *DIMS[task])


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_semantics_hopper(backend):
    """Random large actions: hopper falls (terminated) or hits the 40-step limit (truncated)."""
    env = make_env("hopper", 16, "cpu", seed=1, max_episode_steps=40, backend=backend)
    assert_hopper_autoreset(env, 16, steps=120, limit=40, rtol=1e-5)


@needs_envpool
def test_envpool_same_step_matches_raw_next_step_envpool():
    """final_obs is envpool's own terminal observation and obs its (next-step) reset observation."""
    import envpool

    N, limit = 4, 10
    env = make_env("hopper", N, "cpu", seed=5, max_episode_steps=limit, backend="envpool")
    raw = envpool.make("Hopper-v5", env_type="gymnasium", num_envs=N, seed=5, max_episode_steps=limit)
    acts = random_actions(2 * limit, N, 3, seed=3, scale=0.05)  # small: nobody falls in 10 steps
    o0 = env.reset(5)
    r0, _ = raw.reset()
    assert np.allclose(o0.numpy(), r0, atol=1e-6)
    for t, a in enumerate(acts[:limit]):
        obs, rew, term, trunc, info = env.step(a)
        r_obs, r_rew, r_term, r_trunc, _ = raw.step(a.double().numpy())
        assert np.allclose(info["final_obs"].numpy(), r_obs, atol=1e-5)
        assert np.allclose(rew.numpy(), r_rew, atol=1e-5)
    assert trunc.all() and not term.any()
    r_obs, r_rew, *_ = raw.step(np.zeros((N, 3)))  # raw envpool's filler step: the reset observation
    assert np.allclose(obs.numpy(), r_obs, atol=1e-5) and (r_rew == 0).all()
    for a in acts[limit:]:  # then both step the new episode in lockstep (to its time limit again)
        obs, rew, term, trunc, info = env.step(a)
        r_obs, r_rew, *_ = raw.step(a.double().numpy())
        assert np.allclose(info["final_obs"].numpy(), r_obs, atol=1e-5) and np.allclose(rew.numpy(), r_rew, atol=1e-5)
    assert trunc.all()


def test_gymnasium_matches_single_envs():
    """The gymnasium backend equals N plain gym.make envs seeded seed + i, through a reset."""
    import gymnasium as gym

    N, limit, seed = 3, 8, 11
    env = make_env("hopper", N, "cpu", seed=seed, max_episode_steps=limit, backend="gymnasium")
    refs = [gym.make("Hopper-v5", max_episode_steps=limit) for _ in range(N)]
    obs = env.reset(seed)
    ref_obs = np.stack([r.reset(seed=seed + i)[0] for i, r in enumerate(refs)])
    assert np.allclose(obs.numpy(), ref_obs, atol=1e-6)
    for a in random_actions(2 * limit + 3, N, 3, seed=4, scale=0.05):
        obs, rew, term, trunc, info = env.step(a)
        for i, r in enumerate(refs):
            o, rw, te, tr, _ = r.step(a[i].numpy())
            assert np.allclose(info["final_obs"][i].numpy(), o, atol=1e-5)
            assert abs(rew[i].item() - rw) < 1e-4 and bool(term[i]) == te and bool(trunc[i]) == (tr and not te)
            if te or tr:
                o, _ = r.reset()
            assert np.allclose(obs[i].numpy(), o, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeding_and_determinism(backend):
    N = 4
    acts = random_actions(30, N, 6, seed=7)

    def run(seed):
        env = make_env("walker2d", N, "cpu", seed=seed, max_episode_steps=12, backend=backend)
        o = env.reset(seed)
        return [o] + [s[0] for s in rollout(env, acts)], env

    a, env = run(3)
    b, _ = run(3)
    c, _ = run(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert len({tuple(r.tolist()) for r in a[0]}) == N  # envs of one pool start apart
    # reset(seed) again after stepping: the same start states (fixed-start evaluations)
    assert torch.equal(env.reset(3), a[0])
    assert not torch.equal(env.reset(9), a[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_exact_checkpoint(backend):
    env = make_env("hopper", 2, backend=backend)
    with pytest.raises(NotImplementedError, match="cannot be checkpointed exactly"):
        env.state_dict()
    with pytest.raises(NotImplementedError, match="cannot be checkpointed exactly"):
        env.load_state_dict({})


def test_pod_trains_an_iteration_on_hopper():
    """A pod runs a rollout, an update and an evaluation on the auto backend."""
    from podracer_hpc.config import load_config
    from podracer_hpc.pod import Pod

    cfg = load_config(
        None,
        [
            "env.name=hopper",
            "env.num_envs=8",
            "agent.rollout_steps=16",
            "agent.num_minibatches=2",
            "eval.episodes=2",
            "env.max_episode_steps=30",
        ],
    )
    pod = Pod(cfg, device="cpu")
    m = pod.train_iteration()
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in m.values())
    r = pod.evaluate(0)
    assert r.shape == (2,) and torch.isfinite(r).all()
    assert torch.equal(pod.evaluate(0), r)  # fixed start states, deterministic policy


@needs_envpool
def test_envpool_steps_between_send_and_wait_as_in_one_step():
    """step_async + step_wait (EnvPool's threads step while the caller works) give what step gives,
    auto-resets included (12-step episodes)."""
    acts = random_actions(30, 4, 3, seed=5)
    envs = [make_env("hopper", 4, "cpu", seed=2, max_episode_steps=12, backend="envpool") for _ in range(2)]
    for e in envs:
        e.reset(2)
    ended = 0
    for a in acts:
        one = envs[0].step(a)
        envs[1].step_async(a)
        a.fill_(9.0)  # the action was taken when sent
        two = envs[1].step_wait()
        for x, y in zip(one[:4], two[:4]):
            assert torch.equal(x, y)
        assert all(torch.equal(one[4][k], two[4][k]) for k in one[4])
        ended += int(two[4]["done"].sum())
    assert ended >= 4  # episodes ended and restarted on the way


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pod_learns_the_same_whether_the_env_steps_while_it_records(backend, monkeypatch):
    """The rollout sends the next action before it records the last step (split_step): a pod on an
    env without step_async/step_wait (the same physics, stepped in place) ends with the same weights."""
    from podracer_hpc.config import load_config
    from podracer_hpc.pod import Pod

    over = [
        "env.name=hopper",
        "env.num_envs=4",
        "agent.rollout_steps=16",
        "agent.num_minibatches=2",
        "env.max_episode_steps=20",
        f"env.mujoco.backend={backend}",
        "threads=1",
    ]
    import types

    from podracer_hpc import pod as pod_module
    from podracer_hpc.envs.base import split_step

    pods = [Pod(load_config(None, over), device="cpu") for _ in range(2)]
    for _ in range(3):
        pods[0].train_iteration()
    # the other pod's env offers only step: each action is stepped when the rollout asks for the result
    monkeypatch.setattr(pod_module, "split_step", lambda env: split_step(types.SimpleNamespace(step=env.step)))
    for _ in range(3):
        pods[1].train_iteration()
    a, b = (p.agent.net.state_dict() for p in pods)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(pods[0].obs, pods[1].obs)
