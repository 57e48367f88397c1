"""The ``jax`` task against the real MuJoCo Playground (``mujoco_playground``, MJX), on the CPU.

Skipped unless ``mujoco_playground`` imports: it lives in a venv of its own (docs/jax.md,
``.venv-mjx``), which CI does not have. Run it with::

    PYTHONPATH=$PWD .venv-mjx/bin/python -m pytest -q tests/envs/test_jax_task_playground.py

CartpoleBalance (the dm_control suite's model, shipped inside the wheel: nothing is downloaded),
on MJX's JAX implementation (``config_overrides: {impl: jax}``): the adapter's N=8 envs equal
Playground's own ``jax.jit(jax.vmap(env.step))`` on the same keys and actions through two time
limits and their auto-resets, a NaN state terminates (Playground's ``done`` is 1.0) and only that
env restarts, a checkpoint restores exactly, and ``podracer train`` runs PPO through it and resumes.
"""

from __future__ import annotations

import json

import pytest

playground = pytest.importorskip(
    "mujoco_playground",
    reason="MuJoCo Playground is not installed here (pip install playground, in a venv of "
    "its own: docs/jax.md); this file runs with .venv-mjx/bin/python",
)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from podracer_hpc.config import load_config  # noqa: E402
from podracer_hpc.docfield import ConfigError  # noqa: E402
from podracer_hpc.envs.jax_adapter import JaxVecEnv, env_episode_length  # noqa: E402

FACTORY = "mujoco_playground:registry.load"
KWARGS = {"env_name": "CartpoleBalance", "config_overrides": {"impl": "jax"}}
KWARGS_SET = "env.jax.kwargs={env_name: CartpoleBalance, config_overrides: {impl: jax}}"
N, SEED, LIMIT = 8, 3, 100


@pytest.fixture(scope="module")
def pg():
    """One Playground env (unbatched), as the factory makes it."""
    return playground.registry.load(**KWARGS)


@pytest.fixture(scope="module")
def venv(pg):
    """The adapter over it: N envs, a time limit of LIMIT steps (compiled once for the module)."""
    return JaxVecEnv(pg, N, seed=SEED, max_episode_steps=LIMIT)


class Reference:
    """Playground's own batched step, ``jax.jit(jax.vmap(env.step))``, with the adapter's key
    schedule written out by hand: env i's key is ``fold_in(PRNGKey(seed), i)``; each reset splits
    it into (its next key, the key ``env.reset`` gets)."""

    compiled: dict = {}  # per env: jit(vmap(reset)), jit(vmap(step)), compiled once for the module

    def __init__(self, pg, n: int, seed: int):
        if id(pg) not in self.compiled:
            self.compiled[id(pg)] = jax.jit(jax.vmap(pg.reset)), jax.jit(jax.vmap(pg.step))
        self.reset_fn, self.step_fn = self.compiled[id(pg)]
        base = jax.random.PRNGKey(seed)
        self.keys = jnp.stack([jax.random.fold_in(base, i) for i in range(n)])
        split = jax.vmap(jax.random.split)(self.keys)
        self.keys, self.state = split[:, 0], self.reset_fn(split[:, 1])

    def restart(self, which: np.ndarray):
        """The state after the envs in ``which`` reset (each from its next key), the others untouched."""
        split = jax.vmap(jax.random.split)(self.keys)
        fresh = self.reset_fn(split[:, 1])
        mask = jnp.asarray(which)
        self.keys = jnp.where(mask[:, None], split[:, 0], self.keys)
        return jax.tree.map(
            lambda new, old: jnp.where(mask.reshape(mask.shape + (1,) * (old.ndim - 1)), new, old), fresh, self.state
        )


