"""The MuJoCo Warp backend (``backend: warp``) on Warp's CPU device: protocol, seeding, checkpoints,
and agreement with gymnasium's v5 tasks from identical states.

Everything here runs on the CPU (Warp compiles MuJoCo Warp's kernels for its CPU device with its
bundled clang); the GPU path is the same code on a CUDA device (bench/gpu_check.sh). Skipped when
``warp-lang``/``mujoco-warp`` are not installed (``pip install 'podracer-hpc[warp]'``).

Time: Warp compiles and caches the kernels on first use (``~/.cache/warp``, or ``WARP_CACHE_PATH``).
On the 2-core dev box (shared) a first run of this file took 76 s (half_cheetah's kernels ~45 s,
then ~5-10 s for each further model); with the cache warm it takes about 25 s.

Agreement with gymnasium (float32 MuJoCo Warp vs float64 MuJoCo C), from gymnasium's own start
states, measured over 10 start states per task: one step's observation within 8e-6 relative
(|diff| / (1 + |obs|)) and reward within 1e-6, for all five tasks; tested at 1e-4 and 1e-5.
The planar tasks and humanoid stay within 2e-3 over 10 steps. Ant diverges once a leg slides
on the floor (from its second step): MuJoCo Warp orients the tangent frame of a plane contact
from the normal alone, MuJoCo C along the capsule's axis, and with the pyramidal friction cone of
the v5 models that rotates the friction pyramid (docs/mujoco.md).
"""

import importlib.util

import numpy as np
import pytest
import torch
from helpers import assert_hopper_autoreset, assert_mujoco_contract, random_actions

from podracer_hpc.envs import make_env
from podracer_hpc.envs.mujoco import resolve_backend
from podracer_hpc.envs.mujoco_tasks import GYM_IDS

HAVE_WARP = all(importlib.util.find_spec(m) is not None for m in ("warp", "mujoco_warp", "mujoco", "gymnasium"))
needs_warp = pytest.mark.skipif(
    not HAVE_WARP,
    reason="MuJoCo Warp not installed: pip install 'podracer-hpc[warp]' "
    "(warp-lang==1.19.0 mujoco-warp==4.0.0, with mujoco and gymnasium)",
)
DIMS = {"halfcheetah": (17, 6), "hopper": (11, 3), "walker2d": (17, 6), "ant": (105, 8), "humanoid": (348, 17)}
OBS_TOL, REWARD_TOL = 1e-4, 1e-5  # one step from identical states (measured: 8e-6, 1e-6)
# one xdist worker runs this file (make test): Warp compiles a kernel module on its first use in a
# process, so two workers starting these tests at once would both compile what one then caches
pytestmark = pytest.mark.xdist_group("warp")


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def test_auto_backend_and_missing_install(monkeypatch):
    """auto picks warp only on CUDA (and only when installed); a missing install says what to pip install."""
    assert resolve_backend("auto", "cpu") in ("envpool", "gymnasium")
    installed = all(importlib.util.find_spec(m) is not None for m in ("warp", "mujoco_warp"))
    assert (resolve_backend("auto", "cuda") == "warp") == installed  # (looked up, not imported: no GPU needed)
    assert resolve_backend("warp", "cpu") == "warp"
    import sys

    from podracer_hpc.envs import mujoco_warp

    monkeypatch.setitem(sys.modules, "mujoco_warp", None)  # as if not installed
    with pytest.raises(ImportError, match=r"podracer-hpc\[warp\]"):
        mujoco_warp.WarpMujoco("hopper", 2)
    with pytest.raises(ImportError, match=r"podracer-hpc\[warp\]"):
        make_env("hopper", 2, backend="warp")
    with pytest.raises(TypeError, match="for backend 'warp'"):
        make_env("hopper", 2, backend="gymnasium", graph=False)


