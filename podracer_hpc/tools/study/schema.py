"""A study file: its keys as config dataclasses (one-line docs, did-you-mean errors: config.py's
machinery), resolved into a :class:`Study` of systems and points."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from podracer_hpc.config import describe, from_dict, parse_overrides, to_dict
from podracer_hpc.docfield import ConfigError, F
from podracer_hpc.files import shipped
from podracer_hpc.files.bounded import read_yaml
from podracer_hpc.report.aggregate import METRICS, DeviceModel  # what a target is a value of; device time

__all__ = [
    "KINDS",
    "METRICS",
    "SCHEMES",
    "Point",
    "Study",
    "StudyConfig",
    "StudyError",
    "System",
    "SystemConfig",
    "keys_text",
    "load_study",
]

ROOT = shipped.root()  # jobs/, baselines/, slurm_templates/: a checkout's, or the wheel's copy
KINDS = ("podracer", "rllib")
# What a podracer system's pods are (docs/studies.md): pool (the job's tournament as set), best_of_n
# (independent pods: tournament.mode none), random_search (independent pods from a PBT pool's start:
# pod 0 the job's values, the others their own draws from the prior a PBT run declares),
# data_parallel (one learner with pods x the envs).
SCHEMES = ("pool", "best_of_n", "random_search", "data_parallel")
# how a learner of several devices scales its job's learning rate (systems.<name>.lr_scaling)
LR_SCALINGS = ("none", "sqrt")


class StudyError(ValueError):
    """A study file or request that cannot be right; nothing was run or queued."""


def _ints(v: Any, key: str, minimum: int) -> list[int]:
    """A non-empty list of distinct integers >= minimum (a single integer is a list of one)."""
    v = [v] if isinstance(v, int) and not isinstance(v, bool) else v
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ValueError(f"{key} must be a non-empty list of integers, got {v!r}")
    if any(x < minimum for x in v):
        raise ValueError(f"{key} must be >= {minimum}, got {v!r}")
    if len(set(v)) != len(v):
        raise ValueError(f"{key} has duplicates: {v!r}")
    return sorted(v) if key == "points" else list(v)


@dataclass
class ResourcesConfig:
    gpus_per_pod: float = F(
        0.0,
        "GPUs per pod (and per RLlib learner); 0 on CPU; below 1: pods share GPUs, a point "
        "uses ceil(pods x gpus_per_pod) of them (local executor only)",
    )
    cpus_per_pod: int = F(1, "CPU cores per pod in the allocation (RLlib's env runners run on them)")
    pods_per_node: int = F(8, "pods per node: a point of P pods asks for ceil(P / pods_per_node) nodes")

    def __post_init__(self) -> None:
        if self.gpus_per_pod < 0 or (self.gpus_per_pod > 1 and self.gpus_per_pod != int(self.gpus_per_pod)):
            raise ValueError(f"gpus_per_pod must be >= 0 and whole above 1, got {self.gpus_per_pod:g}")
        if self.cpus_per_pod < 1 or self.pods_per_node < 1:
            raise ValueError("cpus_per_pod and pods_per_node must be >= 1")


@dataclass
class SlurmConfig:
    partition: str = F("", "Slurm partition (default: the cluster's default)")
    account: str = F("", "Slurm account")
    time_min: int = F(30, "time limit of each point's job, minutes")
    mpi: str = F("pmi2", "srun --mpi plugin for podracer's ranks: pmi2 (mpich) or pmix (Open MPI)")
    serial: bool = F(
        False,
        "run the points one at a time (this command waits for each): timings on a one-host test "
        "cluster; false on a real cluster (all jobs queued at once)",
    )

    def __post_init__(self) -> None:
        if self.mpi not in ("pmi2", "pmix", "none"):
            raise ValueError(f"mpi must be pmi2, pmix or none, got {self.mpi!r}")
        if self.time_min < 1:
            raise ValueError(f"time_min must be a whole number of minutes >= 1, got {self.time_min!r}")


@dataclass
class SystemConfig:
    kind: str = F("", "podracer or rllib (default: the system's name)")
    job: str = F("", "the system's job file (jobs/*.yaml or jobs/rllib/*.yaml); required")
    set: list = F([], "KEY=VALUE overrides of the job file, for every point")
    seeds: list = F([], "this system's seeds (default: the study's), e.g. fewer for a costly peer")
    points: list = F([], "this system's points (default: the study's)")
    gpus_per_pod: float = F(
        -1.0,
        "this system's GPUs per pod (default -1: resources.gpus_per_pod), e.g. 1 for "
        "RLlib's GPU learner while the pods share one GPU",
    )
    python: str = F("", "rllib: the interpreter with ray[rllib] (default <repo>/.venv-rllib/bin/python)")
    stop_at_target: bool = F(
        True,
        "metric return: end a run at the first evaluation at or above the target (podracer: every pod "
        "once it has trained as far, eval.stop_at_return; its time to target is the same); false: train "
        "the whole budget (the pool's returns after the target)",
    )
    max_wall_s: float = F(
        0.0,
        "rllib: stop after this many training seconds (0: no bound; a run that stops there "
        "is done: 'not reached' with that bound)",
    )
    timeout_s: float = F(3600.0, "local executor: give up on one run after this many seconds")
    scheme: str = F(
        "pool",
        "podracer: pool (the job's tournament) | best_of_n (independent pods) | random_search (independent "
        "pods starting where a PBT pool would: pod 0 the job's values, the others each its own draw from "
        "tournament.hparam_space, seeded by its seed) | "
        "data_parallel (one learner with pods x env.num_envs; docs/studies.md)",
    )
    device_step_s: float = F(
        0.0, "seconds per env step of one of this system's pods on its device (0: the study's device_step_s)"
    )
    devices_per_pod: int = F(
        1,
        "podracer: devices of one pod (a pod of several devices: one learner with this many x "
        "env.num_envs, data-parallel within the pod); a point of N devices runs N / devices_per_pod pods "
        "(docs/studies.md)",
    )
    lr_scaling: str = F(
        "none",
        "podracer: a learner of m devices (data_parallel, devices_per_pod) trains at its job's "
        "agent.learning_rate x sqrt(m) (sqrt: RLlib's rule for its learners, resources.lr_scaling) or at "
        "the job's (none); PPO only",
    )

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, got {self.scheme!r}")
        if self.lr_scaling not in LR_SCALINGS:
            raise ValueError(f"lr_scaling must be one of {', '.join(LR_SCALINGS)}, got {self.lr_scaling!r}")
        if self.lr_scaling != "none" and self.scheme == "random_search":
            raise ValueError("lr_scaling: random search draws each pod's learning rate itself; leave it none")
        if (
            isinstance(self.devices_per_pod, bool)
            or not isinstance(self.devices_per_pod, int)
            or self.devices_per_pod < 1
        ):
            raise ValueError(f"devices_per_pod must be a whole number >= 1, got {self.devices_per_pod!r}")
        if self.devices_per_pod > 1 and self.scheme == "data_parallel":
            raise ValueError("devices_per_pod is for pods of several devices; data_parallel is already one pod of all")
        if not (math.isfinite(self.device_step_s) and self.device_step_s >= 0):
            raise ValueError(f"device_step_s must be >= 0 seconds (0: the study's), got {self.device_step_s}")
        if not self.job:
            raise ValueError("job is required (its job file)")
        self.set = [self.set] if isinstance(self.set, str) else self.set
        if not all(isinstance(x, str) and "=" in x for x in self.set):
            raise ValueError(f"set must be a list of KEY=VALUE strings, got {self.set!r}")
        if self.seeds:
            self.seeds = _ints(self.seeds, "seeds", 0)
        if self.points:
            self.points = _ints(self.points, "points", 1)
        if self.gpus_per_pod > 1 and self.gpus_per_pod != int(self.gpus_per_pod):
            raise ValueError(f"gpus_per_pod above 1 must be a whole number, got {self.gpus_per_pod:g}")
        if self.max_wall_s < 0 or self.timeout_s <= 0:
            raise ValueError("max_wall_s must be >= 0 and timeout_s > 0")


@dataclass
class AllreduceConfig:
    gbytes_per_s: float = F(
        25.0,
        "data_parallel: bandwidth of the gradient all-reduce, GB/s (25: a 200 Gb/s InfiniBand link between "
        "nodes; NVLink within a node is 10-20x that)",
    )
    latency_s: float = F(1e-5, "data_parallel: latency of one all-reduce step, seconds (times log2 of the devices)")
    param_bytes: float = F(0.0, "data_parallel: gradient bytes per all-reduce (0: 4 x the param_count the log records)")

    def __post_init__(self) -> None:
        if not (self.gbytes_per_s > 0 and math.isfinite(self.gbytes_per_s)):
            raise ValueError(f"gbytes_per_s must be > 0, got {self.gbytes_per_s}")
        if not (self.latency_s >= 0 and self.param_bytes >= 0):
            raise ValueError("latency_s and param_bytes must be >= 0")


@dataclass
class StudyConfig:
    name: str = F("", "study name (default: the file's stem); Slurm job names and the default out folder use it")
    task: str = F("", "the task every system trains (pendulum, cartpole, stock_trading, ...); required")
    metric: str = F(
        "return",
        "what target is a value of: return (evaluation return), or cumulative_return (stock "
        "trading: the evaluation episodes' cumulative return on the training window, a fraction)",
    )
    target: float = F(
        math.nan, "the target value of metric; time to target is the first evaluation at or above it; required"
    )
    points: list = F(
        [1, 2, 4], "resource points: pods (podracer MPI ranks = RLlib learners), one run per seed and system"
    )
    seeds: list = F([0], "seeds; each point runs once per seed (podracer rank r uses seed + r)")
    out: str = F("", "study folder (default runs/studies/<name>); relative to the current directory")
    resources: ResourcesConfig = F(ResourcesConfig, "the allocation a pod gets")
    slurm: SlurmConfig = F(SlurmConfig, "the Slurm side of a study")
    systems: dict = F(
        {},
        "name -> system (keys of systems.<name> below); the name labels its series (podracer and rllib are also kinds)",
    )
    device_step_s: float = F(
        0.0,
        "device-equivalent time: seconds per env step of one pod on its device, for every system (e.g. from "
        "bench/RESULTS.md's GPU rows); 0: measured from one-pod runs (device_reference)",
    )
    device_reference: str = F(
        "",
        "device-equivalent time: the system whose one-pod runs give every system's seconds per env step "
        "('': each system its own one-pod runs)",
    )
    round_s: float = F(
        0.0,
        "device-equivalent time: seconds of one tournament round on the pods' devices, stated (e.g. "
        "bench/tournament_overhead.py on an idle machine); 0: each round's smallest tournament_s in the logs",
    )
    allreduce: AllreduceConfig = F(AllreduceConfig, "the all-reduce model of data_parallel systems (docs/studies.md)")

    def __post_init__(self) -> None:
        if not self.task:
            raise ValueError("task is required (the task every system trains, e.g. pendulum)")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if self.metric == "cumulative_return" and self.task != "stock_trading":
            raise ValueError(f"metric cumulative_return is the stock-trading target; task is {self.task!r}")
        if not math.isfinite(self.target):
            raise ValueError(f"target is required (a value of {self.metric}, e.g. -250 for pendulum's return)")
        self.points, self.seeds = _ints(self.points, "points", 1), _ints(self.seeds, "seeds", 0)
        if not (math.isfinite(self.device_step_s) and self.device_step_s >= 0):
            raise ValueError(f"device_step_s must be >= 0 seconds (0: measured), got {self.device_step_s}")
        if not (math.isfinite(self.round_s) and self.round_s >= 0):
            raise ValueError(f"round_s must be >= 0 seconds (0: measured from the logs), got {self.round_s}")
        if not isinstance(self.systems, dict) or not self.systems:
            raise ValueError(
                "systems is required: a mapping of names to systems, e.g.\n  systems:\n    podracer: {job: "
                "jobs/pendulum_fast.yaml}\n    rllib: {job: jobs/rllib/pendulum.yaml}"
            )


@dataclass
class System:
    """One system of a study: its label (``name``), kind, job file and overrides."""

    name: str
    kind: str
    job: Path
    sets: list[str]
    python: str = ""
    stop_at_target: bool = True
    max_wall_s: float | None = None
    timeout_s: float = 3600.0
    seeds: list[int] | None = None  # None: the study's
    points: list[int] | None = None  # None: the study's
    gpus_per_pod: float | None = None  # None: the study's
    scheme: str = "pool"  # SCHEMES
    device_step_s: float = 0.0  # 0: the study's
    devices_per_pod: int = 1  # a pod of several devices: one learner with this many x the envs
    lr_scaling: str = "none"  # LR_SCALINGS: the learning rate of a learner of several devices

    @property
    def one_learner(self) -> bool:
        """One learner stands for the point's pods (data_parallel): one rank, pods x the envs."""
        return self.scheme == "data_parallel"

    def ranks(self, devices: int) -> int:
        """The MPI ranks (pods) at a point of ``devices`` devices: one learner (data_parallel), or
        one pod per ``devices_per_pod`` devices."""
        return 1 if self.one_learner else devices // self.devices_per_pod

    @property
    def data_parallel(self) -> bool:
        """One module trained data-parallel over all of a point's devices: one learner
        (data_parallel), or RLlib's learners."""
        return self.one_learner or self.kind == "rllib"

    def devices_per_learner(self, devices: int) -> int:
        """Devices whose envs one learner steps (and whose gradients it all-reduces) at a point of
        ``devices`` devices."""
        return devices if self.data_parallel else self.devices_per_pod


