"""The ``jax`` task: a functional JAX environment (MuJoCo Playground, Brax, your own), declared.

``env.name: jax`` with the section ``env.jax``::

    env:
      name: jax
      jax: {factory: "mujoco_playground:registry.load", kwargs: {env_name: CartpoleBalance}, obs_key: state}

``factory`` is ``"module:attribute"`` (the attribute may be dotted, ``pkg:registry.load``): called
with ``kwargs``, it returns one (unbatched) env of the protocol :mod:`.jax_adapter` documents
(``reset(rng) -> state``, ``step(state, action) -> state``, ``observation_size``,
``action_size``); the adapter steps ``num_envs`` of them as one ``jax.jit(jax.vmap(...))``.

When the config names this task, it imports the factory's module and calls the factory once to
read the sizes, so a bad factory string, a missing package or bad keyword arguments are refused
with exit 2 before anything runs or queues (``podracer submit --dry-run`` included). That check
imports jax (through the factory's module) but not torch; this module imports neither.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

from podracer_hpc.docfield import ConfigError, F
from podracer_hpc.envs.registry import Lazy, OptionError, Task, register

DEFAULT_MAX_EPISODE_STEPS = 1000  # MuJoCo Playground's and Brax's episode_length default
INSTALL_HINT = "pip install 'podracer-hpc[jax]' (CPU jax; for a GPU: pip install 'jax[cuda12]')"


@dataclass
class JaxOptions:
    """JAX task settings (which functional JAX env, its arguments, which observation).

    The config section ``env.jax``, read when ``env.name`` is ``jax``."""

    factory: str = F(
        "",
        "module:callable returning one JAX env with reset(rng)/step(state, action), e.g. "
        "mujoco_playground:registry.load or podracer_hpc.envs.jax_pendulum:make",
    )
    kwargs: dict = F({}, "keyword arguments of the factory (Playground: {env_name: CartpoleBalance})")
    obs_key: str = F(
        "state",
        "the entry of a dict observation the policy sees (Playground's 'state'); "
        "ignored when the observation is one array",
    )

    def check(self) -> None:
        """Raise OptionError for a factory that is not ``module:attribute`` or kwargs that are not a mapping."""
        if not isinstance(self.factory, str):
            raise OptionError("factory", f"must be 'module:callable' (a string), got {self.factory!r}")
        if self.factory:
            split_factory(self.factory)
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise OptionError("kwargs", f"must be a mapping of argument names to values, got {self.kwargs!r}")
        if not isinstance(self.obs_key, str):
            raise OptionError("obs_key", f"must be a string, got {self.obs_key!r}")


def prepare_jax_environ() -> None:
    """Before anything imports jax for a pod: JAX must not take 75% of the GPU at start (torch shares
    it), so ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless it is set already."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def split_factory(factory: str) -> tuple[str, list[str]]:
    """``"pkg.mod:obj.attr"`` -> ``("pkg.mod", ["obj", "attr"])``; OptionError("factory") if malformed."""
    module, sep, attr = factory.partition(":")
    parts = attr.split(".")
    if not sep or not all(p.isidentifier() for p in module.split(".")) or not all(p.isidentifier() for p in parts):
        raise OptionError(
            "factory",
            f"must be 'module:callable' (e.g. podracer_hpc.envs.jax_pendulum:make or "
            f"mujoco_playground:registry.load), got {factory!r}",
        )
    return module, parts


def resolve_factory(factory: str) -> Callable[..., Any]:
    """The callable ``factory`` names, imported now.

    Raises ImportError (its module, or a package it needs, is not installed), AttributeError (no
    such attribute), TypeError (not callable) or :class:`OptionError` (malformed), each naming it."""
    module, parts = split_factory(factory)
    try:
        obj: Any = importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or module
        hint = f"; {INSTALL_HINT}" if missing.split(".")[0] in ("jax", "jaxlib") else ""
        raise ImportError(f"cannot import {module!r} (no module named {missing!r}){hint}") from None
    for i, p in enumerate(parts):
        if not hasattr(obj, p):
            owner = f"module {module!r}" if i == 0 else f"{module}:{'.'.join(parts[:i])}"
            raise AttributeError(f"{owner} has no attribute {p!r}")
        obj = getattr(obj, p)
    if not callable(obj):
        kind = type(obj).__name__
        raise TypeError(f"{factory} is not callable ({'an' if kind[0] in 'aeiou' else 'a'} {kind})")
    return obj


