"""RLlib PPO baseline: train RLlib's PPO on a gymnasium task and write podracer's HDF5 log schema.

    python -m baselines.rllib.train jobs/rllib/pendulum.yaml --run-dir runs/rllib-pendulum \
        [--set key=value ...] [--stop-at-return -250] [--quiet]

Runs in its own environment (``.venv-rllib``: ray[rllib]==2.58.0, see baselines/rllib/README.md).
The run directory gets what ``podracer train`` writes, so ``analysis`` treats it as one more
system: ``config.yaml``, ``logs/<name>_rank0.h5`` (schema version 1, ``/train`` one row per
RLlib training iteration, ``/eval`` one row per evaluation; root attribute ``system='rllib'``)
and ``summary.json`` (also printed as the last line of stdout).

Evaluation protocol (same as a pod): every ``eval.interval_env_steps`` and at the end,
``eval.episodes`` episodes of the deterministic policy (the mode of the action distribution)
from fixed start states (gymnasium ``reset(seed=seed + 1_000_003 + i)`` for episode i).
``wall_s`` in the log is seconds since the algorithm was built (Ray start-up and the build are
excluded, as a pod's start-up is; evaluation included); ``startup_s`` is in the summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from podracer_hpc.files.h5log import H5Writer
from podracer_hpc.files.rundir import git_revision

TASKS = {
    "pendulum": "Pendulum-v1",
    "cartpole": "CartPole-v1",
    # podracer's own env through gymnasium's interface (baselines/rllib/trading_env.py)
    "stock_trading": "podracer-stock_trading",
}
EVAL_SEED_OFFSET = 1_000_003  # as podracer_hpc.pod: eval start states come from their own seeds

DEFAULTS: dict[str, Any] = {
    "name": "",
    "task": "pendulum",
    "seed": 0,
    "total_env_steps": 1_000_000,
    "eval": {"interval_env_steps": 100_000, "episodes": 20},
    "rllib": {"env_runners": {}, "learners": {}, "training": {}, "model": {}, "normalize_obs": False},
    "ray": {"address": None, "num_cpus": None},
    # task stock_trading: the env.trading keys of a podracer job (the same market and rules), and
    # the episode length (a pod's env.max_episode_steps)
    "trading": {},
    "max_episode_steps": 252,
    # A resource point of a scaling study (podracer_hpc/tools/study), in pods-equivalent: see
    # apply_resources. pods null: the rllib block is used as written (one learner).
    "resources": {
        "pods": None,
        "gpus_per_pod": 0,
        "cpus": None,
        "nodes": 1,
        "env_runners_per_pod": 2,
        "envs_per_pod": None,
        "lr_scaling": "sqrt",
    },
}


class ConfigError(ValueError):
    pass


def _merge(base: dict[str, Any], over: dict[str, Any], path: str = "") -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if path == "" and k not in base:
            raise ConfigError(f"unknown key {k!r}; known: {', '.join(base)}")
        if isinstance(out.get(k), dict) and isinstance(v, dict):
            out[k] = _merge(out[k], v, f"{path}{k}.")
        else:
            out[k] = v
    return out


def _set(cfg: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    d = cfg
    for k in keys[:-1]:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            raise ConfigError(f"--set {dotted}: {k} is not a section")
    d[keys[-1]] = value


def load_config(path: str | Path, sets: list[str] = ()) -> dict[str, Any]:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    for s in sets:
        if "=" not in s:
            raise ConfigError(f"--set {s!r}: expected key=value")
        k, v = s.split("=", 1)
        _set(raw, k.strip(), yaml.safe_load(v))
    cfg = _merge(DEFAULTS, raw)
    if cfg["task"] not in TASKS:
        raise ConfigError(f"task {cfg['task']!r}: one of {', '.join(TASKS)}")
    if int(cfg["total_env_steps"]) <= 0 or int(cfg["eval"]["episodes"]) <= 0:
        raise ConfigError("total_env_steps and eval.episodes must be positive")
    cfg["name"] = cfg["name"] or Path(path).stem
    apply_resources(cfg)
    # What analysis.aggregate reads from a config: the task (env.name), envs per pod, pool mode.
    runners = cfg["rllib"]["env_runners"]
    n_envs = max(1, int(runners.get("num_env_runners", 2) or 0)) * int(runners.get("num_envs_per_env_runner", 1))
    pods = int(cfg["resources"]["pods"] or 1)
    cfg["env"] = {
        "name": cfg["task"],
        "gym_id": TASKS[cfg["task"]],
        "num_envs": max(1, n_envs // pods),
        "num_envs_total": n_envs,
    }
    if cfg["task"] == "stock_trading":
        cfg["env"].update(
            trading=trading_options(cfg["trading"], Path(path).parent), max_episode_steps=int(cfg["max_episode_steps"])
        )
    cfg["tournament"] = {"mode": "none"}
    cfg["system"] = "rllib"
    return cfg


def trading_options(trading: dict[str, Any], job_dir: Path) -> dict[str, Any]:
    """The env.trading settings, checked by podracer's TradingOptions, with a data file's path made
    absolute (Ray's env runners may start elsewhere): relative to the working directory when it
    exists there (as ``podracer train`` reads it), else to the job file."""
    from podracer_hpc.envs.registry import as_kwargs, options_from
    from podracer_hpc.trading.task import TradingOptions

    try:
        opts = as_kwargs(options_from(TradingOptions, dict(trading or {}), "trading"))
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    data = str(opts.get("data") or "")
    if data and not data.startswith("pkg:") and not Path(data).is_absolute():
        here = Path(data).resolve()
        opts["data"] = str(here if here.exists() else (job_dir / data).resolve())
    return opts


def apply_resources(cfg: dict[str, Any]) -> None:
    """Set RLlib's scale from the resource point ``cfg["resources"]`` (in place), as a study does
    for both systems from the same point (baselines/rllib/README.md, "Matched resources").

    With ``resources.pods = P`` (P pods-equivalent: the P GPUs, or P CPU processes, that podracer
    would run P pods on):

    - learners: ``num_learners = P`` (``0`` for P = 1: RLlib's local learner in the driver, its
      recommended single-learner set-up), ``num_gpus_per_learner = resources.gpus_per_pod``;
    - env runners: ``P x resources.env_runners_per_pod``, each stepping
      ``resources.envs_per_pod / env_runners_per_pod`` environments when ``envs_per_pod`` is set
      (the same envs per step per pod as podracer's ``env.num_envs``);
    - ``train_batch_size_per_learner`` unchanged (each learner's batch is fixed, as each pod's
      rollout is), ``lr`` times ``sqrt(P)`` (``lr_scaling: sqrt``, the rule of RLlib's own tuned
      Pendulum example, ``0.0002 * num_learners ** 0.5``) or unchanged (``none``).
    - CPU requests: with ``resources.cpus`` set and fewer cores than CPU actors (remote
      learners without a GPU + env runners), each asks for ``cpus / actors`` of a CPU, so that all
      fit the allocation (Ray would otherwise leave them pending forever) and share its cores.

    Keys of ``rllib.learners`` or ``rllib.env_runners`` written in the job file win over these.
    """
    res = cfg["resources"]
    pods = res.get("pods")
    if pods is None:
        return
    pods, g = int(pods), float(res.get("gpus_per_pod") or 0)
    per = int(res.get("env_runners_per_pod") or 1)
    if pods < 1 or per < 1 or g < 0:
        raise ConfigError(f"resources: pods and env_runners_per_pod must be >= 1 and gpus_per_pod >= 0, got {res}")
    if res.get("lr_scaling", "sqrt") not in ("sqrt", "none"):
        raise ConfigError(f"resources.lr_scaling: sqrt or none, got {res.get('lr_scaling')!r}")
    if int(res.get("nodes") or 1) < 1:
        raise ConfigError(f"resources.nodes must be >= 1, got {res.get('nodes')}")
    r = cfg["rllib"]
    learners = {"num_learners": 0 if pods == 1 else pods, "num_gpus_per_learner": g}
    r["learners"] = {**learners, **(r.get("learners") or {})}
    runners = {"num_env_runners": pods * per}
    if res.get("envs_per_pod"):
        envs = int(res["envs_per_pod"])
        if envs % per:
            raise ConfigError(f"resources.envs_per_pod {envs} is not a multiple of env_runners_per_pod {per}")
        runners["num_envs_per_env_runner"] = envs // per
    r["env_runners"] = {**(r.get("env_runners") or {}), **runners}
    if res.get("lr_scaling", "sqrt") == "sqrt" and "lr" in r.get("training", {}) and pods > 1:
        r["training"] = {**r["training"], "lr": float(r["training"]["lr"]) * pods**0.5}
    # Ray places an actor only where its CPU request fits. The allocation has resources.cpus cores
    # for P remote learners (none for P = 1: the local learner is the driver) and P x per env
    # runners: when they are more than the cores, each asks for its share, so that they all fit
    # and time-share the cores (as P pods on fewer cores do); GPU learners ask for no CPU.
    if res.get("cpus"):
        learners_cpu = pods if pods > 1 and not g else 0
        actors = learners_cpu + pods * per
        share = min(1.0, float(res["cpus"]) / actors) if actors else 1.0
        if share < 1.0:
            r["env_runners"] = {"num_cpus_per_env_runner": share, **r["env_runners"]}
            if learners_cpu:
                r["learners"] = {"num_cpus_per_learner": share, **r["learners"]}


def resources_used(cfg: dict[str, Any], ray_nodes: int, ray_cpus: float) -> dict[str, Any]:
    """What the run had, for the log's ``resources`` attribute and analysis's x axis: ``pods``
    (pods-equivalent: learners, at least 1), ``gpus``, ``cpus`` (cores of the allocation:
    ``resources.cpus``, else Slurm's, else this machine's), ``nodes`` (Ray nodes alive), and the
    RLlib settings they became."""
    res, r = cfg["resources"], cfg["rllib"]
    learners = r.get("learners") or {}
    pods = int(res.get("pods") or max(1, int(learners.get("num_learners", 0) or 0)))
    gpus = float(learners.get("num_gpus_per_learner", 0) or 0) * max(1, int(learners.get("num_learners", 0) or 0))
    cpus = res.get("cpus")
    if cpus is None and os.environ.get("SLURM_CPUS_PER_TASK"):
        cpus = int(os.environ["SLURM_CPUS_PER_TASK"]) * int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    runners = r.get("env_runners") or {}
    return {
        "pods": pods,
        "gpus": gpus,
        "cpus": int(cpus if cpus is not None else (os.cpu_count() or 1)),
        "nodes": int(ray_nodes),
        "ray_cpus": float(ray_cpus),
        "num_learners": int(learners.get("num_learners", 0) or 0),
        "num_gpus_per_learner": float(learners.get("num_gpus_per_learner", 0) or 0),
        "num_env_runners": int(runners.get("num_env_runners", 2)),
        "envs_per_step": int(cfg["env"]["num_envs_total"]),
    }


def build_algo(cfg: dict[str, Any]):
    from ray.rllib.algorithms.ppo import PPOConfig

    r = cfg["rllib"]
    env, env_config = env_spec(cfg)
    pc = (
        PPOConfig()
        .environment(env, env_config=env_config)
        .env_runners(**r["env_runners"])
        .training(**r["training"])
        .debugging(seed=int(cfg["seed"]))
    )
    if r.get("learners"):
        pc = pc.learners(**r["learners"])
    if r.get("model"):
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        pc = pc.rl_module(model_config=DefaultModelConfig(**r["model"]))
    if r.get("normalize_obs"):
        from ray.rllib.connectors.env_to_module import MeanStdFilter

        pc = pc.env_runners(env_to_module_connector=lambda *a, **k: MeanStdFilter())
    return pc, pc.build_algo()


def env_spec(cfg: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(env, env_config) of the run's task for RLlib: a gymnasium id, or podracer's trading env class."""
    if cfg["task"] == "stock_trading":
        from baselines.rllib.trading_env import TradingGymEnv

        return TradingGymEnv, {
            "trading": cfg["env"]["trading"],
            "max_episode_steps": cfg["env"]["max_episode_steps"],
            "seed": int(cfg["seed"]),
        }
    return TASKS[cfg["task"]], {}


def make_env(cfg: dict[str, Any]) -> Any:
    """One env of the run's task, for evaluation in the driver."""
    env, env_config = env_spec(cfg)
    if isinstance(env, str):
        import gymnasium as gym

        return gym.make(env)
    return env(env_config)


def _get(d: dict[str, Any], *path: str, default: float = math.nan) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return default
        d = d[p]
    return d


def _f(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


class Evaluator:
    """Deterministic episodes from fixed start states, in lockstep, with the learner's RLModule."""

    def __init__(self, cfg: dict[str, Any], pc: Any):
        self.gym_id = TASKS[cfg["task"]]
        self.n = int(cfg["eval"]["episodes"])
        self.seed = int(cfg["seed"]) + EVAL_SEED_OFFSET
        self.envs = [make_env(cfg) for _ in range(self.n)]
        self.space = self.envs[0].action_space
        self.normalize_actions = bool(getattr(pc, "normalize_actions", False))
        self.clip_actions = bool(getattr(pc, "clip_actions", False))
        self.normalize_obs = bool(cfg["rllib"].get("normalize_obs"))

    def _obs_filter(self, algo: Any):
        """A copy of the env runners' MeanStdFilter (RLlib keeps them in sync), or None."""
        if not self.normalize_obs:
            return None

        def grab(runner: Any) -> Any:
            for c in getattr(runner._env_to_module, "connectors", []):
                if type(c).__name__ == "MeanStdFilter" and getattr(c, "_filters", None):
                    return next(iter(c._filters.values()))
            return None

        group = algo.env_runner_group
        found = [f for f in group.foreach_env_runner(grab, local_env_runner=False) if f is not None]
        if not found and getattr(group, "local_env_runner", None) is not None:
            found = [grab(group.local_env_runner)]
        if not found or found[0] is None:
            raise RuntimeError("rllib.normalize_obs is set but no MeanStdFilter was found on the env runners")
        return found[0]

    def __call__(self, algo: Any) -> np.ndarray:
        import torch
        from ray.rllib.core.columns import Columns

        module = algo.get_module()
        dist_cls = module.get_inference_action_dist_cls()
        filt = self._obs_filter(algo)
        obs = np.stack([e.reset(seed=self.seed + i)[0] for i, e in enumerate(self.envs)]).astype(np.float32)
        returns = np.zeros(self.n)
        running = np.ones(self.n, dtype=bool)
        while running.any():
            x = obs if filt is None else np.stack([filt(o, update=False) for o in obs])
            with torch.no_grad():
                out = module.forward_inference({Columns.OBS: torch.as_tensor(np.asarray(x, np.float32))})
            dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS]).to_deterministic()
            act = dist.sample().cpu().numpy()
            for i, e in enumerate(self.envs):
                if not running[i]:
                    continue
                a = act[i]
                if not np.issubdtype(np.asarray(a).dtype, np.integer) and hasattr(self.space, "low"):
                    if self.normalize_actions:
                        a = self.space.low + (np.clip(a, -1.0, 1.0) + 1.0) * (self.space.high - self.space.low) / 2.0
                    elif self.clip_actions:
                        a = np.clip(a, self.space.low, self.space.high)
                else:
                    a = int(a)
                o, rew, term, trunc, _ = e.step(a)
                returns[i] += rew
                obs[i] = o
                if term or trunc:
                    running[i] = False
        return returns


def export_policy(algo: Any, evaluate: Evaluator, cfg: dict[str, Any], path: Path) -> Path:
    """Write the learner's deterministic policy as a self-contained TorchScript file that
    ``podracer backtest`` reads (podracer_hpc/tools/backtest.py, ``load_policy``): observations
    in, the action distribution's mean out, the env runners' observation filter (MeanStdFilter)
    baked in; beside it, as the extra file ``podracer.json``, the run's config in podracer's shape
    (task, env.trading settings) and the tickers, in order."""
    import torch
    from ray.rllib.core.columns import Columns

    module = algo.get_module()
    filt = evaluate._obs_filter(algo)
    env = evaluate.envs[0]
    obs_dim, act_dim = int(env.observation_space.shape[0]), int(env.action_space.shape[0])
    if filt is not None:
        rs = filt.running_stats
        mean = torch.as_tensor(np.asarray(rs.mean, np.float32)) if filt.demean else torch.zeros(obs_dim)
        scale = torch.as_tensor(1.0 / (np.asarray(rs.std, np.float32) + 1e-8)) if filt.destd else torch.ones(obs_dim)
        clip = float(filt.clip or 0.0)
    else:
        mean, scale, clip = torch.zeros(obs_dim), torch.ones(obs_dim), 0.0

    class Deterministic(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = module
            self.register_buffer("mean", mean)
            self.register_buffer("scale", scale)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            x = (obs - self.mean) * self.scale
            if clip > 0:
                x = x.clamp(-clip, clip)
            out = self.module.forward_inference({Columns.OBS: x})
            return out[Columns.ACTION_DIST_INPUTS][..., :act_dim]  # the Gaussian's mean

    meta = {
        "kind": "exported-policy",
        "system": "rllib",
        "obs_dim": obs_dim,
        "act_dim": act_dim,
        "tickers": list(getattr(env, "tickers", []) or []),
        "config": {
            "env": {
                "name": cfg["task"],
                "trading": cfg["env"].get("trading") or {},
                "max_episode_steps": cfg["env"].get("max_episode_steps"),
                "num_envs": 1,
            }
        },
    }
    with torch.no_grad():
        traced = torch.jit.trace(Deterministic().eval(), torch.zeros(2, obs_dim), check_trace=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.jit.save(traced, str(tmp), _extra_files={"podracer.json": json.dumps(meta)})
    os.replace(tmp, path)
    return path


def trainable_parameters(pc: Any, algo: Any) -> int:
    """Trainable parameters of the learner's module (the driver's own module is the inference-only
    policy, without the value function), built from the config's module spec; -1 if unknown."""
    try:
        spec = pc.get_multi_rl_module_spec(spaces=algo.env_runner_group.get_spaces(), inference_only=False)
        module = spec.build()["default_policy"]
        return int(sum(p.numel() for p in module.parameters() if p.requires_grad))
    except Exception:  # noqa: BLE001 - a count for the report, never a reason to stop training
        return -1


def grad_steps(learner: dict[str, Any], learners: int) -> int:
    """Gradient steps of one learner in an iteration: the samples all learners trained on (RLlib
    sums them) over the minibatch size over the learners (0 learners: one local); -1 if unknown."""
    trained, minibatch = (
        _f(_get(learner, "num_module_steps_trained")),
        _f(_get(learner, "module_train_batch_size_mean")),
    )
    if not (math.isfinite(trained) and math.isfinite(minibatch) and minibatch > 0):
        return -1
    return round(trained / minibatch / max(1, learners))


def train(
    cfg: dict[str, Any],
    run_dir: Path,
    stop_at_return: float | None = None,
    quiet: bool = False,
    max_wall_s: float | None = None,
) -> dict[str, Any]:
    import ray
    import torch

    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    address = cfg["ray"].get("address") or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=not quiet)
    else:
        runners, learners = cfg["rllib"]["env_runners"], cfg["rllib"].get("learners") or {}
        need = int(runners.get("num_env_runners", 2)) + int(learners.get("num_learners", 0) or 0) + 1
        ray.init(
            num_cpus=int(cfg["ray"].get("num_cpus") or max(os.cpu_count() or 1, need)),
            include_dashboard=False,
            log_to_driver=not quiet,
        )
    pc, algo = build_algo(cfg)
    evaluate = Evaluator(cfg, pc)
    params = trainable_parameters(pc, algo)
    startup_s = time.perf_counter() - t0
    resources = resources_used(
        cfg, sum(bool(n.get("Alive")) for n in ray.nodes()), ray.cluster_resources().get("CPU", 0.0)
    )
    say(
        f"rllib {ray.__version__}: {TASKS[cfg['task']]}, start-up {startup_s:.1f} s, {resources['pods']} "
        "pod(s)-equivalent: "
        f"{resources['num_learners']} learner(s) x {resources['num_gpus_per_learner']:g} GPU, "
        f"{resources['num_env_runners']} env runners, {resources['envs_per_step']} envs per step, "
        f"{resources['nodes']} node(s), {resources['cpus']} CPUs"
    )
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    attrs = {
        "config": cfg,
        "system": "rllib",
        "git_revision": git_revision(),
        "host": socket.gethostname(),
        "device": platform.processor() or "cpu",
        "device_type": "cpu",
        "versions": {"ray": ray.__version__, "torch": torch.__version__, "python": platform.python_version()},
        "seed": int(cfg["seed"]),
        "rank": 0,
        # The pods-equivalent of the run (its learners): analysis puts it on the same x axis as
        # podracer's MPI world size. "resources" says what that was made of.
        "world_size": resources["pods"],
        "pods": resources["pods"],
        "resources": resources,
        "slurm": {
            k: v
            for k, v in os.environ.items()
            if k.startswith("SLURM_")
            and k
            in (
                "SLURM_JOB_ID",
                "SLURM_ARRAY_JOB_ID",
                "SLURM_ARRAY_TASK_ID",
                "SLURM_STEP_ID",
                "SLURM_PROCID",
                "SLURM_NODEID",
                "SLURM_JOB_NODELIST",
                "SLURM_RESTART_COUNT",
            )
        },
        "comm": "ray",
        "ray_nodes": resources["nodes"],
        "startup_s": startup_s,
        "created": time.time(),
        # the learner's module (policy and value function): what a data-parallel all-reduce moves
        "param_count": params,
    }
    total = int(cfg["total_env_steps"])
    every = int(cfg["eval"]["interval_env_steps"]) or total
    next_eval, best, last, env_steps, it = every, -math.inf, math.nan, 0, 0
    reached = timed_out = False
    log = H5Writer(run_dir / "logs" / f"{cfg['name']}_rank0.h5", attrs)
    t_train = time.perf_counter()
    wall = lambda: time.perf_counter() - t_train  # noqa: E731
    try:
        while env_steps < total and not reached and not timed_out:
            t_it = time.perf_counter()
            res = algo.train()
            it += 1
            prev = env_steps
            env_steps = int(
                _get(res, "env_runners", "num_env_steps_sampled_lifetime", default=0)
                or _get(res, "num_env_steps_sampled_lifetime", default=0)
            )
            lrn = _get(res, "learners", "default_policy", default={})
            row = {
                "update": it,
                "env_steps": env_steps,
                "wall_s": wall(),
                "steps_per_s": (env_steps - prev) / max(time.perf_counter() - t_it, 1e-9),
                "return_mean": _f(_get(res, "env_runners", "episode_return_mean")),
                "episodes": int(
                    _f(_get(res, "env_runners", "num_episodes", default=-1))
                    if math.isfinite(_f(_get(res, "env_runners", "num_episodes", default=-1)))
                    else -1
                ),
                "loss": _f(_get(lrn, "total_loss")),
                "policy_loss": _f(_get(lrn, "policy_loss")),
                "value_loss": _f(_get(lrn, "vf_loss")),
                "entropy": _f(_get(lrn, "entropy")),
                "approx_kl": _f(_get(lrn, "mean_kl_loss")),
                "explained_variance": _f(_get(lrn, "vf_explained_var")),
                "learning_rate": _f(_get(lrn, "default_optimizer_learning_rate")),
                "grad_steps": grad_steps(lrn, int(resources["num_learners"])),
            }
            log.append("train", row)
            timed_out = max_wall_s is not None and wall() >= max_wall_s
            if env_steps >= next_eval or env_steps >= total or timed_out:
                rets = evaluate(algo)
                last = float(rets.mean())
                best = max(best, last)
                log.append(
                    "eval",
                    {
                        "update": it,
                        "env_steps": env_steps,
                        "wall_s": wall(),
                        "return_mean": last,
                        "return_std": float(rets.std()),
                        "return_min": float(rets.min()),
                        "return_max": float(rets.max()),
                        "episodes": len(rets),
                    },
                    flush=True,
                )
                say(f"{env_steps:>9,} env steps  {wall():7.1f} s  eval {last:8.1f}  train {row['return_mean']:8.1f}")
                while next_eval <= env_steps:
                    next_eval += every
                reached = stop_at_return is not None and last >= stop_at_return
        wall_s = wall()
        if cfg["task"] == "stock_trading":
            policy = export_policy(algo, evaluate, cfg, run_dir / "checkpoints" / "policy.pt")
            say(f"policy: {policy} (podracer backtest {policy})")
    finally:
        log.close()
        algo.stop()
        ray.shutdown()
    summary = {
        "system": "rllib",
        "task": cfg["task"],
        "pods": resources["pods"],
        "resources": resources,
        "env_steps": env_steps,
        "wall_s": round(wall_s, 3),
        "steps_per_s": round(env_steps / max(wall_s, 1e-9), 1),
        "best_return": best,
        "final_return": last if math.isfinite(last) else None,
        "startup_s": round(startup_s, 3),
        "iterations": it,
    }
    if env_steps < total and not reached:
        summary["complete"] = False
    if stop_at_return is not None:
        summary["stopped_at_return"] = reached
    if timed_out:
        summary["stopped_at_wall_s"] = True
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m baselines.rllib.train", description=__doc__.split("\n")[0])
    p.add_argument("job", help="job file (jobs/rllib_*.yaml)")
    p.add_argument("--run-dir", default=None, help="where the log and summary go (default runs/<name>)")
    p.add_argument("--set", dest="sets", action="append", default=[], help="override a dotted key: key=value (YAML)")
    p.add_argument(
        "--stop-at-return",
        type=float,
        default=None,
        help="stop at the first evaluation whose mean return is at least this",
    )
    p.add_argument(
        "--max-wall-s",
        type=float,
        default=None,
        help="stop (after a last evaluation) once training has run this many seconds",
    )
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.job, args.sets)
    except (ConfigError, OSError, yaml.YAMLError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or Path("runs") / cfg["name"])
    summary = train(cfg, run_dir, args.stop_at_return, args.quiet, args.max_wall_s)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
