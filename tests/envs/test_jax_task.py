"""The ``jax`` task (podracer_hpc/envs/jax_task.py, envs/jax_adapter.py): a functional JAX env
(MuJoCo Playground / Brax protocol) stepped by jit(vmap), handed to torch through DLPack, with
the pod's auto-reset and time limit; it equals the torch Pendulum, resets, checkpoints exactly,
trains through `podracer train`, and a bad factory is refused with exit 2. Skipped without jax."""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest

jax = pytest.importorskip("jax", reason="the jax task needs jax (pip install 'podracer-hpc[jax]'; CPU wheels)")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

from podracer_hpc.config import load_config  # noqa: E402
from podracer_hpc.docfield import ConfigError  # noqa: E402
from podracer_hpc.envs import build_env, make_env  # noqa: E402
from podracer_hpc.envs.jax_adapter import JaxVecEnv  # noqa: E402
from podracer_hpc.envs.jax_pendulum import Pendulum  # noqa: E402

FACTORY = "podracer_hpc.envs.jax_pendulum:make"


def jax_cfg(*more: str):
    return load_config(None, ["env.name=jax", f"env.jax.factory={FACTORY}", *more])


def actions(n: int, steps: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [4 * torch.rand(n, 1, generator=g) - 2 for _ in range(steps)]


def synced(jenv: JaxVecEnv, torch_state: torch.Tensor) -> None:
    """Put the torch Pendulum's physics state into the JAX env (its clocks stay its own)."""
    jenv.state = jax.vmap(Pendulum().state_at)(jnp.asarray(torch_state.numpy()))


def test_the_jax_pendulum_steps_as_the_torch_pendulum():
    """Same start states, same actions: observations and rewards equal the torch env's to 1e-5 for
    20 free-running steps (float32 rounding of sin differs by an ulp between XLA and torch, and a
    pendulum amplifies it: ~1e-4 by step 60), then step by step from the torch env's state
    through a whole episode, its time limit and the auto-reset."""
    n = 16
    tenv, jenv = make_env("pendulum", n, seed=3), make_env("jax", n, seed=3, factory=FACTORY)
    assert (jenv.obs_dim, jenv.act_dim, jenv.discrete, jenv.max_episode_steps) == (3, 1, False, 200)
    assert (jenv.action_low, jenv.action_high, jenv.backend) == (-2.0, 2.0, "jax")
    tenv.reset(3)
    jenv.reset(3)
    synced(jenv, tenv.state)
    for i, a in enumerate(actions(n, 200)):
        if i >= 20:
            synced(jenv, tenv.state)
        o1, r1, te1, tr1, i1 = tenv.step(a)
        o2, r2, te2, tr2, i2 = jenv.step(a)
        assert o2.dtype == torch.float32 and r2.dtype == torch.float32 and te2.dtype == torch.bool
        torch.testing.assert_close(i2["final_obs"], i1["final_obs"], rtol=0, atol=1e-5)
        torch.testing.assert_close(r2, r1, rtol=1e-6, atol=1e-5)
        assert te2.tolist() == te1.tolist() == [False] * n and tr2.tolist() == tr1.tolist()
        assert (
            i2["episode_length"].tolist() == i1["episode_length"].tolist() and i2["episode_length"].dtype == torch.int64
        )
        if i < 199:
            torch.testing.assert_close(o2, o1, rtol=0, atol=1e-5)
    assert tr2.all() and i2["done"].all() and i2["episode_length"].tolist() == [200] * n
    torch.testing.assert_close(i2["episode_return"], i1["episode_return"], rtol=1e-4, atol=1e-3)
    # the next episodes start from fresh start states (JAX's draws, not torch's): in range, new, distinct
    th = torch.atan2(o2[:, 1], o2[:, 0])
    assert (o2[:, 2].abs() <= 1).all() and not torch.allclose(o2, i2["final_obs"]) and len(set(th.tolist())) == n
    assert jenv.t.tolist() == [0] * n and (jenv.ep_return == 0).all()


class WalkState(NamedTuple):
    pos: jax.Array
    obs: dict
    reward: jax.Array
    done: jax.Array
    info: dict


class Walk:
    """A terminating JAX env with a dict observation (as Playground's): pos += 0.1 a; done (1.0)
    once |pos| >= 0.45; each episode starts at a random pos in [-0.2, 0.2)."""

    observation_size = {"state": (1,), "privileged_state": (2,)}
    action_size = 1

    def reset(self, rng):
        pos = jax.random.uniform(rng, (), minval=-0.2, maxval=0.2)
        return WalkState(
            pos,
            {"state": pos[None], "privileged_state": jnp.stack([pos, pos])},
            jnp.float32(0.0),
            jnp.float32(0.0),
            {"steps": jnp.int32(0)},
        )

    def step(self, state, action):
        pos = state.pos + 0.1 * action[0]
        return WalkState(
            pos,
            {"state": pos[None], "privileged_state": jnp.stack([pos, -pos])},
            jnp.float32(1.0),
            (jnp.abs(pos) >= 0.45).astype(jnp.float32),
            {"steps": state.info["steps"] + 1},
        )


class Registry:
    """Stands in for ``mujoco_playground.registry`` (``load(env_name, config=None, config_overrides=None)``)."""

    @staticmethod
    def load(env_name: str, config=None, config_overrides=None):
        if env_name != "Walk":
            raise ValueError(f"Env '{env_name}' not found. Available envs: ('Walk',)")
        return Walk()


REGISTRY = Registry()


def test_a_playground_style_factory_with_a_dotted_attribute_and_a_dict_observation():
    """``module:registry.load`` with ``kwargs: {env_name: ...}``, as docs/jax.md shows for Playground."""
    cfg = load_config(
        None,
        [
            "env.name=jax",
            "env.jax.factory=test_jax_task:REGISTRY.load",
            "env.jax.kwargs={env_name: Walk}",
            "env.jax.obs_key=privileged_state",
        ],
    )
    env = build_env(cfg.env, 3, seed=0)
    assert (env.obs_dim, env.act_dim, env.max_episode_steps) == (2, 1, 1000)
    obs, *_ = env.step(torch.ones(3, 1))
    torch.testing.assert_close(obs[:, 1], -obs[:, 0])  # the privileged entry, [pos, -pos] after a step
    with pytest.raises(ConfigError, match=r"env.jax.kwargs: .*Env 'Wlak' not found"):
        load_config(
            None, ["env.name=jax", "env.jax.factory=test_jax_task:REGISTRY.load", "env.jax.kwargs={env_name: Wlak}"]
        )
    with pytest.raises(ConfigError, match="env.jax.obs_key: .*without 'pixels'; its keys: state, privileged_state"):
        load_config(
            None,
            [
                "env.name=jax",
                "env.jax.factory=test_jax_task:REGISTRY.load",
                "env.jax.kwargs={env_name: Walk}",
                "env.jax.obs_key=pixels",
            ],
        )


def test_a_terminated_env_resets_in_the_same_step_and_only_it_draws():
    n = 4
    env = JaxVecEnv(Walk(), n, seed=1, max_episode_steps=50)
    assert (env.obs_dim, env.max_episode_steps, env.action_low, env.action_high) == (1, 50, -1.0, 1.0)
    obs0 = env.reset(1)
    push = torch.tensor([[1.0], [1.0], [0.0], [0.0]])  # envs 0, 1 walk right; 2, 3 stand still
    ended = False
    for k in range(1, 12):
        keys_before = torch.from_dlpack(env.keys).clone()
        obs, r, term, trunc, info = env.step(push)
        assert r.tolist() == [1.0] * n and not trunc.any() and not term[2:].any()
        if term.any():
            ended = True
            i = int(term.nonzero()[0])
            assert info["final_obs"][i, 0] >= 0.45 - 1e-6 and abs(float(obs[i, 0])) <= 0.2  # a fresh start
            assert info["episode_return"][i] == k and info["episode_length"][i] == k and info["done"][i]
            keys = torch.from_dlpack(env.keys)
            assert not torch.equal(keys[i], keys_before[i])  # it drew its next key
            assert torch.equal(keys[2:], keys_before[2:])  # the others did not
            assert int(env.state.info["steps"][i]) == 0 and int(env.state.info["steps"][2]) == k
            break
    assert ended
    torch.testing.assert_close(obs[2:], obs0[2:])


def test_the_time_limit_truncates_and_the_stream_does_not_depend_on_num_envs():
    small, big = JaxVecEnv(Walk(), 2, seed=5, max_episode_steps=3), JaxVecEnv(Walk(), 5, seed=5, max_episode_steps=3)
    torch.testing.assert_close(small.reset(5), big.reset(5)[:2])  # env i's start: fold_in(seed, i)
    for k in range(7):
        a = torch.zeros(5, 1)
        o1, _, _, tr1, _ = small.step(a[:2])
        o2, _, _, tr2, _ = big.step(a)
        torch.testing.assert_close(o1, o2[:2])
        assert tr2.tolist() == [k % 3 == 2] * 5


def test_tensors_cross_through_dlpack_without_a_copy():
    env = make_env("jax", 8, factory=FACTORY)
    env.reset(0)
    a = torch.zeros(8, 1)
    view = jax.dlpack.from_dlpack(a)
    assert view.unsafe_buffer_pointer() == a.data_ptr()  # actions: a JAX view of the torch tensor
    env.step(a)
    out = env._step_fn(env.state, env.keys, env.t, view)
    obs = torch.from_dlpack(out[3])
    assert obs.data_ptr() == out[3].unsafe_buffer_pointer()  # observations: a torch view of JAX's buffer
    *_, term, trunc, info = env.step(a)
    assert trunc.data_ptr() == term.data_ptr() + 8 and info["done"].data_ptr() == term.data_ptr() + 16  # one buffer


def test_a_checkpoint_restores_the_envs_exactly():
    cfg = jax_cfg()
    env = build_env(cfg.env, 6, seed=2)
    env.reset(2)
    acts = actions(6, 230, seed=1)
    for a in acts[:150]:
        env.step(a)
    sd = {k: v.clone() for k, v in env.state_dict().items()}
    first = [env.step(a) for a in acts[150:]]  # through the time limit and a reset
    other = build_env(cfg.env, 6, seed=99)
    other.load_state_dict(sd)
    for a, (o, r, te, tr, info) in zip(acts[150:], first):
        o2, r2, te2, tr2, info2 = other.step(a)
        assert torch.equal(o, o2) and torch.equal(r, r2) and torch.equal(tr, tr2)
        assert torch.equal(info["episode_return"], info2["episode_return"])
    assert first[49][3].all()  # step 200 was in there
    with pytest.raises(ValueError, match="num_envs"):
        build_env(cfg.env, 3).load_state_dict(sd)


def test_a_dict_observation_needs_an_obs_key_it_has():
    env = JaxVecEnv(Walk(), 2, obs_key="privileged_state")
    assert env.obs_dim == 2 and env.reset(0).shape == (2, 2)
    with pytest.raises(KeyError, match="privileged_state"):
        JaxVecEnv(Walk(), 2, obs_key="pixels")


@pytest.mark.parametrize(
    "factory, fragment",
    [
        ("podracer_hpc.envs.jax_pendulum", "must be 'module:callable'"),
        ("no_such_pkg.envs:make", "cannot import 'no_such_pkg.envs' (no module named 'no_such_pkg')"),
        (
            "podracer_hpc.envs.jax_pendulum:mkae",
            "jax_pendulum:mkae: module 'podracer_hpc.envs.jax_pendulum' has no attribute 'mkae'",
        ),
        ("podracer_hpc.envs.jax_pendulum:Pendulum.observation_size", "is not callable (an int)"),
        ("builtins:dict", "the env (dict) has no 'reset'"),
    ],
)
def test_a_bad_factory_is_refused_by_the_config(factory, fragment):
    with pytest.raises(ConfigError) as ei:
        load_config(None, ["env.name=jax", f"env.jax.factory={factory}"])
    assert str(ei.value).startswith("env.jax.factory") and fragment in str(ei.value), str(ei.value)


def test_bad_kwargs_and_a_missing_factory_are_refused():
    with pytest.raises(ConfigError, match=r"env.jax.kwargs: .*takes no arguments, got length"):
        jax_cfg("env.jax.kwargs={length: 2}")
    with pytest.raises(ConfigError, match="env.jax.factory: set it"):
        load_config(None, ["env.name=jax"])
    with pytest.raises(ConfigError, match="env.jax.factory: must be 'module:callable'"):  # checked for any env.name
        load_config(None, ["env.jax.factory=nonsense"])


def test_podracer_train_refuses_a_bad_factory_with_exit_2(cli, tmp_path):
    r = cli(
        "train",
        "jobs/pendulum.yaml",
        "--run-dir",
        str(tmp_path / "run"),
        "--set",
        "env.name=jax",
        "--set",
        "env.jax.factory=podracer_hpc.envs.jax_pendulum:nope",
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "env.jax.factory: podracer_hpc.envs.jax_pendulum:nope:" in r.stderr and not (tmp_path / "run").exists()
    r = cli("config", "jobs/pendulum.yaml", "--set", "env.name=jax", "--set", "env.jax.factory=jax_pendulum")
    assert r.returncode == 2 and "must be 'module:callable'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_podracer_train_runs_ppo_through_the_adapter_and_resumes_exactly(cli, tmp_path):
    """A short PPO run (4,096 env steps) end to end through the CLI; rerunning the finished run
    resumes from its checkpoint (the env state included) and changes nothing."""
    args = [
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
        "env.num_envs=64",
        "--set",
        "agent.rollout_steps=16",
        "--set",
        "agent.num_minibatches=4",
        "--set",
        "total_env_steps=4096",
        "--set",
        "eval.interval_env_steps=2048",
        "--set",
        "eval.episodes=4",
        "--set",
        "eval.final_episodes=4",
        "--set",
        "threads=1",
    ]
    r = cli(*args, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["env_steps"] == 4096 and summary["task"] == "jax" and -1700 < summary["final_return"] < 0, summary
    assert "env backend jax" in r.stderr and "not checkpointed exactly" not in r.stderr
    ckpt = (tmp_path / "run" / "checkpoints" / "rank0.safetensors").read_bytes()
    r = cli(*args, timeout=300)
    assert r.returncode == 0 and "is complete" in r.stderr, r.stderr[-3000:]  # a finished run stays finished
    assert (tmp_path / "run" / "checkpoints" / "rank0.safetensors").read_bytes() == ckpt


def test_the_config_of_a_jax_job_imports_jax_to_check_it_but_no_torch():
    """`podracer config` of a jax job makes the env once (its factory's module imports jax): no torch."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "podracer_hpc.cli",
            "config",
            "jobs/pendulum.yaml",
            "--set",
            "env.name=jax",
            "--set",
            f"env.jax.factory={FACTORY}",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    mods = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in r.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "jax" in mods and "torch" not in mods, sorted(mods & {"jax", "torch"})


def test_jax_starts_without_preallocating_and_on_one_thread_when_torch_has_one():
    """In fresh processes: a pod on one torch thread gets XLA's CPU client on one thread and JAX not
    preallocating the GPU; once jax has made its backends, the adapter leaves XLA_FLAGS alone
    (they would be read no more) and the user's own XLA_FLAGS always win."""
    import os
    import subprocess
    import sys

    code = (
        "import os, torch; torch.set_num_threads(1)\n"
        "{before}"
        "from podracer_hpc.envs import make_env\n"
        f"env = make_env('jax', 2, factory='{FACTORY}')\n"
        "print(os.environ.get('XLA_FLAGS', '-'), '|', os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])\n"
    )

    def run(before: str = "", **environ: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
        r = subprocess.run(
            [sys.executable, "-c", code.format(before=before)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, **environ},
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip()

    assert run() == "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1 | false"
    assert run("import jax; jax.numpy.zeros(1)\n") == "- | false"  # backends made: too late for flags
    assert (
        run(XLA_FLAGS="--xla_cpu_multi_thread_eigen=true", XLA_PYTHON_CLIENT_PREALLOCATE="true")
        == "--xla_cpu_multi_thread_eigen=true | true"
    )
