"""Configuration: dataclasses with a one-line doc per field, YAML loading, dotted overrides.

A job file in ``jobs/`` is YAML whose keys mirror :class:`Config`. Overrides use dotted keys,
``--set agent.learning_rate=1e-3``; values are parsed as YAML. Unknown keys and invalid values
raise :class:`ConfigError` before anything runs, naming the valid keys.

This module is the ground floor: the core sections live here; each task's settings (the
section ``env.<section>``, e.g. ``env.trading``) are declared by the task next to its env code
and found in the task registry (:mod:`podracer_hpc.envs.registry`), which this module reads
only when a config is built, so importing it stays cheap (no torch).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import yaml

from podracer_hpc.agents.settings import (
    MUTABLE_HPARAMS,
    SAC_MUTABLE,
    TD3_MUTABLE,
    PPOConfig,
    SACConfig,
    TD3Config,
    mutable_hparams,
)
from podracer_hpc.docfield import ConfigError, F, coerce, is_section
from podracer_hpc.files.bounded import RunFileError, loads_yaml, read_yaml

# Upper bounds of sizes: beyond them a value is a typo (1e12 for 1e2), not a run; a pod also
# checks its memory estimate against the device before it allocates (pod.check_memory).
MAX_NUM_ENVS = 2**24
MAX_BATCH = 2**31 - 1
MAX_HIDDEN = 2**16
MAX_EVAL_EPISODES = 2**20
MAX_EPISODE_STEPS = 10_000_000
MAX_TOTAL_ENV_STEPS = 10**15
MAX_MIN_INTERVAL_S = 7 * 24 * 3600.0  # tournament.min_interval_s: a week between rounds at most

# Agent hyperparameters that a pod may change while it trains (PBT explores these), per learner.
ALGOS = ("ppo", "sac", "td3")  # agent.algo
MUTABLE_BY_ALGO = {"ppo": MUTABLE_HPARAMS, "sac": SAC_MUTABLE, "td3": TD3_MUTABLE}


@dataclass
class EnvConfig:
    """Section ``env``: the fields every task has. Each task's own settings are a section of it
    (``env.trading``, ``env.mujoco``, ...) that the task declares next to its env code and
    registers (:mod:`podracer_hpc.envs.registry`); :func:`env_config_class` adds them as fields,
    and ``EnvConfig(...)`` builds that class (with the sections' defaults)."""

    name: str = F("pendulum", "task: a name in the task registry (env_config_class lists them in this doc)")
    num_envs: int = F(1024, "environments stepped together as one batch on the pod's device")
    max_episode_steps: int = F(
        0, "time limit per episode; 0 = the task's default (pendulum 200, cartpole 500, MuJoCo 1000)"
    )

    def __new__(cls, *args: Any, **kwargs: Any) -> EnvConfig:
        # EnvConfig(...) is the class with the registered tasks' sections (dataclass __init__ follows)
        return object.__new__(env_config_class() if cls is EnvConfig else cls)


_ENV_CLASSES: dict[tuple, type] = {}


def env_config_class() -> type[EnvConfig]:
    """:class:`EnvConfig` with one field per option section of the task registry, ``env.<section>``
    (its options dataclass, defaults and docs), in registration order; ``env.name``'s doc lists
    the registered tasks. The same sections give the same class."""
    from podracer_hpc.envs import registry  # here, not at the top: the task modules import torch

    sections = registry.sections()
    tasks = registry.names()
    key = (tuple(sections.items()), tuple(tasks))
    cls = _ENV_CLASSES.get(key)
    if cls is None:
        core = {f.name for f in dataclasses.fields(EnvConfig)}
        clash = sorted(core & set(sections))
        if clash:
            raise ConfigError(
                f"task option section(s) {clash} clash with the core keys env.{{{', '.join(sorted(core))}}}"
            )
        name = dataclasses.field(default="pendulum", metadata={"doc": "task: " + " | ".join(tasks)})
        fields: list[tuple[str, Any, Any]] = [("name", str, name)]
        for section, opts in sections.items():
            doc = (opts.__doc__ or "").strip().splitlines()[0].rstrip(".") if opts.__doc__ else f"{section} settings"
            fields.append((section, opts, dataclasses.field(default_factory=opts, metadata={"doc": doc})))
        cls = dataclasses.make_dataclass("TaskEnvConfig", fields, bases=(EnvConfig,))
        cls.__module__, cls.__doc__ = __name__, EnvConfig.__doc__
        _ENV_CLASSES[key] = cls
    return cls


def __getattr__(name: str) -> Any:
    """``TaskEnvConfig``: the current :func:`env_config_class` (so pickled configs load)."""
    if name == "TaskEnvConfig":
        return env_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class EvalConfig:
    interval_env_steps: int = F(100_000, "evaluate every this many env steps (and always at the end)")
    episodes: int = F(
        20,
        "episodes per evaluation: deterministic policy, start states common to every pod of the "
        "run (drawn from seed, not the pod's seed; new for each round)",
    )
    final_episodes: int = F(
        100,
        "episodes of the run's last evaluation, every pod on one common set: the summary's "
        "best_pod and best_return (with its interval) come from it; 0 = none",
    )
    stop_at_return: float | None = F(
        None,
        "end the run once a pod's evaluation reaches this mean return: its stop notice carries its env "
        "steps, every pod of the job trains (and evaluates) that far and stops, and the run is complete; "
        "null = train to total_env_steps",
    )


@dataclass
class LogConfig:
    progress_interval_s: float = F(
        10.0, "seconds between progress lines on stderr (rank 0 of each job, with the pool's last round); 0 = none"
    )
    progress_all_ranks: bool = F(
        False,
        "every rank prints its progress lines, not only rank 0 (4,096 ranks every 10 s: 410 lines/s into one job log)",
    )
    checkpoint_interval_s: float = F(300.0, "seconds between checkpoints (also at the end and on signals)")
    aggregate_interval_s: float = F(
        30.0, "seconds between a world's rank 0 rewrites of parts/part<k>.json, its pods' heartbeats in one file"
    )
    round_checkpoints: str = F(
        "auto",
        "every: each tournament round checkpoints | due: a round checkpoints once "
        "checkpoint_interval_s has passed (collective: when any pod's has) | auto: every "
        "when rounds come at exact env steps (tournament.min_interval_s 0), else due",
    )


# ------------------------------------------------------------------------------------------
# The tournament section (its rules are podracer_hpc/pool/rules.py, which reads this)
# ------------------------------------------------------------------------------------------
MODES = ("elegantrl", "pbt", "dexpbt", "none")
# The PBT rules: they change hyperparameters (an empty tournament.hparam_space means the default space)
# and tournament.reserve keeps pods out of their reach.
EXPLORING_MODES = ("pbt", "dexpbt")
SYNC_MODES = ("collective", "async")
INITIAL_HPARAMS = ("auto", "job", "prior")  # tournament.initial_hparams
ROUND_CHECKPOINTS = ("auto", "every", "due")  # log.round_checkpoints


class HParamRange(NamedTuple):
    """Prior and bounds of one hyperparameter."""

    low: float
    high: float
    log_scale: bool = False


def normalize_space(space: Mapping[str, Any]) -> dict[str, HParamRange]:
    """Validate a hyperparameter space; accepts ``(low, high[, log_scale])`` sequences or
    ``{"low":, "high":, "log_scale"/"log":}`` mappings (as YAML gives them)."""
    out: dict[str, HParamRange] = {}
    for name, spec in space.items():
        if isinstance(spec, Mapping):
            low, high = spec["low"], spec["high"]
            log = spec.get("log_scale", spec.get("log", False))
        else:
            spec = tuple(spec)
            if len(spec) not in (2, 3):
                raise ValueError(f"hparam_space[{name!r}]: expected (low, high, log_scale), got {spec!r}")
            low, high, log = (*spec, False) if len(spec) == 2 else spec
        r = HParamRange(float(low), float(high), bool(log))
        if not (math.isfinite(r.low) and math.isfinite(r.high) and r.low < r.high):
            raise ValueError(f"hparam_space[{name!r}]: need finite low < high, got {r.low}, {r.high}")
        if r.log_scale and r.low <= 0:
            raise ValueError(f"hparam_space[{name!r}]: a log-scale range needs low > 0, got {r.low}")
        out[str(name)] = r
    return out


@dataclass
class TournamentConfig:
    """Tournament settings (section ``tournament`` of the run config)."""

    mode: str = F(
        "none",
        "selection rule: elegantrl | pbt | dexpbt (Isaac Lab's: only pods beyond mean +- k std act) | "
        "none (independent pods)",
    )
    sync: str = F(
        "collective",
        "collective: pods meet at each round (allgather; identical decisions, reproducible) | "
        "async: a pod decides alone from the leaderboard and never waits for another",
    )
    interval_env_steps: int = F(
        1_000_000, "env steps each pod trains between tournament rounds (at least; see min_interval_s)"
    )
    min_interval_s: float = F(
        -1.0,
        "a floor on the time between rounds: the next round waits whole intervals until "
        "this many seconds pass at the pod's measured speed (collective: the fastest "
        "pod's); -1 = auto: 60 on a GPU pod, 0 on CPU (rounds at exact env steps)",
    )
    warmup_env_steps: int = F(
        0, "env steps each pod trains before its first round (0: the first at interval_env_steps)"
    )
    top_k: int = F(8, "leaderboard size kept by prune, and the elegantrl candidate pool size")
    temperature: float = F(1.0, "elegantrl: softmax temperature over z-scored scores (> 0)")
    quantile: float = F(0.25, "pbt: fraction of pods in the bottom (replaced) and top (source) groups")
    resample_prob: float = F(0.25, "pbt explore: probability to resample a hyperparameter from its prior")
    perturb_factors: tuple[float, ...] = F((0.8, 1.2), "pbt explore: else multiply by one of these")
    steps_tolerance: float = F(
        0.25, "a source (pbt) or candidate (elegantrl) needs env_steps >= the pod's x (1 - tolerance)"
    )
    margin_se: float = F(
        1.0,
        "elegantrl: take a candidate only if its paired mean return difference on common start "
        "states exceeds this many standard errors (0: any better mean); pbt copies any better source",
    )
    hparam_space: dict[str, HParamRange] = F(
        {},
        "pbt: name -> [low, high, log_scale] of agent hyperparameters; {} = the default PPO space (DEFAULT_PBT_SPACE)",
    )
    ready_rounds: int = F(
        3,
        "pbt/dexpbt: a pod that copied another, or started, is not replaced for this many rounds (PBT's "
        "'ready'; 3: a new learning rate needs 50-75k Pendulum steps to show, bench/HISTORY.md)",
    )
    reserve: int = F(
        0,
        "pbt/dexpbt: pods of rank below this are never replaced (a NaN fitness excepted): independent "
        "lineages that still serve as sources, so a late bloomer among them survives; 0 = none",
    )
    initial_hparams: str = F(
        "auto",
        "pbt/dexpbt: where a fresh pool starts: job (every pod the job's values) | prior (pod 0 the job's, "
        "every other pod its own draw from tournament.hparam_space, random search's draw for its seed) | "
        "auto: prior when tournament.hparam_space is declared, else job",
    )
    threshold_std: float = F(
        0.1,
        "dexpbt: leaders score above max(mean + threshold_std x std, mean + threshold_abs) of the pool's "
        "fitness, underperformers below min(mean - threshold_std x std, mean - threshold_abs)",
    )
    threshold_abs: float = F(0.0, "dexpbt: the least distance from the pool's mean fitness of a cut, in return units")
    mutation_rate: float = F(
        0.25, "dexpbt: probability that each hyperparameter of the space changes when an underperformer acts"
    )
    change_range: tuple[float, ...] = F(
        (1.1, 1.5),
        "dexpbt: a changed hyperparameter is multiplied or divided by a factor drawn uniformly in [min, max]",
    )
    leaderboard_dir: str = F("", "shared leaderboard directory; empty = <run dir>/leaderboard")
    accept_unkeyed: bool = F(
        False,
        "pods also take leaderboard entries written before entries were keyed (no hmac: they cannot be told "
        "from forgeries; only for a leaderboard no one outside the run's group could write, docs/security.md)",
    )
    population_sample: int = F(
        16,
        "async pbt: other pods' latest agents a pod draws and reads each round (its "
        "population: a random sample once the pool is larger; constant work per round)",
    )
    population_buckets: int = F(
        0,
        "async pbt: directories the population is hashed over; 0 = auto (~16 pods each, "
        "from the first job's pod count; set it when later jobs grow the pool a lot)",
    )
    meeting_timeout_s: float = F(
        0.0,
        "deadline of a wait for every rank (rounds, the end, a stop): a rank absent and silent (no heartbeat) "
        "this long ends the world with exit 76, named; 0 = max(300, 3 x the pod's longest round)",
    )

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"tournament.mode must be one of {MODES}, got {self.mode!r}")
        if self.sync not in SYNC_MODES:
            raise ValueError(f"tournament.sync must be one of {SYNC_MODES}, got {self.sync!r}")
        if self.interval_env_steps <= 0:
            raise ValueError(f"tournament.interval_env_steps must be > 0, got {self.interval_env_steps}")
        if self.warmup_env_steps < 0:
            raise ValueError(f"tournament.warmup_env_steps must be >= 0, got {self.warmup_env_steps}")
        if self.top_k < 1:
            raise ValueError(f"tournament.top_k must be >= 1, got {self.top_k}")
        if not self.temperature > 0:
            raise ValueError(f"tournament.temperature must be > 0, got {self.temperature}")
        if not 0.0 <= self.quantile <= 0.5:
            raise ValueError(f"tournament.quantile must be in [0, 0.5], got {self.quantile}")
        if not 0.0 <= self.resample_prob <= 1.0:
            raise ValueError(f"tournament.resample_prob must be in [0, 1], got {self.resample_prob}")
        self.perturb_factors = tuple(float(f) for f in self.perturb_factors)
        if not self.perturb_factors or any(not f > 0 for f in self.perturb_factors):
            raise ValueError(f"tournament.perturb_factors must be positive numbers, got {self.perturb_factors}")
        if not 0.0 <= self.steps_tolerance <= 1.0:
            raise ValueError(f"tournament.steps_tolerance must be in [0, 1], got {self.steps_tolerance}")
        if not (math.isfinite(self.margin_se) and self.margin_se >= 0):
            raise ValueError(f"tournament.margin_se must be a number >= 0, got {self.margin_se}")
        self.hparam_space = normalize_space(self.hparam_space)
        if not (math.isfinite(self.threshold_std) and self.threshold_std >= 0):
            raise ValueError(f"tournament.threshold_std must be a number >= 0, got {self.threshold_std}")
        if not (math.isfinite(self.threshold_abs) and self.threshold_abs >= 0):
            raise ValueError(f"tournament.threshold_abs must be a number >= 0 (return units), got {self.threshold_abs}")
        if self.initial_hparams not in INITIAL_HPARAMS:
            raise ValueError(
                f"tournament.initial_hparams must be one of {INITIAL_HPARAMS}, got {self.initial_hparams!r}"
            )
        if not 0.0 <= self.mutation_rate <= 1.0:
            raise ValueError(f"tournament.mutation_rate must be in [0, 1], got {self.mutation_rate}")
        self.change_range = tuple(float(f) for f in self.change_range)
        if len(self.change_range) != 2 or not 1.0 <= self.change_range[0] <= self.change_range[1] < math.inf:
            raise ValueError(
                f"tournament.change_range must be [min, max] with 1 <= min <= max, got {list(self.change_range)}"
            )
        if self.mode == "dexpbt" and self.sync != "collective":
            raise ValueError(
                "tournament.mode dexpbt compares the whole pool at each round: it runs with tournament.sync "
                "collective (asynchronous PBT: tournament.mode pbt)"
            )
        if self.ready_rounds < 0:
            raise ValueError(f"tournament.ready_rounds must be >= 0, got {self.ready_rounds}")
        if self.reserve < 0:
            raise ValueError(f"tournament.reserve must be >= 0 (pods never replaced), got {self.reserve}")
        if self.reserve and self.mode not in EXPLORING_MODES:
            raise ValueError(
                f"tournament.reserve keeps pods out of the pbt and dexpbt rules' reach; under tournament.mode "
                f"{self.mode} it would do nothing: drop it, or set tournament.mode pbt or dexpbt"
            )
        if not (math.isfinite(self.min_interval_s) and -1 <= self.min_interval_s <= MAX_MIN_INTERVAL_S):
            raise ValueError(
                f"tournament.min_interval_s must be in [0, {MAX_MIN_INTERVAL_S:,.0f}] seconds (a week; "
                f"for no rounds at all use tournament.mode none), or -1 for auto, got {self.min_interval_s}"
            )
        if self.population_sample < 1:
            raise ValueError(f"tournament.population_sample must be >= 1, got {self.population_sample}")
        if not (math.isfinite(self.meeting_timeout_s) and self.meeting_timeout_s >= 0):
            raise ValueError(
                f"tournament.meeting_timeout_s must be >= 0 seconds (0 = derived), got {self.meeting_timeout_s}"
            )
        if self.population_buckets < 0:
            raise ValueError(f"tournament.population_buckets must be >= 0 (0 = auto), got {self.population_buckets}")