def env_sizes(env: Any, obs_key: str) -> tuple[int, int]:
    """``(obs_dim, act_dim)`` of one JAX env from its ``observation_size`` and ``action_size``.

    ``observation_size`` may be an int, a shape, or a mapping of them (then ``obs_key`` picks
    one); a shape counts its elements (a pod flattens the observation). Raises ValueError."""
    for attr in ("reset", "step", "observation_size", "action_size"):
        if not hasattr(env, attr):
            raise ValueError(
                f"the env ({type(env).__name__}) has no {attr!r}: a JAX env needs reset(rng), "
                "step(state, action), observation_size and action_size (docs/jax.md)"
            )
    size = env.observation_size
    if isinstance(size, dict) or hasattr(size, "keys"):
        if obs_key not in size:
            raise KeyError(f"its observation is a dict without {obs_key!r}; its keys: {', '.join(map(str, size))}")
        size = size[obs_key]
    obs_dim = int(size) if isinstance(size, int) or not hasattr(size, "__len__") else math.prod(int(s) for s in size)
    act = env.action_size
    if not isinstance(act, int) and hasattr(act, "__len__"):
        act = math.prod(int(s) for s in act)
    if obs_dim < 1 or int(act) < 1:
        raise ValueError(f"observation_size {env.observation_size!r} and action_size {env.action_size!r} must be >= 1")
    return obs_dim, int(act)


_PROBED: dict[str, dict[str, Any]] = {}  # what verify learned of an env, by its settings


def probe(options: JaxOptions) -> dict[str, Any]:
    """Make the env of ``options`` once and return ``{"obs_dim", "act_dim"}`` (cached per process).

    Raises ConfigError naming the key at fault (a malformed or missing factory, a package that is
    not installed, keyword arguments it does not take, an env without the protocol)."""
    key = json.dumps([options.factory, options.kwargs, options.obs_key], sort_keys=True, default=repr)
    if key in _PROBED:
        return _PROBED[key]
    where = "env.jax.factory"
    prepare_jax_environ()  # the factory may make arrays (Playground's models): jax's GPU client starts now
    try:
        make = resolve_factory(options.factory)
        where = "env.jax.kwargs"
        env = make(**options.kwargs)
        where = "env.jax.factory"
        obs_dim, act_dim = env_sizes(env, options.obs_key)
    except OptionError as e:
        raise ConfigError(f"env.jax.{e}") from None
    except KeyError as e:
        raise ConfigError(f"env.jax.obs_key: {options.factory} returns an env whose {e.args[0]}") from None
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{where}: {options.factory}: {e}") from None
    except TypeError as e:
        raise ConfigError(f"{where}: {options.factory}(**{options.kwargs!r}): {e}") from None
    except Exception as e:  # the factory's own errors: one line, not a traceback
        raise ConfigError(f"{where}: {options.factory}(**{options.kwargs!r}) failed: {type(e).__name__}: {e}") from None
    _PROBED[key] = {"obs_dim": obs_dim, "act_dim": act_dim}
    return _PROBED[key]


def verify(env: Any, algo: str) -> None:
    """The config's checks when ``env.name`` is ``jax``: a factory is set and makes an env (:func:`probe`)."""
    if not env.jax.factory:
        raise ConfigError(
            "env.jax.factory: set it to 'module:callable' of a JAX env, e.g. "
            "podracer_hpc.envs.jax_pendulum:make (env.name is jax)"
        )
    probe(env.jax)


def names_code(options: JaxOptions) -> dict[str, Any]:
    """What of ``env.jax`` names code: the factory is imported and called with its kwargs."""
    return {"factory": options.factory, "kwargs": options.kwargs} if options.factory else {}


register(
    Task(
        "jax",
        build=Lazy("podracer_hpc.envs.jax_adapter", "JaxTask"),
        options=JaxOptions,
        section="jax",
        doc="a functional JAX env (MuJoCo Playground, Brax; env.jax.factory), jit+vmap, tensors through DLPack",
        verify=verify,
        names_code=names_code,
    )
)