def actions(steps: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [2 * torch.rand(N, 1, generator=g) - 1 for _ in range(steps)]


def t(x) -> torch.Tensor:
    return torch.from_numpy(np.array(x)).reshape(N, -1).float()


def test_the_factory_probes_playground_and_its_episode_length_is_the_time_limit(pg):
    """The config check makes the env through the factory string (sizes, no step); the adapter's
    time limit defaults to Playground's own ``episode_length``; a bad env name exits 2 with
    Playground's message."""
    cfg = load_config(None, ["env.name=jax", f"env.jax.factory={FACTORY}", KWARGS_SET])
    assert cfg.env.jax.kwargs == KWARGS
    assert (pg.observation_size, pg.action_size) == (5, 1)  # an array observation: obs_key is not used
    assert env_episode_length(pg) == 1000 == pg._config.episode_length
    short = playground.registry.load("CartpoleBalance", config_overrides={"impl": "jax", "episode_length": 250})
    assert env_episode_length(short) == 250
    with pytest.raises(ConfigError, match=r"env.jax.kwargs: .*Env 'CartpoleBalanse' not found"):
        load_config(None, ["env.name=jax", f"env.jax.factory={FACTORY}", "env.jax.kwargs={env_name: CartpoleBalanse}"])


def test_the_adapter_steps_as_playgrounds_own_jit_vmap_step_through_two_resets(pg, venv):
    """300 steps of 8 envs, the same keys and actions: observations, rewards and the physics state
    equal Playground's jit(vmap(step)) to 1e-5; at steps 100 and 200 every env is truncated, its
    final observation is Playground's last one and it restarts from ``env.reset`` of its next key."""
    ref = Reference(pg, N, SEED)
    obs = venv.reset(SEED)
    torch.testing.assert_close(obs, t(ref.state.obs), rtol=0, atol=1e-5)
    worst = 0.0
    for k, a in enumerate(actions(3 * LIMIT), start=1):
        obs, r, term, trunc, info = venv.step(a)
        ref.state = ref.step_fn(ref.state, jnp.asarray(a.numpy()))
        assert obs.dtype == r.dtype == torch.float32 and term.dtype == trunc.dtype == torch.bool
        assert not term.any() and trunc.tolist() == [k % LIMIT == 0] * N
        torch.testing.assert_close(info["final_obs"], t(ref.state.obs), rtol=0, atol=1e-5)
        torch.testing.assert_close(r, t(ref.state.reward).reshape(N), rtol=0, atol=1e-5)
        assert info["episode_length"].tolist() == [(k - 1) % LIMIT + 1] * N
        if k % LIMIT == 0:
            ref.state = ref.restart(np.ones(N, bool))
            assert not torch.allclose(obs, info["final_obs"])
        torch.testing.assert_close(obs, t(ref.state.obs), rtol=0, atol=1e-5)
        for mine, theirs in ((venv.state.data.qpos, ref.state.data.qpos), (venv.state.data.qvel, ref.state.data.qvel)):
            worst = max(worst, float(jnp.abs(mine - theirs).max()))
    assert worst <= 1e-5, worst
    assert torch.equal(torch.from_dlpack(venv.keys), torch.from_dlpack(ref.keys))  # the same key schedule
    assert venv.t.tolist() == [0] * N


def test_episode_returns_are_the_sums_of_playgrounds_rewards(pg, venv):
    ref = Reference(pg, N, SEED)
    venv.reset(SEED)
    total = torch.zeros(N, dtype=torch.float64)
    for a in actions(LIMIT, seed=1):
        _, r, _, trunc, info = venv.step(a)
        ref.state = ref.step_fn(ref.state, jnp.asarray(a.numpy()))
        total += t(ref.state.reward).reshape(N).double()
    assert trunc.all()
    torch.testing.assert_close(info["episode_return"], total, rtol=1e-6, atol=1e-4)
    assert 0 < float(total.min()) and float(total.max()) <= LIMIT  # CartpoleBalance's reward is in [0, 1]


def test_a_nan_state_terminates_and_only_that_env_restarts(pg, venv):
    """Playground's ``done`` is a float (1.0 once qpos or qvel is NaN): the adapter reads it as
    ``terminated``, restarts that env alone from its next key in the same step, and the others
    step on as Playground's own step does."""
    ref = Reference(pg, N, SEED)
    venv.reset(SEED)
    acts = actions(10, seed=2)
    for a in acts[:5]:
        venv.step(a)
        ref.state = ref.step_fn(ref.state, jnp.asarray(a.numpy()))
    bad = venv.state.data.qvel.at[2, 1].set(jnp.nan)
    venv.state = venv.state.replace(data=venv.state.data.replace(qvel=bad))
    keys_before = torch.from_dlpack(venv.keys).clone()
    obs, r, term, trunc, info = venv.step(acts[5])
    ref.state = ref.step_fn(ref.state, jnp.asarray(acts[5].numpy()))
    assert term.tolist() == [i == 2 for i in range(N)] and not trunc.any() and info["done"].tolist() == term.tolist()
    assert torch.isnan(info["final_obs"][2]).any() and torch.isfinite(obs).all()
    assert int(info["episode_length"][2]) == 6 and int(venv.t[2]) == 0 and int(venv.t[0]) == 6
    keys = torch.from_dlpack(venv.keys)
    assert not torch.equal(keys[2], keys_before[2]) and torch.equal(keys[[0, 1, 3]], keys_before[[0, 1, 3]])
    ref.state = ref.restart(np.arange(N) == 2)  # what the adapter should have done: env 2 anew
    torch.testing.assert_close(obs, t(ref.state.obs), rtol=0, atol=1e-5)
    for a in acts[6:]:
        obs, _, term, _, _ = venv.step(a)
        ref.state = ref.step_fn(ref.state, jnp.asarray(a.numpy()))
        assert not term.any()
        torch.testing.assert_close(obs, t(ref.state.obs), rtol=0, atol=1e-5)


def test_a_checkpoint_restores_playgrounds_state_exactly(venv):
    """The state pytree (mjx.Data, metrics, info with its rng) round-trips through ``state_dict``
    as tensors: after a restore the same actions give bit-equal outputs, through a time limit."""
    venv.reset(SEED)
    acts = actions(160, seed=4)
    for a in acts[:60]:
        venv.step(a)
    sd = {k: v.clone() for k, v in venv.state_dict().items()}
    assert len(sd) > 20 and all(isinstance(v, torch.Tensor) for v in sd.values())
    first = [venv.step(a) for a in acts[60:]]
    venv.reset(99)  # somewhere else entirely
    venv.load_state_dict(sd)
    for a, (o, r, te, tr, info) in zip(acts[60:], first):
        o2, r2, te2, tr2, info2 = venv.step(a)
        assert torch.equal(o, o2) and torch.equal(r, r2) and torch.equal(tr, tr2)
        assert torch.equal(info["final_obs"], info2["final_obs"]) and torch.equal(
            info["episode_return"], info2["episode_return"]
        )
    assert first[39][3].all()  # step 100, the time limit, was in there


def test_podracer_train_runs_ppo_on_playground_and_resumes(cli, tmp_path):
    """``podracer train`` through the factory string: 2,048 env steps, then the same run resumed to
    4,096 (its checkpoint holds the Playground state), then a rerun of the finished run changes nothing."""

    def args(total: int) -> list[str]:
        return [
            "train",
            "jobs/pendulum.yaml",
            "--run-dir",
            str(tmp_path / "run"),
            "--quiet",
            "--set",
            "env.name=jax",
            "--set",
            f"env.jax.factory={FACTORY}",
            "--set",
            KWARGS_SET,
            "--set",
            "env.num_envs=32",
            "--set",
            "env.max_episode_steps=200",
            "--set",
            "agent.rollout_steps=16",
            "--set",
            "agent.num_minibatches=4",
            "--set",
            "agent.hidden_sizes=[16, 16]",
            "--set",
            f"total_env_steps={total}",
            "--set",
            "eval.interval_env_steps=2048",
            "--set",
            "eval.episodes=4",
            "--set",
            "eval.final_episodes=4",
            "--set",
            "threads=1",
        ]

    r = cli(*args(2048), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads(r.stdout.strip().splitlines()[-1])
    assert first["env_steps"] == 2048 and first["task"] == "jax" and "env backend jax" in r.stderr
    assert "not checkpointed exactly" not in r.stderr and 0 < first["final_return"] <= 200, first
    r = cli(*args(4096), timeout=600)
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr[-3000:]
    second = json.loads(r.stdout.strip().splitlines()[-1])
    assert second["env_steps"] == 4096 and 0 < second["final_return"] <= 200, second
    ckpt = (tmp_path / "run" / "checkpoints" / "rank0.safetensors").read_bytes()
    r = cli(*args(4096), timeout=600)
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "rank0.safetensors").read_bytes() == ckpt
