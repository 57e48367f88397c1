"""Functional JAX environments (MuJoCo Playground, Brax, your own) behind the VecEnv protocol.

The ``jax`` task (:mod:`.jax_task`). The protocol assumed of one env (unbatched; MuJoCo
Playground's ``mjx_env.MjxEnv`` and Brax's ``envs.Env`` have it):

- ``env.reset(rng) -> state`` with ``rng`` one PRNG key (``jax.random.PRNGKey``, uint32 ``[2]``);
- ``env.step(state, action) -> state`` with ``action`` float32 ``[action_size]``;
- ``state`` a pytree (flax ``struct.dataclass``, NamedTuple, ...) with ``state.obs`` (an array,
  or a mapping of arrays: ``obs_key`` picks one), ``state.reward`` (a scalar) and ``state.done``
  (a scalar, bool or 0/1: the episode reached a terminal state); everything else (``data``,
  ``metrics``, ``info``) is carried along untouched. ``reset`` and ``step`` must return states of
  the same structure (as Playground's and Brax's own auto-reset wrappers need too);
- ``env.observation_size`` (an int, a shape, or a mapping of them) and ``env.action_size``;
- optional: ``action_low`` / ``action_high`` (the action bounds the pod maps its [-1, 1] onto;
  default -1 and 1, which Playground and Brax envs take) and ``max_episode_steps`` (the time
  limit when ``env.max_episode_steps`` is 0); without it, a Playground env's config
  ``episode_length``, else 1000.

The adapter adds what Playground's and Brax's training wrappers add, as the pod's contract
wants it: ``num_envs`` copies stepped by one ``jax.jit(jax.vmap(...))``, the time limit
(``truncated``; the env's own ``done`` is ``terminated``) and same-step auto-reset: a finished
env restarts from a fresh ``env.reset`` of its own next key (one PRNG stream per env, from the
seed and its index, so a trajectory does not depend on ``num_envs``), inside the same compiled
step behind a ``lax.cond`` (no host round trip; nobody finished, no reset computed).

Tensors cross through DLPack, zero copy on the same device: observations, rewards and flags are
torch views of JAX's output buffers, actions a JAX view of the torch tensor. The JAX device is
the pod's (``cpu``, or ``cuda:i`` -> JAX's GPU ``i``: a CUDA jax install, ``jax[cuda12]``). JAX
runs with ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (else it would take 75% of the GPU the pod's
torch also uses; set before the config check calls the factory) and, when torch runs one thread
and jax has not made its backends yet, XLA's CPU client on one thread too.
The whole state is a pytree of arrays, so the env is checkpointed exactly (``state_dict``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from podracer_hpc.envs.jax_task import (
    DEFAULT_MAX_EPISODE_STEPS,
    INSTALL_HINT,
    env_sizes,
    prepare_jax_environ,
    resolve_factory,
)

ONE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def _backends_started() -> bool:
    """Whether jax has made its backends (then XLA_FLAGS and the allocator settings are read already)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # another jax: assume the worst
        return True


def import_jax() -> Any:
    """``jax``, with the settings a pod needs (see the module doc) while its backends are not made yet."""
    prepare_jax_environ()
    if not _backends_started():
        flags = os.environ.get("XLA_FLAGS", "")
        if torch.get_num_threads() == 1 and "multi_thread_eigen" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} {ONE_THREAD_FLAGS}".strip()
    try:
        import jax
    except ImportError as e:
        raise ImportError(f"the jax task needs jax ({e}); {INSTALL_HINT}") from None
    return jax


def jax_device(jax: Any, device: torch.device) -> Any:
    """The JAX device of the torch device ``device`` (ValueError when this jax has none such)."""
    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        if index >= len(gpus):
            raise ValueError(
                f"the jax task on {device} needs a CUDA jax (this jax sees {len(gpus)} GPU(s): "
                f"{jax.devices()}); pip install 'jax[cuda12]'"
            )
        return gpus[index]
    raise ValueError(f"the jax task runs on cpu or cuda, not {device}")


def env_episode_length(env: Any) -> int:
    """The env's own time limit, 0 if it has none: ``env.max_episode_steps``, else a Playground env's
    config ``episode_length`` (``env._config``; what Playground's training scripts pass its wrapper:
    1000 for the dm_control suite, 250 for the vision Cartpole)."""
    steps = getattr(env, "max_episode_steps", 0)
    if not steps:
        steps = getattr(getattr(env, "_config", None), "episode_length", 0)
    try:
        return max(int(steps), 0)
    except (TypeError, ValueError):
        return 0