@dataclass
class Point:
    """One run of a study: a system at a resource point with one seed."""

    system: System
    pods: int
    seed: int
    run_dir: Path
    nodes: int
    tasks_per_node: int
    gpus: float  # in all
    cpus: int  # in all

    @property
    def label(self) -> str:
        return f"{self.system.name} pods={self.pods} seed={self.seed}"

    @property
    def layout(self) -> str:
        """What runs at this point, in words: its pods (and the devices' envs each steps), one
        learner with all the devices' envs, or RLlib over the devices. ``pods`` is the point, in
        devices: 16 devices as pods of 2 are 8 pods."""
        if self.system.one_learner:
            return f"one learner with {self.pods} x the envs"
        if self.system.kind == "rllib":
            return f"RLlib on {self.pods} device{'s' * (self.pods != 1)}"
        n, m = self.system.ranks(self.pods), self.system.devices_per_pod
        return f"{n} pod{'s' * (n != 1)}" + (f" of {m} devices' envs each" if m > 1 else "")

    @property
    def gpus_per_node(self) -> int:
        return int(math.ceil(self.gpus / self.nodes)) if self.gpus else 0

    def resources(self, executor: str) -> dict[str, Any]:
        """What this run gets (``resources.json``, read by analysis). Locally: one node, this
        machine (``cpus`` is still what the point asks for: the pods share the machine's cores)."""
        return {
            "system": self.system.name,
            "kind": self.system.kind,
            "pods": self.pods,
            "gpus": self.gpus,
            "cpus": self.cpus,
            "nodes": self.nodes if executor == "slurm" else 1,
            "seed": self.seed,
            "executor": executor,
            "scheme": "data_parallel" if self.system.data_parallel else "pods",
            "study_scheme": self.system.scheme,  # the study file's (pool, best_of_n, random_search, data_parallel)
            "devices_per_learner": self.system.devices_per_learner(self.pods),
        }