@needs_warp
@pytest.mark.parametrize("task", list(DIMS))
def test_shapes_dtypes_device_zero_copy(task):
    N = 3
    env = make_env(task, N, "cpu", seed=0, backend="warp")
    assert env.backend == "warp" and env.gym_id == GYM_IDS[task]
    # the torch views are the simulator's memory (zero-copy)
    assert env._qpos.data_ptr() == env.d.qpos.ptr and env._ctrl.data_ptr() == env.d.ctrl.ptr
    assert_mujoco_contract(env, task, N, *DIMS[task])


def _gym_pair(task, seeds):
    import gymnasium as gym

    envs = [gym.make(GYM_IDS[task]).unwrapped for _ in seeds]
    obs = [e.reset(seed=s)[0] for e, s in zip(envs, seeds)]
    qpos = torch.tensor(np.stack([e.data.qpos for e in envs]))
    qvel = torch.tensor(np.stack([e.data.qvel for e in envs]))
    return envs, np.stack(obs), qpos, qvel


def _close(w: torch.Tensor, ref: np.ndarray, tol: float) -> float:
    """Largest |w - ref| / (1 + |ref|); asserts it is within ``tol``."""
    err = float(np.max(np.abs(w.double().numpy() - ref) / (1 + np.abs(ref))))
    assert err <= tol, err
    return err


@needs_warp
@pytest.mark.parametrize(
    "task,steps", [("halfcheetah", 5), ("hopper", 5), ("walker2d", 5), ("ant", 1), ("humanoid", 3)]
)
def test_matches_gymnasium_from_the_same_state(task, steps):
    """From gymnasium's start states and the same actions, observations, rewards and terminations agree.

    The first step within OBS_TOL / REWARD_TOL; later steps (planar tasks, humanoid) within 1e-3.
    Ant is checked for one step (no leg touches the floor yet; see the module docstring).
    """
    seeds = [3, 4]
    refs, ref_obs, qpos, qvel = _gym_pair(task, seeds)
    env = make_env(task, len(seeds), "cpu", seed=0, backend="warp")
    _close(env.reset_to(qpos, qvel), ref_obs, 1e-6)
    rng = np.random.default_rng(5)
    for k in range(steps):
        a = rng.uniform(env.action_low, env.action_high, (len(seeds), env.act_dim)).astype(np.float32)
        obs, rew, term, trunc, info = env.step(torch.from_numpy(a))
        out = [r.step(a[i]) for i, r in enumerate(refs)]
        tol = OBS_TOL if k == 0 else 1e-3
        _close(info["final_obs"], np.stack([o[0] for o in out]), tol)
        assert np.allclose(rew.double().numpy(), [o[1] for o in out], rtol=0, atol=REWARD_TOL if k == 0 else 1e-3)
        assert term.tolist() == [o[2] for o in out]
        if term.any():
            break


@needs_warp
def test_same_step_autoreset_hopper():
    """Random large actions: hopper falls (terminated) or hits the 15-step limit (truncated)."""
    env = make_env("hopper", 8, "cpu", seed=1, max_episode_steps=15, backend="warp")
    assert_hopper_autoreset(env, 8, steps=45, limit=15, rtol=1e-6)


@needs_warp
@pytest.mark.parametrize("task", ["ant", "hopper"])
def test_restart_equals_a_fresh_start(task):
    """A world restarted by the auto-reset steps exactly like a new env started in that state.

    (Its solver warm start, controls and the position its velocity is measured from are reset;
    ant measures velocity from the body position MuJoCo computes, the subtle one.)
    """
    N, limit = 2, 3
    env = make_env(task, N, "cpu", seed=7, max_episode_steps=limit, backend="warp")
    env.reset(7)
    acts = random_actions(limit + 2, N, env.act_dim, seed=8, scale=0.3)
    for a in acts[:limit]:
        obs, rew, term, trunc, info = env.step(a)
    assert trunc.all()
    fresh = make_env(task, N, "cpu", seed=0, max_episode_steps=limit, backend="warp")
    assert torch.equal(fresh.reset_to(env._qpos.clone(), env._qvel.clone()), obs)
    for a in acts[limit:]:
        o1, r1, *_ = env.step(a)
        o2, r2, *_ = fresh.step(a)
        assert torch.equal(o1, o2) and torch.equal(r1, r2)