@dataclass
class Config:
    name: str = F("", "run name; defaults to the job file's stem")
    seed: int = F(0, "seed of everything in the run; pod r of a pool uses seed + r")
    total_env_steps: int = F(1_000_000, "env steps to train, per pod")
    device: str = F(
        "auto",
        "auto (cuda:<local rank> if CUDA, else cpu) | cpu | cuda | cuda:N | cuda:shared (pods "
        "share GPUs on purpose: no one-GPU-per-pod check)",
    )
    threads: int = F(0, "torch CPU threads per pod; 0 = all cores divided by the ranks on the node")
    deterministic: bool = F(False, "use deterministic torch kernels (bitwise reproducible CPU runs are the default)")
    env: EnvConfig = F(EnvConfig, "environment")
    agent: PPOConfig = F(PPOConfig, "the learner; its class is chosen by agent.algo (PPOConfig, SACConfig, TD3Config)")
    eval: EvalConfig = F(EvalConfig, "evaluation")
    log: LogConfig = F(LogConfig, "logging and checkpoints")
    tournament: TournamentConfig = F(TournamentConfig, "the training pool's tournament (ranks of one MPI world)")
    members: list = F(
        [],
        "mixed pools: a list of overrides (agent.* and env.num_envs keys); rank i applies "
        "entry i mod len; an entry that changes agent.algo starts from that learner's defaults "
        "(was `population:`, still read)",
    )