@dataclass
class Study:
    """A resolved, checked study file."""

    name: str
    task: str
    metric: str
    target: float
    points: list[int]
    seeds: list[int]
    out: Path
    gpus_per_pod: float
    cpus_per_pod: int
    pods_per_node: int
    slurm: dict[str, Any]
    systems: list[System]
    source: dict[str, Any] = field(default_factory=dict)  # the resolved file, as written to out/study.yaml
    device: DeviceModel = field(default_factory=DeviceModel)  # how device-equivalent time is computed

    def gpus_of(self, system: System) -> float:
        """GPUs per pod of a system: its own ``gpus_per_pod``, else the study's."""
        return self.gpus_per_pod if system.gpus_per_pod is None else system.gpus_per_pod

    def runs(self) -> list[Point]:
        """Every point x seed x system, systems first (all of podracer, then all of RLlib)."""
        out = []
        for system in self.systems:
            gpp = self.gpus_of(system)
            for pods in system.points if system.points is not None else self.points:
                ranks = system.ranks(pods)  # data_parallel: one learner stands for the pods
                nodes = max(1, math.ceil(ranks / self.pods_per_node))
                gpus = float(math.ceil(ranks * gpp - 1e-9)) if 0 < gpp < 1 else ranks * gpp
                for seed in system.seeds if system.seeds is not None else self.seeds:
                    out.append(
                        Point(
                            system,
                            pods,
                            seed,
                            self.out / "runs" / system.name / f"p{pods}-s{seed}",
                            nodes,
                            ranks // nodes,
                            gpus,
                            ranks * self.cpus_per_pod,
                        )
                    )
        return out