class JaxVecEnv:
    """``num_envs`` copies of the JAX env ``env`` (the protocol above) as a VecEnv."""

    backend = "jax"
    discrete = False
    num_actions = 0

    def __init__(
        self,
        env: Any,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        obs_key: str = "state",
        dtype: torch.dtype = torch.float32,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        jax = self._jax = import_jax()
        self.env, self.num_envs, self.device, self.dtype = env, int(num_envs), torch.device(device), dtype
        self.obs_dim, self.act_dim = env_sizes(env, obs_key)
        self.obs_key = obs_key
        self.action_low = getattr(env, "action_low", -1.0)
        self.action_high = getattr(env, "action_high", 1.0)
        self.max_episode_steps = int(max_episode_steps or env_episode_length(env) or DEFAULT_MAX_EPISODE_STEPS)
        self.jax_device = jax_device(jax, self.device)
        self._reset_fn = jax.jit(self._pure_reset)
        self._step_fn = jax.jit(self._pure_step)
        self.ep_return = torch.zeros(self.num_envs, dtype=torch.float64, device=self.device)
        self.seed = seed
        self.reset(seed)

    # --- pure functions of JAX arrays (compiled once) ---------------------------------
    def _obs(self, state: Any) -> Any:
        obs = state.obs
        if not hasattr(obs, "shape"):  # a mapping of observations (Playground's dict observations)
            obs = obs[self.obs_key]
        return obs.reshape(obs.shape[0], -1)

    def _pure_reset(self, seed: Any) -> tuple[Any, ...]:
        jax = self._jax
        base = jax.random.PRNGKey(seed)
        keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(jax.numpy.arange(self.num_envs))
        split = jax.vmap(jax.random.split)(keys)  # [N, 2, 2]: the env's next key, the key of this reset
        state = jax.vmap(self.env.reset)(split[:, 1])
        return state, split[:, 0], jax.numpy.zeros(self.num_envs, jax.numpy.int32), self._obs(state)

    def _pure_step(self, state: Any, keys: Any, t: Any, action: Any) -> tuple[Any, ...]:
        jax = self._jax
        jnp = jax.numpy
        nxt = jax.vmap(self.env.step)(state, action)
        ended = jnp.asarray(nxt.done).reshape(-1)
        terminated = ended if ended.dtype == jnp.bool_ else ended > 0.5  # Playground's done is 0.0 or 1.0
        t1 = t + 1
        truncated = (t1 >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        final_obs = self._obs(nxt)

        def restart(carry: tuple[Any, Any]) -> tuple[Any, Any]:
            s, k = carry
            split = jax.vmap(jax.random.split)(k)
            fresh = jax.vmap(self.env.reset)(split[:, 1])

            def pick(new: Any, old: Any) -> Any:
                mask = done.reshape(done.shape + (1,) * (old.ndim - 1))
                return jnp.where(mask, new, old).astype(old.dtype)

            return jax.tree.map(pick, fresh, s), jnp.where(done[:, None], split[:, 0], k)  # only finished envs draw

        state, keys = jax.lax.cond(done.any(), restart, lambda carry: carry, (nxt, keys))
        reward = jnp.asarray(nxt.reward, jnp.float32).reshape(-1)
        # the three flags in one buffer (each crossing to torch is a DLPack hand-over, ~10 us on a CPU); the
        # floats stay apart: XLA's CPU fusion recomputes the observation into a concatenation (measured 1.6x slower)
        flags = jnp.concatenate([terminated, truncated, done]).astype(jnp.uint8)
        return state, keys, jnp.where(done, 0, t1), self._obs(state), final_obs, reward, flags, t1

    # --- the protocol --------------------------------------------------------------------
    def _t(self, x: Any) -> torch.Tensor:
        """A JAX array as a torch tensor on the pod's device (a DLPack view, no copy)."""
        return torch.from_dlpack(x)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start every env anew; a seed restarts every env's PRNG stream (env i: fold_in(seed, i))."""
        if seed is not None:
            self.seed = seed
        with self._jax.default_device(self.jax_device):
            self.state, self.keys, self.t, obs = self._reset_fn(self._jax.numpy.uint32(self.seed % 2**32))
        self.ep_return.zero_()
        return self._t(obs).to(self.dtype)

    def step(
        self, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """One step of every env: same-step auto-reset, ``info["final_obs"]`` of the finished ones."""
        a = action.detach().to(self.device, torch.float32).reshape(self.num_envs, self.act_dim).contiguous()
        a = self._jax.dlpack.from_dlpack(a)  # a view of the torch tensor
        self.state, self.keys, self.t, obs, final, reward, flags, length = self._step_fn(
            self.state, self.keys, self.t, a
        )
        n = self.num_envs
        obs, final, reward = self._t(obs), self._t(final), self._t(reward)
        flags = self._t(flags).view(torch.bool)
        term, trunc, done = flags[:n], flags[n : 2 * n], flags[2 * n :]  # contiguous views
        ep_ret = self.ep_return + reward.to(torch.float64)
        self.ep_return = torch.where(done, 0.0, ep_ret)
        info = {
            "final_obs": final.to(self.dtype),
            "done": done,
            "episode_return": ep_ret,
            "episode_length": self._t(length).to(torch.int64),
        }
        return obs.to(self.dtype), reward.to(self.dtype), term, trunc, info

    # --- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything needed to continue exactly: the env state's leaves, the keys, the clocks."""
        import numpy as np

        leaves = self._jax.tree_util.tree_leaves((self.state, self.keys, self.t))
        out = {}
        for i, leaf in enumerate(leaves):
            x = np.array(leaf)  # a copy on the host
            if x.dtype.kind == "u" and x.dtype.itemsize > 1:  # PRNG keys: uint32 (stored as int64, exact)
                x = x.astype(np.int64)
            out[f"leaf.{i}"] = torch.from_numpy(x)
        out["ep_return"] = self.ep_return.clone()
        return out

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict` output (ValueError for another env's or another num_envs's)."""
        import numpy as np

        jax = self._jax
        template, treedef = jax.tree_util.tree_flatten((self.state, self.keys, self.t))
        n = sum(k.startswith("leaf.") for k in sd)
        if n != len(template):
            raise ValueError(f"env state has {n} arrays, this JAX env has {len(template)} (another env?)")
        leaves = []
        for i, old in enumerate(template):
            x = sd[f"leaf.{i}"].cpu().numpy()
            if tuple(x.shape) != tuple(old.shape):
                raise ValueError(
                    f"env state array {i} has shape {tuple(x.shape)}, expected {tuple(old.shape)} "
                    "(was num_envs changed since the checkpoint?)"
                )
            leaves.append(jax.device_put(np.asarray(x, dtype=old.dtype), self.jax_device))
        self.state, self.keys, self.t = jax.tree_util.tree_unflatten(treedef, leaves)
        self.ep_return = sd["ep_return"].to(self.device, torch.float64).clone()


def make_jax_env(
    num_envs: int,
    device: Any = "cpu",
    seed: int = 0,
    max_episode_steps: int = 0,
    dtype: Any = None,
    factory: str = "",
    kwargs: dict | None = None,
    obs_key: str = "state",
) -> JaxVecEnv:
    """The ``jax`` task's env: ``factory(**kwargs)`` (``"module:callable"``) as a :class:`JaxVecEnv`."""
    if not factory:
        raise ValueError("the jax task needs a factory (env.jax.factory, e.g. podracer_hpc.envs.jax_pendulum:make)")
    import_jax()  # before the factory's module imports jax itself
    env = resolve_factory(factory)(**(kwargs or {}))
    return JaxVecEnv(
        env,
        num_envs,
        device=device,
        seed=seed,
        max_episode_steps=max_episode_steps,
        obs_key=obs_key,
        dtype=dtype or torch.float32,
    )


class JaxTask:
    """The registry's entry: called like a task class, it builds the env (:func:`make_jax_env`), as
    the gymnasium and MuJoCo tasks' builders do (``TASKS`` holds classes)."""

    def __new__(
        cls,
        num_envs: int,
        device: Any = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        dtype: Any = None,
        **options: Any,
    ) -> Any:
        return make_jax_env(num_envs, device, seed, max_episode_steps, dtype, **options)
