"""The ``gymnasium`` task: any installed gymnasium env, by id, stepped on the host.

``env.name: gymnasium`` with the section ``env.gymnasium``::

    env:
      name: gymnasium
      gymnasium: {id: Acrobot-v1, kwargs: {}, vectorization: sync}

``id`` is what ``gymnasium.make`` takes (``"module:Env-v0"`` imports ``module`` first, for
packages that register their envs on import); ``kwargs`` go to the env's constructor;
``vectorization`` is ``sync``, ``async`` or ``vector_entry_point`` (:mod:`.gym_adapter`).
The observation space must be Box or Discrete, the action space Discrete or a bounded Box.

When the config names this task, it makes the env once (one sub-env, cached per process) to
check the id, the keyword arguments, the spaces and the time limit, so a bad id is refused
with exit 2 before anything runs or queues (``podracer submit --dry-run`` included). Such envs
cannot be checkpointed exactly: a resume restores the agent and starts new episodes, and the
run says so. This module imports neither torch nor gymnasium until an env is made or checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from podracer_hpc.docfield import ConfigError, F
from podracer_hpc.envs.registry import OptionError, Task, register

VECTORIZATION = ("sync", "async", "vector_entry_point")  # gym_adapter.VECTORIZATION, without importing torch


@dataclass
class GymnasiumOptions:
    """Gymnasium task settings (which installed gymnasium env, its arguments, how it is vectorized).

    The config section ``env.gymnasium``, read when ``env.name`` is ``gymnasium``."""

    id: str = F(
        "",
        "gymnasium env id as gymnasium.make takes it, e.g. Acrobot-v1 or my_pkg:MyEnv-v0 "
        "(Box or Discrete observations, Discrete or bounded Box actions)",
    )
    kwargs: dict = F({}, "keyword arguments of the env's constructor (gymnasium.make_vec(id, **kwargs))")
    vectorization: str = F(
        "sync",
        "sync | async | vector_entry_point: gymnasium's SyncVectorEnv, AsyncVectorEnv "
        "(a worker process per env) or the env's own vector env",
    )

    def check(self) -> None:
        """Raise OptionError for an unknown vectorization or keyword arguments that are not a mapping."""
        if self.vectorization not in VECTORIZATION:
            raise OptionError("vectorization", f"must be one of {', '.join(VECTORIZATION)}, got {self.vectorization!r}")
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise OptionError("kwargs", f"must be a mapping of argument names to values, got {self.kwargs!r}")
        if not isinstance(self.id, str):
            raise OptionError("id", f"must be a gymnasium env id (a string), got {self.id!r}")


_PROBED: dict[str, dict[str, Any]] = {}  # what verify learned of an env, by its settings


def probe(options: GymnasiumOptions, max_episode_steps: int = 0) -> dict[str, Any]:
    """Make the env of ``options`` once (one sub-env) and return what the config checks:
    ``{"discrete", "max_episode_steps", "obs_dim", "act_dim"}``; cached per process.

    Raises ConfigError naming the key at fault (an unknown id, bad kwargs, a space a pod cannot
    take, an own vector env that does not reset on the same step)."""
    key = json.dumps(
        [options.id, options.kwargs, options.vectorization, max_episode_steps], sort_keys=True, default=repr
    )
    if key in _PROBED:
        return _PROBED[key]
    from podracer_hpc.envs.gym_adapter import GymVecEnv  # torch and gymnasium: only when a gymnasium env is asked for

    mode = "vector_entry_point" if options.vectorization == "vector_entry_point" else "sync"  # no worker to start
    try:
        env = GymVecEnv(options.id, 1, max_episode_steps=max_episode_steps, kwargs=options.kwargs, vectorization=mode)
    except ImportError as e:
        raise ConfigError(
            f"env.gymnasium.id: {options.id!r} needs a package that is not installed ({e}); "
            "pip install it (gymnasium itself: pip install 'podracer-hpc[gym]')"
        ) from None
    except ValueError as e:
        which = "vectorization" if "vector env" in str(e) else "id"
        raise ConfigError(f"env.gymnasium.{which}: {e}") from None
    except TypeError as e:
        raise ConfigError(f"env.gymnasium.kwargs: {options.id!r} does not take {options.kwargs!r}: {e}") from None
    except Exception as e:  # gymnasium.error.Error and the env's own errors: one line, not a traceback
        raise ConfigError(f"env.gymnasium.id: gymnasium cannot make {options.id!r}: {type(e).__name__}: {e}") from None
    info = {
        "discrete": env.discrete,
        "max_episode_steps": env.max_episode_steps,
        "obs_dim": env.obs_dim,
        "act_dim": env.act_dim,
    }
    env.close()
    _PROBED[key] = info
    return info


def verify(env: Any, algo: str) -> None:
    """The config's checks when ``env.name`` is ``gymnasium`` (:func:`probe`), and what the
    learner needs of the env: SAC and TD3 need continuous actions, evaluations a time limit."""
    o = env.gymnasium
    if not o.id:
        raise ConfigError(
            "env.gymnasium.id: set it to the id of an installed gymnasium env, e.g. Acrobot-v1 (env.name is gymnasium)"
        )
    info = probe(o, env.max_episode_steps)
    if not info["max_episode_steps"]:
        raise ConfigError(
            f"env.max_episode_steps: {o.id} has no time limit of its own (its spec's max_episode_steps "
            "is None) and an evaluation needs one: set env.max_episode_steps"
        )
    if info["discrete"] and algo in ("sac", "td3"):
        raise ConfigError(f"agent.algo: {algo} needs continuous actions; {o.id} has discrete ones: use agent.algo ppo")


def make_gymnasium_env(
    num_envs: int,
    device: Any = "cpu",
    seed: int = 0,
    max_episode_steps: int = 0,
    dtype: Any = None,
    id: str = "",
    kwargs: dict | None = None,
    vectorization: str = "sync",
) -> Any:
    """The ``gymnasium`` task's env: gymnasium env ``id`` as a VecEnv (:class:`.gym_adapter.GymVecEnv`),
    its ``backend`` ``gymnasium-<vectorization>``."""
    import torch

    from podracer_hpc.envs.gym_adapter import GymVecEnv

    if not id:
        raise ValueError("the gymnasium task needs an env id (env.gymnasium.id, e.g. Acrobot-v1)")
    env = GymVecEnv(
        id,
        num_envs,
        device=device,
        seed=seed,
        max_episode_steps=max_episode_steps,
        kwargs=kwargs,
        vectorization=vectorization,
        dtype=dtype or torch.float32,
    )
    env.backend = f"gymnasium-{vectorization}"
    return env


class GymnasiumTask:
    """The registry's entry: called like a task class, it builds the env (:func:`make_gymnasium_env`),
    as the MuJoCo tasks' builders do (``TASKS`` holds classes)."""

    def __new__(
        cls,
        num_envs: int,
        device: Any = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        dtype: Any = None,
        **options: Any,
    ) -> Any:
        return make_gymnasium_env(num_envs, device, seed, max_episode_steps, dtype, **options)


def names_code(options: GymnasiumOptions) -> dict[str, Any]:
    """What of ``env.gymnasium`` names code: an id ``module:Env-v0`` imports ``module`` (a plain id
    makes an env an installed package registered) and hands it the kwargs."""
    return {"id": options.id, "kwargs": options.kwargs} if ":" in str(options.id) else {}


register(
    Task(
        "gymnasium",
        build=GymnasiumTask,
        options=GymnasiumOptions,
        section="gymnasium",
        doc="any installed gymnasium env (env.gymnasium.id; stepped on the host, not checkpointed exactly)",
        verify=verify,
        names_code=names_code,
    )
)