def keys_text() -> str:
    """Every key of a study file with its doc and default (``podracer study --keys``)."""
    lines = [f"  {k}: {doc} (default {d!r})" for k, doc, d in describe(StudyConfig)]
    lines.append("systems.<name>:")
    lines += [f"  {k}: {doc} (default {d!r})" for k, doc, d in describe(SystemConfig)]
    lines.append("allreduce (data_parallel systems):")
    lines += [f"  allreduce.{k}: {doc} (default {d!r})" for k, doc, d in describe(AllreduceConfig)]
    return "\n".join(lines)


def _path(p: str | Path, base: Path) -> Path:
    q = Path(p).expanduser()
    if q.is_absolute():
        return q
    for b in (Path.cwd(), base, ROOT):
        if (b / q).exists():
            return (b / q).resolve()
    return (Path.cwd() / q).resolve()


def _read(path: Path, sets: Sequence[str]) -> dict[str, Any]:
    """The study file as a dict, with ``KEY=VALUE`` overrides applied."""
    if not path.is_file():
        raise StudyError(f"study file {path} not found (studies live in jobs/studies/*.yaml)")
    try:
        raw = read_yaml(path, what="study file") or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise StudyError(f"{path}: not valid YAML: {e}") from None
    except (OSError, ValueError) as e:  # not a regular file, too large, an alias bomb
        raise StudyError(str(e)) from None
    if not isinstance(raw, dict):
        raise StudyError(
            f"{path}: a study file is a mapping of keys (see `podracer study --keys`), got {type(raw).__name__}"
        )
    try:
        for k, v in parse_overrides(list(sets)):
            d = raw
            for part in k.split(".")[:-1]:
                d = d.setdefault(part, {})
                if not isinstance(d, dict):
                    raise StudyError(f"--set {k}: {part} is not a section")
            d[k.split(".")[-1]] = v
    except ConfigError as e:
        raise StudyError(str(e)) from None
    return raw