@needs_warp
@pytest.mark.parametrize("task", ["hopper", "humanoid"])
def test_sync_free_step_is_the_same(task):
    """The CUDA step's branch-free restart (no host read of ``done``) gives the CPU step's results."""
    N, limit = 3, 4
    acts = random_actions(2 * limit + 1, N, DIMS[task][1], seed=4, scale=0.4)
    runs = []
    for sync_free in (False, True):
        env = make_env(task, N, "cpu", seed=6, max_episode_steps=limit, backend="warp")
        env._sync_free = sync_free
        runs.append([env.reset(6)] + [t for a in acts for t in env.step(a)[:4]])
    assert all(torch.equal(x, y) for x, y in zip(*runs))


@needs_warp
def test_seeding_and_determinism():
    N = 4
    acts = random_actions(20, N, 6, seed=7)

    def run(seed):
        env = make_env("walker2d", N, "cpu", seed=seed, max_episode_steps=8, backend="warp")
        out = [env.reset(seed)]
        out += [env.step(a)[0] for a in acts]
        return out, env

    a, env = run(3)
    b, _ = run(3)
    c, _ = run(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert len({tuple(r.tolist()) for r in a[0]}) == N  # envs of one batch start apart
    assert torch.equal(env.reset(3), a[0])  # reset(seed) after stepping: the same start states
    assert not torch.equal(env.reset(9), a[0])
    # start noise as gymnasium's: qpos uniform within +-0.005 of init_qpos
    q = env._qpos - env._qpos0
    assert q.abs().max() <= 0.005 + 1e-7 and q.abs().max() > 0.003


@needs_warp
def test_exact_checkpoint():
    """state_dict/load_state_dict continue bitwise (through auto-resets: clocks and RNG included)."""
    N = 3
    env = make_env("halfcheetah", N, "cpu", seed=2, max_episode_steps=4, backend="warp")
    env.reset(2)
    acts = random_actions(10, N, 6, seed=3)
    for a in acts[:3]:
        env.step(a)
    sd = env.state_dict()
    first = [env.step(a) for a in acts[3:]]
    other = make_env("halfcheetah", N, "cpu", seed=99, max_episode_steps=4, backend="warp")
    other.load_state_dict(sd)
    second = [other.step(a) for a in acts[3:]]
    for x, y in zip(first, second):
        for u, v in zip(x[:4], y[:4]):
            assert torch.equal(u, v)
        assert torch.equal(x[4]["episode_return"], y[4]["episode_return"])
    with pytest.raises(ValueError, match="num_envs"):
        make_env("halfcheetah", N + 1, "cpu", backend="warp").load_state_dict(sd)


@needs_warp
def test_pod_trains_and_resumes_exactly_on_warp():
    """A pod on env.mujoco.backend=warp trains, evaluates, and resumes exactly (env_exact)."""
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
            "env.mujoco.backend=warp",
        ],
    )
    pod = Pod(cfg, device="cpu")
    assert pod.env.backend == "warp"
    pod.train_iteration()
    tensors, meta = pod.state_tensors()
    tensors = {k: v.clone() for k, v in tensors.items()}  # (references to live tensors otherwise)
    assert meta["env_exact"]
    m1 = pod.train_iteration()
    pod2 = Pod(cfg, device="cpu")
    pod2.load_state(tensors, meta)
    m2 = pod2.train_iteration()
    assert all(torch.equal(torch.as_tensor(m1[k]), torch.as_tensor(m2[k])) for k in m1)
    r = pod.evaluate(0)
    assert r.shape == (2,) and torch.isfinite(r).all()
