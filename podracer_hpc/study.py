"""Scaling studies: podracer and RLlib at the same resource points, from one command.

    podracer study jobs/studies/pendulum_scaling.yaml --executor local|slurm [--wait] [--dry-run]
        [--set KEY=VALUE ...] [--report-only]

A study file (``jobs/studies/*.yaml``, keys below) names a task, a target, the resource points
(pods: 1, 2, 4, ...), the seeds and the systems. The command

1. checks everything before anything runs or is queued: the study file (unknown keys, types,
   points, seeds), every system's job file at every point (``podracer_hpc.launch.validate`` for
   podracer, the baseline's own loader for RLlib), the RLlib interpreter, and on Slurm the
   partition, its node count and time limit; a bad study exits 2 with a message that says what
   is wrong;
2. runs every point x seed x system that is not done yet (a run directory whose ``summary.json``
   says it completed, or, for RLlib, that it stopped at its ``max_wall_s`` bound): locally one
   after another (podracer through ``launch.submit_local`` and ``mpiexec``; RLlib as a
   subprocess in its own venv), or on Slurm as one job each (podracer through
   ``launch.submit_slurm`` with the point's nodes, tasks and GPUs; RLlib through
   ``slurm_templates/rllib.sbatch``, a Ray cluster over the same nodes);
3. writes the tables and figures (``analysis.make_figures`` with each system's runs labelled by
   its name, plus the scaling table): locally at the end, on Slurm in a final job that depends
   on every point's job (``--dependency=afterany``) so it runs whatever became of them.

Running the same command again skips the points that are done (and, on Slurm, those whose job
is still queued or running): a study resumes, and grows when points or seeds are added.
Progress goes to stderr; the last line of stdout is a JSON summary.

Directory layout (``out``, default ``runs/studies/<name>``)::

    study.yaml                      the resolved study (absolute paths): what the report job reads
    runs/<system>/p<P>-s<seed>/     one run directory per point x seed (resources.json: what it got)
    results/                        evals.csv, runs.csv, tournament.csv, scaling.csv/.md, scaling.png/pdf,
                                    learning_curves.png/pdf, summary.json (no per-run lineage figures)

How resources are matched (one point = P pods): podracer runs P MPI ranks, one pod each (one GPU
each when ``gpus_per_pod`` is 1); RLlib gets the same allocation (nodes, GPUs, CPU cores) and
runs P learners on it (``num_learners = P``, ``num_gpus_per_learner = gpus_per_pod``;
``baselines/rllib/train.py`` ``apply_resources``) with ``env_runners_per_pod`` env runners per
learner stepping the same number of environments per step as a pod. Both evaluate the same way
(deterministic policy, same episodes from the same start-state seeds) and time training the same
way (start-up excluded, evaluation included). See baselines/rllib/README.md, "Matched resources".
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("podracer", "rllib")
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

# Every key of a study file, its default and its one-line doc (``podracer study --keys``).
STUDY_KEYS: dict[str, tuple[Any, str]] = {
    "name": ("", "study name (default: the file's stem); Slurm job names and the default out folder use it"),
    "task": ("", "the task every system trains (pendulum, cartpole, stock_trading, ...); required"),
    "metric": ("return", "what target is a value of: return (evaluation return), or cumulative_return (stock "
                         "trading: the evaluation episodes' cumulative return on the training window, a fraction)"),
    "target": (None, "the target value of metric; time to target is the first evaluation at or above it; required"),
    "points": ([1, 2, 4], "resource points: pods (podracer MPI ranks = RLlib learners), one run per seed and system"),
    "seeds": ([0], "seeds; each point runs once per seed (podracer rank r uses seed + r)"),
    "out": ("", "study folder (default runs/studies/<name>); relative to the current directory"),
    "resources.gpus_per_pod": (0, "GPUs per pod (and per RLlib learner); 0 on CPU; below 1: pods share GPUs, "
                                  "a point uses ceil(pods x gpus_per_pod) of them (local executor only)"),
    "resources.cpus_per_pod": (1, "CPU cores per pod in the allocation (RLlib's env runners run on them)"),
    "resources.pods_per_node": (8, "pods per node: a point of P pods asks for ceil(P / pods_per_node) nodes"),
    "slurm.partition": ("", "Slurm partition (default: the cluster's default)"),
    "slurm.account": ("", "Slurm account"),
    "slurm.time_min": (30, "time limit of each point's job, minutes"),
    "slurm.mpi": ("pmi2", "srun --mpi plugin for podracer's ranks: pmi2 (mpich) or pmix (Open MPI)"),
    "slurm.serial": (False, "run the points one at a time (this command waits for each): timings on a one-host "
                            "test cluster; false on a real cluster (all jobs queued at once)"),
    "systems": ({}, "name -> system; the name labels its series (podracer and rllib are also kinds)"),
}
SYSTEM_KEYS: dict[str, tuple[Any, str]] = {
    "kind": (None, "podracer or rllib (default: the system's name)"),
    "job": ("", "the system's job file (jobs/*.yaml or jobs/rllib/*.yaml); required"),
    "set": ([], "KEY=VALUE overrides of the job file, for every point"),
    "seeds": (None, "this system's seeds (default: the study's), e.g. fewer for a costly peer"),
    "points": (None, "this system's points (default: the study's)"),
    "gpus_per_pod": (None, "this system's GPUs per pod (default: resources.gpus_per_pod), e.g. 1 for RLlib's GPU "
                           "learner while the pods share one GPU"),
    "python": ("", "rllib: the interpreter with ray[rllib] (default <repo>/.venv-rllib/bin/python)"),
    "stop_at_target": (True, "rllib: stop at the first evaluation at or above the target (metric return)"),
    "max_wall_s": (None, "rllib: stop after this many training seconds (a run that stops there is done: "
                         "'not reached' with that bound)"),
    "timeout_s": (3600, "local executor: give up on one run after this many seconds"),
}


class StudyError(ValueError):
    """A study file or request that cannot be right; nothing was run or queued."""


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
    def gpus_per_node(self) -> int:
        return int(math.ceil(self.gpus / self.nodes)) if self.gpus else 0

    def resources(self, executor: str) -> dict[str, Any]:
        """What this run gets (``resources.json``, read by analysis). Locally: one node, this
        machine (``cpus`` is still what the point asks for: the pods share the machine's cores)."""
        return {"system": self.system.name, "kind": self.system.kind, "pods": self.pods, "gpus": self.gpus,
                "cpus": self.cpus, "nodes": self.nodes if executor == "slurm" else 1, "seed": self.seed,
                "executor": executor}


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

    def gpus_of(self, system: System) -> float:
        """GPUs per pod of a system: its own ``gpus_per_pod``, else the study's."""
        return self.gpus_per_pod if system.gpus_per_pod is None else system.gpus_per_pod

    def runs(self) -> list[Point]:
        """Every point x seed x system, systems first (all of podracer, then all of RLlib)."""
        out = []
        for system in self.systems:
            gpp = self.gpus_of(system)
            for pods in system.points if system.points is not None else self.points:
                nodes = max(1, math.ceil(pods / self.pods_per_node))
                gpus = float(math.ceil(pods * gpp - 1e-9)) if 0 < gpp < 1 else pods * gpp
                for seed in system.seeds if system.seeds is not None else self.seeds:
                    out.append(Point(system, pods, seed, self.out / "runs" / system.name / f"p{pods}-s{seed}", nodes,
                                     pods // nodes, gpus, pods * self.cpus_per_pod))
        return out


# ------------------------------------------------------------------------------------------
# Loading and checking
# ------------------------------------------------------------------------------------------
def _set(d: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            raise StudyError(f"--set {dotted}: {k} is not a section")
    d[keys[-1]] = value


def _keys_text() -> str:
    return "\n".join(f"  {k}: {doc}" for k, (_, doc) in STUDY_KEYS.items())


def _check_keys(given: dict[str, Any], where: str, known: dict[str, tuple[Any, str]], prefix: str = "") -> None:
    sections = {k.split(".")[0] for k in known if "." in k}
    for k, v in given.items():
        full = f"{prefix}{k}"
        if k in sections and prefix == "":
            if not isinstance(v, dict):
                raise StudyError(f"{where}: {k} must be a section (a mapping), got {v!r}")
            for kk in v:
                if f"{k}.{kk}" not in known:
                    valid = ", ".join(x for x in known if x.startswith(k + "."))
                    raise StudyError(f"{where}: unknown key {k}.{kk!s}; valid keys of {k}: {valid}")
        elif full not in known:
            import difflib

            near = difflib.get_close_matches(full, list(known), n=1)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise StudyError(f"{where}: unknown key {full!r}.{hint} Valid keys:\n" +
                             "\n".join(f"  {x}: {doc}" for x, (_, doc) in known.items()))


def _get(raw: dict[str, Any], dotted: str) -> Any:
    d: Any = raw
    for k in dotted.split("."):
        if not isinstance(d, dict) or k not in d:
            return copy.deepcopy(STUDY_KEYS[dotted][0])
        d = d[k]
    return d


def _int_list(v: Any, key: str, minimum: int, where: str) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise StudyError(f"{where}: {key} must be a non-empty list of integers, got {v!r}")
    if any(x < minimum for x in v):
        raise StudyError(f"{where}: {key} must be >= {minimum}, got {v!r}")
    if len(set(v)) != len(v):
        raise StudyError(f"{where}: {key} has duplicates: {v!r}")
    return sorted(v) if key == "points" else list(v)


def _number(v: Any, key: str, where: str, minimum: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise StudyError(f"{where}: {key} must be a number, got {v!r}")
    if minimum is not None and v < minimum:
        raise StudyError(f"{where}: {key} must be >= {minimum:g}, got {v!r}")
    return float(v)


def _path(p: str | Path, base: Path) -> Path:
    q = Path(p).expanduser()
    if q.is_absolute():
        return q
    for b in (Path.cwd(), base, ROOT):
        if (b / q).exists():
            return (b / q).resolve()
    return (Path.cwd() / q).resolve()


def load_study(path: str | Path, sets: Sequence[str] = ()) -> Study:
    """Read and check a study file (or a study folder's ``study.yaml``), with ``KEY=VALUE``
    overrides; raises :class:`StudyError` saying what is wrong. Checks only the file: the
    systems' job files are checked by :func:`check`."""
    path = Path(path)
    if path.is_dir():
        path = path / "study.yaml"
    where = str(path)
    if not path.is_file():
        raise StudyError(f"study file {where} not found (studies live in jobs/studies/*.yaml)")
    try:
        raw = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise StudyError(f"{where}: not valid YAML: {e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise StudyError(f"{where}: a study file is a mapping of keys (see `podracer study --keys`), got "
                         f"{type(raw).__name__}")
    for s in sets:
        if "=" not in s:
            raise StudyError(f"--set {s!r}: expected KEY=VALUE")
        k, v = s.split("=", 1)
        try:
            _set(raw, k.strip(), yaml.safe_load(v))
        except yaml.YAMLError as e:
            raise StudyError(f"--set {s!r}: the value is not YAML: {e}") from None
    _check_keys(raw, where, STUDY_KEYS)
    name = str(_get(raw, "name") or path.stem)
    task = _get(raw, "task")
    if not isinstance(task, str) or not task:
        raise StudyError(f"{where}: task is required (the task every system trains, e.g. pendulum)")
    from analysis.aggregate import METRICS

    metric = _get(raw, "metric")
    if metric not in METRICS:
        raise StudyError(f"{where}: metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if metric == "cumulative_return" and task != "stock_trading":
        raise StudyError(f"{where}: metric cumulative_return is the stock-trading target; task is {task!r}")
    if _get(raw, "target") is None:
        raise StudyError(f"{where}: target is required (a value of {metric}, e.g. -250 for pendulum's return)")
    target = _number(_get(raw, "target"), "target", where)
    points = _int_list(_get(raw, "points"), "points", 1, where)
    seeds = _int_list(_get(raw, "seeds"), "seeds", 0, where)
    gpp = _number(_get(raw, "resources.gpus_per_pod"), "resources.gpus_per_pod", where, 0)
    cpp = _number(_get(raw, "resources.cpus_per_pod"), "resources.cpus_per_pod", where, 1)
    ppn = _number(_get(raw, "resources.pods_per_node"), "resources.pods_per_node", where, 1)
    if cpp != int(cpp) or ppn != int(ppn):
        raise StudyError(f"{where}: resources.cpus_per_pod and resources.pods_per_node are whole numbers")
    if gpp > 1 and gpp != int(gpp):
        raise StudyError(f"{where}: resources.gpus_per_pod above 1 must be a whole number, got {gpp:g}")
    slurm = {k.split(".", 1)[1]: _get(raw, k) for k in STUDY_KEYS if k.startswith("slurm.")}
    if slurm["mpi"] not in ("pmi2", "pmix", "none"):
        raise StudyError(f"{where}: slurm.mpi must be pmi2, pmix or none, got {slurm['mpi']!r}")
    if isinstance(slurm["time_min"], bool) or not isinstance(slurm["time_min"], int) or slurm["time_min"] < 1:
        raise StudyError(f"{where}: slurm.time_min must be a whole number of minutes >= 1, got {slurm['time_min']!r}")
    systems_raw = _get(raw, "systems")
    if not isinstance(systems_raw, dict) or not systems_raw:
        raise StudyError(f"{where}: systems is required: a mapping of names to systems, e.g.\n"
                         "  systems:\n    podracer: {job: jobs/pendulum_fast.yaml}\n    rllib: {job: jobs/rllib/pendulum.yaml}")
    systems = []
    for sname, spec in systems_raw.items():
        sw = f"{where}: systems.{sname}"
        if not isinstance(spec, dict):
            raise StudyError(f"{sw} must be a mapping (kind, job, set, ...), got {spec!r}")
        _check_keys(spec, sw, SYSTEM_KEYS)
        val = {k: copy.deepcopy(spec.get(k, d)) for k, (d, _) in SYSTEM_KEYS.items()}
        kind = val["kind"] or (sname if sname in KINDS else None)
        if kind not in KINDS:
            raise StudyError(f"{sw}: kind must be one of {', '.join(KINDS)}" +
                             ("" if val["kind"] else " (the name is neither, so give kind)") + f", got {kind!r}")
        if not val["job"]:
            raise StudyError(f"{sw}: job is required (its job file)")
        sets_ = val["set"]
        if isinstance(sets_, str):
            sets_ = [sets_]
        if not isinstance(sets_, list) or not all(isinstance(x, str) and "=" in x for x in sets_):
            raise StudyError(f"{sw}: set must be a list of KEY=VALUE strings, got {val['set']!r}")
        if not str(sname).replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise StudyError(f"{sw}: a system name is a folder name: letters, digits, '-', '_', '.'")
        max_wall = None if val["max_wall_s"] is None else _number(val["max_wall_s"], "max_wall_s", sw, 1)
        own_seeds = None if val["seeds"] is None else _int_list(val["seeds"], "seeds", 0, sw)
        own_points = None if val["points"] is None else _int_list(val["points"], "points", 1, sw)
        own_gpp = None if val["gpus_per_pod"] is None else _number(val["gpus_per_pod"], "gpus_per_pod", sw, 0)
        if own_gpp is not None and own_gpp > 1 and own_gpp != int(own_gpp):
            raise StudyError(f"{sw}: gpus_per_pod above 1 must be a whole number, got {own_gpp:g}")
        systems.append(System(str(sname), kind, _path(val["job"], path.parent), list(sets_),
                              str(val["python"] or ""), bool(val["stop_at_target"]), max_wall,
                              _number(val["timeout_s"], "timeout_s", sw, 1), own_seeds, own_points, own_gpp))
    for p in sorted({p for s in systems for p in (s.points if s.points is not None else points)}):
        nodes = math.ceil(p / ppn)
        if p % nodes:
            raise StudyError(f"{where}: {p} pods do not split evenly over {nodes} nodes of at most {int(ppn)} pods "
                             "(resources.pods_per_node); choose points that do")
    out = Path(_get(raw, "out") or Path("runs") / "studies" / name).expanduser()
    out = out if out.is_absolute() else (Path.cwd() / out)
    resolved = {
        "name": name, "task": task, "metric": metric, "target": target, "points": points, "seeds": seeds,
        "out": str(out.resolve()),
        "resources": {"gpus_per_pod": gpp, "cpus_per_pod": int(cpp), "pods_per_node": int(ppn)},
        "slurm": slurm,
        "systems": {s.name: {"kind": s.kind, "job": str(s.job), "set": s.sets, "python": s.python,
                             "stop_at_target": s.stop_at_target, "max_wall_s": s.max_wall_s,
                             "timeout_s": s.timeout_s, "seeds": s.seeds, "points": s.points,
                             "gpus_per_pod": s.gpus_per_pod} for s in systems},
    }
    return Study(name, task, metric, target, points, seeds, out.resolve(), gpp, int(cpp), int(ppn), slurm, systems,
                 resolved)


def rllib_python(system: System) -> Path:
    """The interpreter that runs the RLlib baseline (``.venv-rllib``, baselines/rllib/README.md)."""
    return Path(system.python).expanduser() if system.python else ROOT / ".venv-rllib" / "bin" / "python"


def podracer_request(study: Study, pt: Point, executor: str) -> Any:
    """The ``launch.Request`` of a podracer point."""
    from . import launch

    gpn = pt.gpus_per_node if study.gpus_of(pt.system) >= 1 else 0  # a shared GPU is not a Slurm GPU request
    return launch.Request(job_file=str(pt.system.job), overrides=[*pt.system.sets, f"seed={pt.seed}"],
                          executor=executor, nodes=pt.nodes if executor == "slurm" else 1,
                          tasks_per_node=pt.tasks_per_node if executor == "slurm" else pt.pods, gpus_per_node=gpn,
                          partition=str(study.slurm["partition"] or ""), account=str(study.slurm["account"] or ""),
                          time_min=int(study.slurm["time_min"]), mpi=str(study.slurm["mpi"]), run_dir=str(pt.run_dir))


def rllib_sets(study: Study, pt: Point, executor: str = "local") -> list[str]:
    """The ``--set`` list of an RLlib point: the system's own, then the seed and the resource point
    (``resources.*``, which ``baselines/rllib/train.py`` turns into learners and env runners)."""
    return [*pt.system.sets, f"seed={pt.seed}", f"resources.pods={pt.pods}",
            f"resources.gpus_per_pod={study.gpus_of(pt.system):g}", f"resources.cpus={pt.cpus}",
            f"resources.nodes={pt.resources(executor)['nodes']}"]


def rllib_args(study: Study, pt: Point, executor: str = "local") -> list[str]:
    """Arguments of ``baselines.rllib.train`` after the job file for an RLlib point."""
    s = pt.system
    args = ["--run-dir", str(pt.run_dir), "--quiet"]
    for kv in rllib_sets(study, pt, executor):
        args += ["--set", kv]
    if s.stop_at_target and study.metric == "return":
        args += ["--stop-at-return", f"{study.target:g}"]
    if s.max_wall_s is not None:
        args += ["--max-wall-s", f"{s.max_wall_s:g}"]
    return args


def check(study: Study, executor: str) -> None:
    """Check every system at every point before anything runs (raises StudyError / launch errors)."""
    from . import launch
    from .config import ConfigError

    if executor not in ("local", "slurm"):
        raise StudyError(f"--executor must be local or slurm, got {executor!r}")
    if executor == "slurm" and any(0 < study.gpus_of(s) < 1 for s in study.systems):
        raise StudyError("resources.gpus_per_pod below 1 (pods sharing a GPU) runs with --executor local only: Slurm "
                         "gives whole GPUs")
    seen_kinds = {s.kind for s in study.systems}
    checked: set[tuple[str, int]] = set()
    for pt in study.runs():
        s = pt.system
        if (s.name, pt.pods) in checked:
            continue
        checked.add((s.name, pt.pods))
        if not s.job.is_file():
            raise StudyError(f"systems.{s.name}.job: {s.job} not found")
        if s.kind == "podracer":
            try:
                cfg = launch.validate(podracer_request(study, pt, executor))
            except (launch.LaunchError, ConfigError) as e:
                raise StudyError(f"systems.{s.name} at {pt.pods} pods: {e}") from None
            if cfg.env.name != study.task:
                raise StudyError(f"systems.{s.name}: its job trains {cfg.env.name!r}, the study's task is {study.task!r}")
        else:
            sys.path.insert(0, str(ROOT)) if str(ROOT) not in sys.path else None
            from baselines.rllib.train import ConfigError as RllibConfigError, load_config as rllib_config

            try:
                cfg = rllib_config(s.job, rllib_sets(study, pt, executor))
            except (RllibConfigError, OSError, yaml.YAMLError) as e:
                raise StudyError(f"systems.{s.name} at {pt.pods} pods: {e}") from None
            if cfg["task"] != study.task:
                raise StudyError(f"systems.{s.name}: its job trains {cfg['task']!r}, the study's task is {study.task!r}")
            py = rllib_python(s)
            if not py.exists():
                raise StudyError(f"systems.{s.name}: {py} not found: create .venv-rllib as baselines/rllib/README.md "
                                 f"says, or set systems.{s.name}.python, or drop the system")
    if executor == "slurm" and "rllib" in seen_kinds and shutil.which("sbatch") is None:
        raise StudyError("--executor slurm, but there is no sbatch here")


# ------------------------------------------------------------------------------------------
# State of a point
# ------------------------------------------------------------------------------------------
def read_json(path: Path) -> dict[str, Any] | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def is_done(pt: Point) -> bool:
    """A run that needs no more work: it completed its training (``summary.json``), or an RLlib
    run stopped at the target or at its ``max_wall_s`` bound."""
    s = read_json(pt.run_dir / "summary.json")
    if s is None:
        return False
    return s.get("complete", True) is not False or bool(s.get("stopped_at_wall_s"))


def _active_job(pt: Point) -> str | None:
    """The Slurm job of this point that is still queued or running, if any (``job.json``)."""
    from . import launch

    j = read_json(pt.run_dir / "job.json")
    if not j or not j.get("job_id"):
        return None
    st = launch.slurm_job_state(str(j["job_id"]))
    if st is None or st.state in launch.ACTIVE_STATES or st.state.startswith("REQUEUE"):
        return str(j["job_id"])
    return None


# ------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------
class Progress:
    """Numbered progress lines on stderr: ``study NAME [i/n] system pods=P seed=S: what``."""

    def __init__(self, study: Study, total: int, out: Any = None):
        self.name, self.total, self.out, self.i = study.name, total, out or sys.stderr, 0

    def __call__(self, pt: Point | None, what: str, step: bool = False) -> None:
        if step:
            self.i += 1
        head = f"study {self.name}" + (f" [{self.i}/{self.total}] {pt.label}" if pt is not None else "")
        print(f"{head}: {what}", file=self.out, flush=True)


def _prepare(pt: Point, executor: str) -> None:
    """A fresh run directory for an RLlib run (it cannot resume), and resources.json."""
    if pt.system.kind == "rllib" and pt.run_dir.exists():
        shutil.rmtree(pt.run_dir)
    pt.run_dir.mkdir(parents=True, exist_ok=True)
    (pt.run_dir / "resources.json").write_text(json.dumps(pt.resources(executor), indent=2) + "\n")


def _run_rllib_local(study: Study, pt: Point, say: Progress) -> None:
    from .launch import JobError, progress_line

    cmd = [str(rllib_python(pt.system)), "-m", "baselines.rllib.train", str(pt.system.job), *rllib_args(study, pt)]
    log = pt.run_dir / "launch.log"
    with open(log, "ab") as f:
        f.write(f"$ {shlex.join(cmd)}\n".encode())
        f.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline, last = time.monotonic() + pt.system.timeout_s, ""
    try:
        while proc.poll() is None:
            # one log for all learners: progress_line's pod count is 1, the point's is P
            line = progress_line(pt.run_dir).replace(": 1 pods |", f": {pt.pods} pods-equivalent (learners) |")
            if line != last:
                say(pt, line)
                last = line
            if time.monotonic() > deadline:
                proc.terminate()
                proc.wait(30)
                raise JobError(f"gave up after {pt.system.timeout_s:.0f} s (systems.{pt.system.name}.timeout_s); "
                               f"see {log}")
            time.sleep(2.0)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        raise
    if proc.returncode != 0 or not is_done(pt):
        tail = "\n".join("  " + x for x in log.read_text(errors="replace").splitlines()[-15:])
        raise JobError(f"RLlib run {pt.run_dir} failed (exit {proc.returncode}); see {log}:\n{tail}")


def run_point_local(study: Study, pt: Point, say: Progress) -> None:
    """Run one point here, to the end (raises launch.JobError when it does not complete)."""
    from . import launch

    _prepare(pt, "local")
    if pt.system.kind == "podracer":
        req = podracer_request(study, pt, "local")
        cfg = launch.validate(req)
        launched = launch.submit_local(req, cfg)

        class _Prefixed:
            def write(self, s: str) -> int:
                if s.strip():
                    say(pt, s.rstrip("\n"))
                return len(s)

            def flush(self) -> None:
                pass

        launch.wait(launched, timeout_s=pt.system.timeout_s, poll_s=1.0, out=_Prefixed())
    else:
        _run_rllib_local(study, pt, say)


def _sbatch(args: list[str], env: dict[str, str] | None = None) -> str:
    from .launch import LaunchError

    out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **(env or {})}, cwd=ROOT)
    if out.returncode != 0:
        raise LaunchError(f"sbatch refused the job: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]


def _slurm_common(study: Study) -> list[str]:
    args = []
    if study.slurm["partition"]:
        args.append(f"--partition={study.slurm['partition']}")
    if study.slurm["account"]:
        args.append(f"--account={study.slurm['account']}")
    return args


def submit_point_slurm(study: Study, pt: Point) -> tuple[str, Any]:
    """Submit one point as a Slurm job; returns (job id, what launch.wait needs or None)."""
    from . import launch

    _prepare(pt, "slurm")
    if pt.system.kind == "podracer":
        req = podracer_request(study, pt, "slurm")
        cfg = launch.validate(req)
        launched = launch.submit_slurm(req, cfg)
        job_id = str(launched.jobs[0].job_id)
    else:
        launched = None
        cpus_per_node = max(1, pt.cpus // pt.nodes)
        args = [f"--job-name=rllib-{study.name}", f"--nodes={pt.nodes}", "--ntasks-per-node=1",
                f"--cpus-per-task={cpus_per_node}", f"--gpus-per-node={pt.gpus_per_node}",
                f"--time={int(study.slurm['time_min'])}", f"--output={pt.run_dir / 'slurm-%j.out'}",
                *_slurm_common(study), str(ROOT / "slurm_templates" / "rllib.sbatch"), str(pt.system.job),
                *[a for a in rllib_args(study, pt, "slurm") if a not in ("--run-dir", str(pt.run_dir))]]
        job_id = _sbatch(args, env={"PODRACER_RUN_DIR": str(pt.run_dir), "PODRACER_ROOT": str(ROOT),
                                    "RLLIB_VENV": str(rllib_python(pt.system).parent.parent)})
    (pt.run_dir / "job.json").write_text(json.dumps({"job_id": job_id, "kind": pt.system.kind,
                                                     "submitted": time.time()}) + "\n")
    return job_id, launched


def _wait_slurm_job(job_id: str, timeout_s: float, poll_s: float = 3.0,
                    on_state: Callable[[str], None] | None = None) -> str:
    """Poll until the job has ended; returns its final state ("" when Slurm forgot it)."""
    from . import launch

    end, last = time.monotonic() + timeout_s, None
    while True:
        st = launch.slurm_job_state(job_id)
        if st is not None:
            if st.state != last and on_state is not None:
                on_state(st.state or "gone")
            last = st.state
            if not (st.state in launch.ACTIVE_STATES or st.state.startswith("REQUEUE")):
                return st.state
        if time.monotonic() > end:
            raise launch.JobError(f"gave up waiting for Slurm job {job_id} after {timeout_s:.0f} s; it goes on")
        time.sleep(poll_s)


def report_command(study: Study) -> list[str]:
    """The command of the final job: this study's report from its folder."""
    return [sys.executable, "-m", "podracer_hpc.cli", "study", str(study.out / "study.yaml"), "--report-only"]


def write_manifest(study: Study) -> Path:
    study.out.mkdir(parents=True, exist_ok=True)
    path = study.out / "study.yaml"
    path.write_text("# written by `podracer study`: the resolved study (absolute paths); the report job reads it\n"
                    + yaml.safe_dump(study.source, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------
def report(study: Study, out: Any = None) -> dict[str, Any]:
    """Tables and figures of the study's finished runs into ``<out>/results`` (each system's
    runs labelled by its name; RLlib's time ratio against the first system); prints the scaling
    table. Returns a summary (the JSON line)."""
    sys.path.insert(0, str(ROOT)) if str(ROOT) not in sys.path else None
    import matplotlib

    matplotlib.use("Agg")
    from analysis.aggregate import read_csv, scaling_markdown
    from analysis.make_figures import make_figures

    out = out or sys.stdout
    done = [pt for pt in study.runs() if is_done(pt)]
    results = study.out / "results"
    summary: dict[str, Any] = {"study": study.name, "task": study.task, "metric": study.metric,
                               "target": study.target, "runs": len(study.runs()), "done": len(done),
                               "results": str(results)}
    if not done:
        print(f"study {study.name}: no finished runs yet in {study.out / 'runs'}", file=sys.stderr)
        summary["rows"] = []
        return summary
    labels = [f"{pt.system.name}={pt.run_dir}" for pt in done]
    make_figures([], results, labels=labels, target={study.task: study.target}, metric=study.metric,
                 reference=study.systems[0].name, formats=("png", "pdf"), dpi=130, per_run=False)
    sc = read_csv(results / "scaling.csv")
    md = scaling_markdown(sc)
    print(f"{study.task}: time to {study.metric} {study.target:g} (training seconds, median [min, max] over seeds); "
          f"{len(done)} of {len(study.runs())} runs done", file=out)
    print(md, file=out, end="")
    rows = []
    for r in sc.rows():
        rows.append({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()
                     if k in ("system", "pods", "seeds", "reached", "time_to_target_median", "time_to_target_bound",
                              "steps_per_s_median", "speedup", "efficiency", "time_ratio", "time_ratio_bound")})
    summary["rows"] = rows
    (results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def study_runs(path: str | Path) -> dict[str, Any]:
    """What the analysis needs to draw a study folder (or file): ``labels`` (``NAME=RUN_DIR`` of
    every finished run), ``target`` (``{task: value}``), ``metric``, ``reference`` (the first
    system), and the ``study`` itself. Used by the notebook (``PODRACER_STUDY``)."""
    study = load_study(path)
    done = [pt for pt in study.runs() if is_done(pt)]
    return {"labels": [f"{pt.system.name}={pt.run_dir}" for pt in done], "target": {study.task: study.target},
            "metric": study.metric, "reference": study.systems[0].name, "study": study}


# ------------------------------------------------------------------------------------------
# The command
# ------------------------------------------------------------------------------------------
def run_study(study: Study, executor: str, wait: bool = False, poll_s: float = 3.0) -> int:
    """Run (local) or submit (slurm) every point that is not done, then the report; returns the exit code."""
    from . import launch

    pts = study.runs()
    say = Progress(study, len(pts))
    write_manifest(study)
    say(None, f"{len(study.systems)} systems x {len(study.points)} points x seeds = {len(pts)} runs "
              f"in {study.out} ({executor})")
    failed: list[str] = []
    if executor == "local":
        for pt in pts:
            if is_done(pt):
                say(pt, "done, skipped", step=True)
                continue
            say(pt, f"running ({pt.pods} pod{'s' * (pt.pods != 1)}, {pt.cpus} CPUs, {pt.gpus:g} GPUs)", step=True)
            t0 = time.monotonic()
            try:
                run_point_local(study, pt, say)
                say(pt, f"finished in {time.monotonic() - t0:.0f} s")
            except launch.JobError as e:
                failed.append(pt.label)
                say(pt, f"FAILED: {e}")
        summary = report(study)
    else:
        jobs: list[str] = []
        serial = bool(study.slurm["serial"])
        for pt in pts:
            if is_done(pt):
                say(pt, "done, skipped", step=True)
                continue
            active = _active_job(pt)
            if active:
                say(pt, f"Slurm job {active} is still queued or running: not submitted again", step=True)
                jobs.append(active)
                if serial:
                    _wait_slurm_job(active, float(study.slurm["time_min"]) * 60 + 600, poll_s)
                continue
            job_id, launched = submit_point_slurm(study, pt)
            jobs.append(job_id)
            say(pt, f"submitted Slurm job {job_id} ({pt.nodes} node{'s' * (pt.nodes != 1)} x {pt.tasks_per_node} "
                    f"pod{'s' * (pt.tasks_per_node != 1)}, {pt.gpus_per_node} GPUs/node)", step=True)
            if serial:
                state = _wait_slurm_job(job_id, float(study.slurm["time_min"]) * 60 + 600, poll_s,
                                        lambda s, pt=pt, j=job_id: say(pt, f"job {j}: {s}"))
                if not is_done(pt):
                    failed.append(pt.label)
                    say(pt, f"FAILED: job {job_id} ended {state or 'gone'} without a finished run in {pt.run_dir}")
        # afterany on every job Slurm still knows (one that ended long ago is gone: nothing to wait for)
        known = [j for j in jobs if (lambda st: st is None or bool(st.state))(launch.slurm_job_state(j))]
        dep = [f"--dependency=afterany:{':'.join(known)}"] if known else []
        final = _sbatch([f"--job-name=study-{study.name}", "--nodes=1", "--ntasks=1", "--cpus-per-task=1",
                         "--time=20", f"--output={study.out / 'report-%j.out'}", f"--chdir={ROOT}", *dep,
                         *_slurm_common(study), "--wrap", shlex.join(report_command(study))])
        say(None, f"report job {final}" + (f" runs after {', '.join(known)} (afterany)" if known else "")
                  + f"; it writes {study.out / 'results'}")
        if not wait:
            print(json.dumps({"study": study.name, "executor": "slurm", "jobs": jobs, "report_job": final,
                              "results": str(study.out / "results")}), flush=True)
            return EXIT_OK
        state = _wait_slurm_job(final, 24 * 3600.0, poll_s, lambda s: say(None, f"report job {final}: {s}"))
        log = study.out / f"report-{final}.out"
        text = log.read_text(errors="replace") if log.exists() else ""
        table = [ln for ln in text.splitlines() if ln.startswith("|") or ln.startswith(study.task + ":")]
        print("\n".join(table), flush=True)
        summary = read_json(study.out / "results" / "summary.json") or {}
        if state not in ("COMPLETED", ""):
            print(f"study {study.name}: report job {final} ended {state}; see {log}", file=sys.stderr)
            failed.append(f"report job {final}")
        failed += [pt.label for pt in pts if not is_done(pt) and pt.label not in failed]
    summary["failed"] = failed
    print(json.dumps(summary), flush=True)
    if failed:
        say(None, f"{len(failed)} run(s) did not finish: {', '.join(failed)}; run the same command again to "
                  "retry them (finished runs are skipped)")
    return EXIT_FAILED if failed else EXIT_OK


def dry_run(study: Study, executor: str) -> int:
    """Print what would run: each point, its resources, whether it is done, its command."""
    print(f"# study {study.name}: {study.task}, target {study.metric} >= {study.target:g}, out {study.out}")
    for pt in study.runs():
        state = "done" if is_done(pt) else "to run"
        head = (f"{pt.label}: {pt.nodes} node(s) x {pt.tasks_per_node} pod(s), {pt.gpus:g} GPUs, {pt.cpus} CPUs "
                f"[{state}]")
        if pt.system.kind == "podracer":
            req = podracer_request(study, pt, executor)
            cmd = f"podracer submit {pt.system.job} --executor {executor} --nodes {req.nodes} " \
                  f"--tasks-per-node {req.tasks_per_node} --gpus-per-node {req.gpus_per_node} --run-dir {pt.run_dir} " \
                  + " ".join(f"--set {shlex.quote(s)}" for s in req.overrides)
        else:
            cmd = shlex.join([str(rllib_python(pt.system)), "-m", "baselines.rllib.train", str(pt.system.job),
                              *rllib_args(study, pt, executor)])
            if executor == "slurm":
                cmd = f"sbatch -N{pt.nodes} --cpus-per-task={max(1, pt.cpus // pt.nodes)} " \
                      f"--gpus-per-node={pt.gpus_per_node} slurm_templates/rllib.sbatch ... ({cmd})"
        print(f"{head}\n    {cmd}")
    print(f"# then: {shlex.join(report_command(study))}" +
          (" (a Slurm job, --dependency=afterany on every point's job)" if executor == "slurm" else ""))
    return EXIT_OK


def add_study_parser(sub: Any) -> None:
    """Register ``podracer study`` on the CLI's sub-parsers."""
    st = sub.add_parser("study", help="a scaling study: every system at every resource point and seed, then the "
                                      "tables and figures (jobs/studies/*.yaml)",
                        description=__doc__.split("\n\n")[0])
    st.add_argument("study", nargs="?", default=None,
                    help="study file (jobs/studies/*.yaml), or a study folder (its study.yaml)")
    st.add_argument("--executor", choices=["auto", "local", "slurm"], default="auto",
                    help="local: one run after another here; slurm: one job per run, then a report job "
                         "(auto: slurm when sbatch exists)")
    st.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a study key (dotted), e.g. --set seeds=[0,1] --set systems.rllib.max_wall_s=60")
    st.add_argument("--wait", action="store_true", help="slurm: wait for the report job, then print the table")
    st.add_argument("--dry-run", action="store_true", help="print every run and its command; run nothing")
    st.add_argument("--report-only", action="store_true",
                    help="only write the tables and figures of the runs that are done (what the final job runs)")
    st.add_argument("--keys", action="store_true", help="list the keys of a study file and exit")
    st.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """``podracer study``: exit 0 done (or submitted), 1 a run failed, 2 a bad study (nothing run or queued)."""
    from . import launch

    if args.keys:
        print(_keys_text())
        print("systems.<name>:\n" + "\n".join(f"  {k}: {doc}" for k, (_, doc) in SYSTEM_KEYS.items()))
        return EXIT_OK
    if not args.study:
        print("podracer study: error: give a study file (jobs/studies/*.yaml)", file=sys.stderr)
        return EXIT_BAD_INPUT
    executor = args.executor
    if executor == "auto":
        executor = "slurm" if shutil.which("sbatch") else "local"
    try:
        study = load_study(args.study, args.set)
        if args.report_only:
            summary = report(study)
            print(json.dumps(summary), flush=True)
            return EXIT_OK
        check(study, executor)
        if args.dry_run:
            return dry_run(study, executor)
        return run_study(study, executor, wait=args.wait)
    except (StudyError, launch.LaunchError) as e:
        if isinstance(e, launch.JobError):
            print(f"podracer study: error: {e}", file=sys.stderr)
            return e.exit_code
        print(f"podracer study: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("podracer study: interrupted; run the same command again to resume (finished runs are skipped)",
              file=sys.stderr)
        return 130


__all__ = ["Study", "System", "Point", "StudyError", "load_study", "check", "run_study", "report", "is_done",
           "study_runs",
           "add_study_parser", "main"]