def _system(name: str, spec: Any, base: Path, where: str) -> System:
    sw = f"{where}: systems.{name}"
    if not isinstance(spec, dict):
        raise StudyError(f"{sw} must be a mapping (kind, job, set, ...), got {spec!r}")
    try:
        c = from_dict(SystemConfig, spec, prefix=f"systems.{name}.")
    except ConfigError as e:
        raise StudyError(f"{where}: {e}") from None
    kind = c.kind or (name if name in KINDS else "podracer" if c.scheme != "pool" else "")  # schemes are podracer's
    if kind not in KINDS:
        raise StudyError(
            f"{sw}: kind must be one of {', '.join(KINDS)}"
            + ("" if c.kind else " (the name is neither, so give kind)")
            + f", got {kind or None!r}"
        )
    if not str(name).replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise StudyError(f"{sw}: a system name is a folder name: letters, digits, '-', '_', '.'")
    if kind == "rllib" and (c.scheme != "pool" or c.devices_per_pod != 1 or c.lr_scaling != "none"):
        if c.scheme != "pool":
            what = f"scheme {c.scheme}"
        elif c.devices_per_pod != 1:
            what = "devices_per_pod"
        else:
            what = "lr_scaling (RLlib's own: --set resources.lr_scaling=...)"
        raise StudyError(f"{sw}: {what} is podracer's; RLlib's learners are already data-parallel")
    return System(
        str(name),
        kind,
        _path(c.job, base),
        list(c.set),
        c.python,
        c.stop_at_target,
        c.max_wall_s or None,
        c.timeout_s,
        c.seeds or None,
        c.points or None,
        None if c.gpus_per_pod < 0 else c.gpus_per_pod,
        c.scheme,
        c.device_step_s,
        c.devices_per_pod,
        c.lr_scaling,
    )


def _check_disjoint_seeds(system: System, seeds: Sequence[int], points: Sequence[int], where: str) -> None:
    """Pod ``r`` of a run with seed ``s`` trains with seed ``s + r`` (and random search draws for
    it), so two seeds of a system closer than its largest point share pods: best-of-N at seeds 10
    and 11 with 8 pods runs 7 of its 8 pods twice. Such seeds are not independent samples of the
    system; refuse them before anything runs. One learner (data_parallel) and RLlib have one seed
    a run."""
    if system.kind != "podracer" or system.one_learner or not seeds or not points:
        return
    pods, ordered = max(points), sorted(set(seeds))
    close = [(a, b) for a, b in zip(ordered, ordered[1:]) if b - a < pods]
    if not close:
        return
    a, b = close[0]
    step = 10 ** math.ceil(math.log10(pods))  # 8 pods: 10 apart; 16: 100
    example = [ordered[0] + k * step for k in range(len(ordered))]
    raise StudyError(
        f"{where}: systems.{system.name}: seeds {a} and {b} share pods at {pods} pods (pod r of a run trains "
        f"with its seed + r, so seed {a}'s pods {b - a}-{pods - 1} are seed {b}'s pods 0-{pods - 1 - (b - a)}): "
        f"their runs are not independent samples. Space the seeds at least {pods} apart, e.g. seeds: {example}"
    )