def _field_types(cls: type) -> dict[str, Any]:
    """The field types of a config class; ``EnvConfig`` stands for its class with the task sections."""
    hints = typing.get_type_hints(cls)
    return {k: env_config_class() if tp is EnvConfig else tp for k, tp in hints.items()}


def describe(cls: type = Config, prefix: str = "", algo: str = "ppo") -> list[tuple[str, str, Any]]:
    """All dotted keys of a config class with their doc and default: [(key, doc, default)];
    the agent section's are those of learner ``algo`` (:data:`AGENT_CLASSES`)."""
    out = []
    cls = env_config_class() if cls is EnvConfig else cls
    hints = _field_types(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if tp is PPOConfig:
            tp = agent_class(algo)
        if is_section(tp):
            out += describe(tp, prefix + f.name + ".", algo)
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out.append((prefix + f.name, f.metadata.get("doc", ""), json.loads(json.dumps(default))))
    return out


def _valid_keys_text(cls: type, prefix: str) -> str:
    lines = []
    cls = env_config_class() if cls is EnvConfig else cls
    hints = _field_types(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        kind = "section" if is_section(tp) else getattr(tp, "__name__", str(tp))
        lines.append(f"  {prefix}{f.name} ({kind}): {f.metadata.get('doc', '')}")
    return "\n".join(lines)


def from_dict(cls: type, data: dict[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested dict, refusing unknown keys and wrong types."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got {data!r}")
    cls = env_config_class() if cls is EnvConfig else cls
    if cls is Config:
        data = renamed_keys(data)
    hints = _field_types(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in names:
            owners = [
                a for a, c in AGENT_CLASSES.items() if c is not cls and k in {f.name for f in dataclasses.fields(c)}
            ]
            if cls in AGENT_CLASSES.values() and owners:
                raise ConfigError(
                    f"'{prefix}{k}' is a key of the {' and '.join(owners)} agent{'s' if len(owners) > 1 else ''}, "
                    "and this agent is "
                    f"{data.get('algo', 'ppo')} ({prefix}algo). Remove it, or set {prefix}algo to "
                    f"{owners[0]}.\nKeys of the {data.get('algo', 'ppo')} agent:\n{_valid_keys_text(cls, prefix)}"
                )
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f" Did you mean '{prefix}{close[0]}'?" if close else ""
            raise ConfigError(
                f"unknown config key '{prefix}{k}'.{hint}\nValid keys here:\n{_valid_keys_text(cls, prefix)}"
            )
    kwargs = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if tp is PPOConfig:  # the agent section: the class of its algo (PPO unless it says otherwise)
            sub = data.get(f.name)
            tp = agent_class(sub.get("algo", "ppo") if isinstance(sub, dict) else "ppo", prefix + f.name + ".algo")
        if is_section(tp):
            kwargs[f.name] = from_dict(tp, data.get(f.name), prefix + f.name + ".")
        elif f.name in data:
            kwargs[f.name] = coerce(data[f.name], tp, prefix + f.name)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {e}") from None


RENAMED_KEYS = {"population": "members"}  # old top-level key -> today's (job files and stored configs)


def renamed_keys(data: dict[str, Any], warn: bool = True) -> dict[str, Any]:
    """``data`` (a job file's or a stored config's top level) with old key names read as today's
    (:data:`RENAMED_KEYS`); ``warn``: say to rename a key that holds something."""
    data = dict(data)
    for old, new in RENAMED_KEYS.items():
        if old not in data:
            continue
        if new in data:
            raise ConfigError(f"{old}: the old name of {new}; give {new} only")
        value = data.pop(old)
        if value and warn:
            msg = f"{old}: is now {new}: (the mixed pool's per-rank overrides); rename it in the job file"
            warnings.warn(msg, FutureWarning, stacklevel=3)
        data[new] = value
    return data


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain nested dict (YAML/JSON-safe: tuples become lists) of a config."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


# What a file read on its own needs of the run's config (a checkpoint, a leaderboard entry:
# podracer evaluate, export, backtest rebuild the task and the agent from it). The whole config is
# written once per run (config.yaml, and the log's attributes), not into every checkpoint and entry.
AGENT_SECTIONS = ("name", "seed", "env", "agent")


def agent_config(cfg: Config) -> dict[str, Any]:
    """The sections of ``cfg`` that a checkpoint or an entry carries (:data:`AGENT_SECTIONS`)."""
    d = to_dict(cfg)
    return {k: d[k] for k in AGENT_SECTIONS}


def _set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: '{p}' is a value, not a section")
        cur = nxt
    cur[parts[-1]] = value


def parse_overrides(overrides: list[str] | None) -> list[tuple[str, Any]]:
    """Parse ``key=value`` strings (value as YAML)."""
    out = []
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set agent.learning_rate=1e-3")
        k, v = item.split("=", 1)
        k = k.strip()
        if not k:
            raise ConfigError(f"--set {item!r}: empty key")
        try:
            val = loads_yaml(v, source=f"--set {k}") if v.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: value is not valid YAML ({e})") from None
        except RunFileError as e:
            raise ConfigError(str(e)) from None
        out.append((k, val))
    return out


def validate(cfg: Config) -> Config:
    """Check value ranges, the task options included (each section's ``check``, see
    :mod:`podracer_hpc.envs.registry`); raises ConfigError naming the key and the allowed range."""
    from podracer_hpc.envs import registry  # here, not at the top: the task modules import torch

    a, e = cfg.agent, cfg.env

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            raise ConfigError(f"{key}: {msg}")

    def within(value: int, low: int, high: int, key: str, why: str = "") -> None:
        need(low <= value <= high, key, f"must be in [{low:,}, {high:,}]{why}, got {value:,}")

    tasks = registry.names()
    need(e.name in tasks, "env.name", f"unknown task {e.name!r}; known tasks: {', '.join(sorted(tasks))}")
    within(e.num_envs, 1, MAX_NUM_ENVS, "env.num_envs", " (one pod's batch; use more pods for more)")
    within(
        e.max_episode_steps,
        0,
        MAX_EPISODE_STEPS,
        "env.max_episode_steps",
        " (an evaluation steps this long; 0 = the task's default)",
    )
    within(cfg.total_env_steps, 1, MAX_TOTAL_ENV_STEPS, "total_env_steps")
    need(0 <= cfg.seed < 2**31, "seed", f"must be in [0, 2**31), got {cfg.seed}")
    need(cfg.threads >= 0, "threads", f"must be >= 0, got {cfg.threads}")
    dev = cfg.device
    need(
        dev in ("auto", "cpu", "cuda", "cuda:shared") or (dev.startswith("cuda:") and dev[5:].isdigit()),
        "device",
        f"must be auto, cpu, cuda, cuda:N or cuda:shared, got {dev!r}",
    )
    need(
        1 <= len(a.hidden_sizes) <= 16
        and all(isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= MAX_HIDDEN for h in a.hidden_sizes),
        "agent.hidden_sizes",
        f"must be a list of 1 to 16 integers in [1, {MAX_HIDDEN:,}], got {a.hidden_sizes!r}",
    )
    a.validate()  # the agent's own checks; then what depends on the task and the batch
    if a.algo == "ppo":
        batch = a.rollout_steps * e.num_envs
        need(
            batch <= MAX_BATCH,
            "agent.rollout_steps",
            f"rollout_steps x env.num_envs = {batch:,} is more than one update can hold ({MAX_BATCH:,}); lower either",
        )
        need(
            1 <= a.num_minibatches <= batch and batch % a.num_minibatches == 0,
            "agent.num_minibatches",
            f"must divide the batch of rollout_steps x num_envs = {batch}, got {a.num_minibatches}",
        )
        need(
            a.network != "per_asset" or (e.name in tasks and registry.get(e.name).assets),
            "agent.network",
            f"per_asset needs a task whose observation is per asset (stock_trading); {e.name!r} is not: use mlp",
        )
    else:  # sac | td3
        need(
            e.name not in tasks or not registry.get(e.name).discrete,
            "agent.algo",
            f"{a.algo} needs continuous actions; task {e.name!r} has discrete ones: use agent.algo ppo",
        )
        need(
            a.buffer_size >= e.num_envs,
            "agent.buffer_size",
            f"must hold one env step of every environment (env.num_envs = {e.num_envs:,}), got {a.buffer_size:,}",
        )
        need(a.batch_size <= MAX_BATCH, "agent.batch_size", f"must be <= {MAX_BATCH:,}, got {a.batch_size:,}")
    within(cfg.eval.episodes, 1, MAX_EVAL_EPISODES, "eval.episodes")
    within(cfg.eval.final_episodes, 0, MAX_EVAL_EPISODES, "eval.final_episodes")
    need(cfg.eval.interval_env_steps >= 0, "eval.interval_env_steps", "must be >= 0")
    target = cfg.eval.stop_at_return
    need(
        target is None or (isinstance(target, (int, float)) and not isinstance(target, bool) and math.isfinite(target)),
        "eval.stop_at_return",
        f"must be a mean return (a number) or null, got {target!r}",
    )
    need(cfg.log.progress_interval_s >= 0, "log.progress_interval_s", "must be >= 0")
    need(cfg.log.checkpoint_interval_s >= 0, "log.checkpoint_interval_s", "must be >= 0")
    need(cfg.log.aggregate_interval_s > 0, "log.aggregate_interval_s", "must be > 0 seconds")
    need(
        cfg.log.round_checkpoints in ROUND_CHECKPOINTS,
        "log.round_checkpoints",
        f"must be one of {' | '.join(ROUND_CHECKPOINTS)}",
    )
    for section, options in registry.sections().items():  # every section: a typo in another task's too
        values = getattr(e, section, None)
        need(
            isinstance(values, options),
            f"env.{section}",
            f"expected the {options.__name__} settings, got {type(values).__name__} (build env with EnvConfig(...))",
        )
        try:
            registry.check(values)
        except registry.OptionError as err:
            raise ConfigError(f"env.{section}.{err.key}: {err.why}") from None
    registry.verify(e, a.algo)  # the chosen task's checks that need its env (gymnasium's: make it once)
    members = [member_config(cfg, i) for i in range(len(cfg.members))] or [cfg]  # each validated
    if cfg.tournament.mode != "none":  # refused, not rounded up: the user's cadence is the run's record
        batch = max(m.env.num_envs * m.agent.rollout_steps for m in members)
        need(
            cfg.tournament.interval_env_steps >= batch,
            "tournament.interval_env_steps",
            f"must be at least one update's env steps (env.num_envs x agent.rollout_steps = {batch:,}), got "
            f"{cfg.tournament.interval_env_steps:,}: rounds would follow each other with no training between "
            f"them; set it to {batch:,} or more",
        )
    algos = sorted({m.agent.algo for m in members})
    allowed = [k for algo in algos for k in MUTABLE_BY_ALGO[algo]]
    space = set(cfg.tournament.hparam_space)
    bad = sorted(space - set(allowed))
    need(
        not bad,
        "tournament.hparam_space",
        f"unknown hyperparameters {bad} for the {' and '.join(algos)} "
        f"agents of this run; allowed: {', '.join(allowed)}",
    )
    for m in members:  # e.g. SAC's alpha is learned state with agent.autotune
        fixed = sorted((space & set(MUTABLE_BY_ALGO[m.agent.algo])) - set(mutable_hparams(m.agent)))
        need(
            not fixed,
            "tournament.hparam_space",
            f"{fixed} cannot change while this {m.agent.algo} agent trains "
            f"(its mutable ones: {', '.join(mutable_hparams(m.agent))})",
        )
    return cfg


# ------------------------------------------------------------------------------------------
# The agent section: its class is chosen by agent.algo; mixed pools (members)
# ------------------------------------------------------------------------------------------
AGENT_CLASSES: dict[str, type] = {"ppo": PPOConfig, "sac": SACConfig, "td3": TD3Config}
MEMBER_KEYS = ("agent.*", "env.num_envs")  # what a member of a mixed pool may set


def agent_class(algo: Any, key: str = "agent.algo") -> type:
    """The settings class of learner ``algo``; ConfigError naming ``key`` for another value."""
    if not isinstance(algo, str) or algo not in AGENT_CLASSES:
        raise ConfigError(f"{key}: must be one of {' | '.join(ALGOS)}, got {algo!r}")
    return AGENT_CLASSES[algo]


def member_config(cfg: Config, index: int) -> Config:
    """The config of the pods that take ``members[index]`` (ranks ``index``, ``index + len``,
    ...): the entry's ``agent.*``/``env.num_envs`` overrides on the job's settings, validated,
    with no members. An entry that sets another ``agent.algo`` than the job's starts
    from that learner's defaults (PPO's keys would not fit SAC). ConfigError names the entry."""
    where = f"members[{index}]"
    entry = cfg.members[index]
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping of overrides such as {{agent.algo: sac}}, got {entry!r}")
    over: dict[str, Any] = {}
    for k, v in entry.items():
        try:
            _set_dotted(over, str(k), json.loads(json.dumps(v, default=str)))
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    extra = sorted(set(over) - {"agent", "env"}) + [
        f"env.{k}" for k in sorted(set(over.get("env") or {}) - {"num_envs"})
    ]
    if extra or not isinstance(over.get("agent", {}), dict):
        raise ConfigError(
            f"{where}: a member sets {' and '.join(MEMBER_KEYS)} only (every pod shares "
            f"the rest of the run), got {', '.join(extra) or 'agent: ' + repr(over['agent'])}"
        )
    data = to_dict(cfg)
    data["members"] = []
    agent = over.get("agent") or {}
    if "algo" in agent and agent["algo"] != data["agent"]["algo"]:
        data["agent"] = {}
    data["agent"].update(agent)
    if "num_envs" in (over.get("env") or {}):
        data["env"]["num_envs"] = over["env"]["num_envs"]
    try:
        return validate(from_dict(Config, data))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def for_rank(cfg: Config, rank: int) -> Config:
    """The config of rank ``rank``'s pod: ``cfg`` itself, or its member ``rank mod len``."""
    return member_config(cfg, rank % len(cfg.members)) if cfg.members else cfg


def job_file(path: str | os.PathLike) -> Path:
    """The job file a path names: as given, else (``jobs/<name>.yaml``) the copy podracer-hpc ships
    (shipped.py: an installed wheel has no checkout to look in)."""
    from podracer_hpc.files.shipped import find

    p = Path(path)
    return p if p.exists() else (find(p) or p)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> Config:
    """Load a job file (or the defaults), apply ``key=value`` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        p = job_file(path)
        if not p.exists() or p.is_dir():  # a FIFO or a device is refused by read_yaml, saying what it is
            raise ConfigError(f"job file {str(path)!r} not found (jobs live in jobs/*.yaml)")
        try:  # a regular file of at most MAX_YAML_BYTES, its aliases expanded to MAX_YAML_NODES nodes at most
            data = read_yaml(p, what="job file") or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        except RunFileError as e:
            raise ConfigError(str(e)) from None
        except OSError as e:
            raise ConfigError(f"{p}: cannot read the job file ({e.strerror})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of keys, got {type(data).__name__}")
        data.setdefault("name", p.stem)
    for k, v in parse_overrides(overrides):
        _set_dotted(data, k, v)
    cfg = from_dict(Config, data)
    if not cfg.name:
        cfg.name = cfg.env.name
    return validate(cfg)