def load_study(path: str | Path, sets: Sequence[str] = ()) -> Study:
    """Read and check a study file (or a study folder's ``study.yaml``), with ``KEY=VALUE``
    overrides; raises :class:`StudyError` saying what is wrong. Checks only the file: the
    systems' job files are checked by ``execute.check``."""
    path = Path(path)
    path = path if path.exists() else (shipped.find(path) or path)  # jobs/studies/... from a wheel
    path = path / "study.yaml" if path.is_dir() else path
    where, raw = str(path), _read(path, sets)
    if "target" in raw and raw["target"] is None:
        raw.pop("target")  # "required", not "not a number"
    systems_raw = raw.pop("systems", None)
    try:
        cfg = from_dict(StudyConfig, {**raw, "systems": systems_raw if systems_raw is not None else {}})
    except ConfigError as e:
        raise StudyError(f"{where}: {e}") from None
    systems = [_system(n, s, path.parent, where) for n, s in cfg.systems.items()]
    if cfg.device_reference and cfg.device_reference not in {s.name for s in systems}:
        raise StudyError(
            f"{where}: device_reference {cfg.device_reference!r} is not a system of this study "
            f"({', '.join(s.name for s in systems)})"
        )
    r = cfg.resources
    for s in systems:
        bad = [p for p in (s.points or cfg.points) if p % s.devices_per_pod]
        if bad:
            raise StudyError(
                f"{where}: systems.{s.name}: point {bad[0]} is not a whole number of pods of "
                f"{s.devices_per_pod} devices (devices_per_pod); give it points that are multiples of "
                f"{s.devices_per_pod}, e.g. points: [{s.devices_per_pod}, {2 * s.devices_per_pod}]"
            )
    for p in sorted({s.ranks(p) for s in systems if not s.one_learner for p in (s.points or cfg.points)}):
        nodes = math.ceil(p / r.pods_per_node)
        if p % nodes:
            raise StudyError(
                f"{where}: {p} pods do not split evenly over {nodes} nodes of at most {r.pods_per_node} "
                "pods (resources.pods_per_node); choose points that do"
            )
    for s in systems:
        _check_disjoint_seeds(s, s.seeds or cfg.seeds, [s.ranks(p) for p in s.points or cfg.points], where)
    name = cfg.name or path.stem
    out = Path(cfg.out or Path("runs") / "studies" / name).expanduser()
    out = (out if out.is_absolute() else Path.cwd() / out).resolve()
    resolved = {
        **to_dict(cfg),
        "name": name,
        "out": str(out),
        "systems": {
            s.name: {
                "kind": s.kind,
                "job": str(s.job),
                "set": s.sets,
                "python": s.python,
                "stop_at_target": s.stop_at_target,
                "max_wall_s": s.max_wall_s or 0.0,
                "timeout_s": s.timeout_s,
                "seeds": s.seeds or [],
                "points": s.points or [],
                "gpus_per_pod": -1.0 if s.gpus_per_pod is None else s.gpus_per_pod,
                "scheme": s.scheme,
                "device_step_s": s.device_step_s,
                "devices_per_pod": s.devices_per_pod,
                "lr_scaling": s.lr_scaling,
            }
            for s in systems
        },
    }
    a = cfg.allreduce
    device = DeviceModel(
        cfg.device_step_s,
        cfg.device_reference,
        {s.name: s.device_step_s for s in systems if s.device_step_s > 0},
        a.gbytes_per_s,
        a.latency_s,
        a.param_bytes,
        cfg.round_s,
    )
    return Study(
        name,
        cfg.task,
        cfg.metric,
        cfg.target,
        cfg.points,
        cfg.seeds,
        out,
        r.gpus_per_pod,
        r.cpus_per_pod,
        r.pods_per_node,
        copy.deepcopy(to_dict(cfg.slurm)),
        systems,
        resolved,
        device,
    )
