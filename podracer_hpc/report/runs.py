"""Run directories read for analysis: a run's config, its rank logs (read while they are written),
its summary and resources; folders of run directories expanded; labels that name systems."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from podracer_hpc.files import rundir
from podracer_hpc.files.bounded import read_json, read_yaml
from podracer_hpc.files.h5log import read_log

__all__ = [
    "NOT_THE_EXPERIMENT",
    "Run",
    "RunDirError",
    "expand_run_dirs",
    "experiment_key",
    "is_run_dir",
    "job_id",
    "load_run",
    "load_runs",
    "split_experiments",
]

# Config keys that do not make another experiment: the seed (the runs of one experiment are its
# seeds), the run's name (its label is the system), and how a run logs, checkpoints and shares its
# machine. Everything else (the task and its env id, the agent and its hyperparameters, the
# tournament's mode and rule, the budget) does: runs that differ there are not pooled.
NOT_THE_EXPERIMENT = ("seed", "name", "log", "threads", "device", "tournament.leaderboard_dir")


class RunDirError(ValueError):
    """A path that is not a run directory (nor a folder of run directories)."""


# ---------------------------------------------------------------------- runs


@dataclass
class Run:
    """One run directory, its logs read."""

    path: Path
    system: str  # the label, else the config name
    run: str  # a short unique id (the directory name, or more of its path if names repeat)
    config: dict[str, Any]
    logs: dict[int, dict[str, Any]]  # rank -> read_log() result
    summary: dict[str, Any] | None = None
    attrs: dict[int, dict[str, Any]] = field(default_factory=dict)
    point: dict[str, Any] = field(default_factory=dict)  # <run>/resources.json (a study's resource point)

    experiment: str = ""  # the config minus the seed (:func:`experiment_key`): runs pooled as seeds share it
    not_pooled: str = ""  # why this run's series is not its system's other runs' ("" if it is)

    @property
    def task(self) -> str:
        """The task, with the env id where one task name holds many envs: ``gymnasium:Acrobot-v1``,
        ``jax:CartpoleBalance`` (two envs are never one panel nor one curve)."""
        env = self.config.get("env") or {}
        name = str(env.get("name", ""))
        if name == "gymnasium":
            gid = str((env.get("gymnasium") or {}).get("id") or "")
            return f"gymnasium:{gid}" if gid else name
        if name == "jax":
            jax = env.get("jax") or {}
            which = str((jax.get("kwargs") or {}).get("env_name") or str(jax.get("factory") or "").rpartition(":")[0])
            return f"jax:{which}" if which else name
        return name

    @property
    def pods(self) -> int:
        """Pods, or pods-equivalent (RLlib's learners): the x axis of scaling figures."""
        return int(self.resources["pods"])

    @property
    def resources(self) -> dict[str, float]:
        """``{pods, gpus, cpus, nodes}`` the run had: the ``resources`` root attribute of its log
        (RLlib's runner records it), else ``<run>/resources.json`` (what a study gave it), else
        from the logs: pods = the pool's size (its MPI world, or all its jobs' worlds; else the number of rank logs),
        GPUs = one per pod
        on CUDA, nodes = distinct Slurm node ids (else hosts), CPU cores = ``threads`` x pods
        (NaN with ``threads: 0``, i.e. the node's cores shared)."""
        attrs = [a for a in self.attrs.values()]
        logged = next((a["resources"] for a in attrs if isinstance(a.get("resources"), dict)), None)
        ws = [int(a.get("pool_size") or a["world_size"]) for a in attrs if a.get("world_size") is not None]
        pods = max(ws) if ws else max(1, len(self.logs))
        cuda = any(str(a.get("device_type", "")) == "cuda" for a in attrs)
        places = {str((a.get("slurm") or {}).get("SLURM_NODEID", a.get("host", ""))) for a in attrs}
        threads = int(self.config.get("threads", 0) or 0)
        out: dict[str, float] = {
            "pods": pods,
            "gpus": pods if cuda else 0,
            "nodes": max(1, len(places)),
            "cpus": threads * pods if threads else math.nan,
        }
        for src in (self.point, logged or {}):
            out.update({k: src[k] for k in ("pods", "gpus", "cpus", "nodes") if src.get(k) is not None})
        return out

    @property
    def scheme(self) -> str:
        """How the run's pods map onto devices (``report.aggregate.SCHEMES``): ``<run>/resources.json``'s
        ``scheme``; RLlib's learners (``kind`` rllib, or a log of ``system`` rllib) are
        ``data_parallel``; else ``pods``."""
        rllib = self.point.get("kind") == "rllib" or any(a.get("system") == "rllib" for a in self.attrs.values())
        return str(self.point.get("scheme") or ("data_parallel" if rllib else "pods"))

    @property
    def devices_per_learner(self) -> int:
        """Devices whose envs one of the run's learners steps: ``<run>/resources.json``'s
        ``devices_per_learner`` (a study's pods of several devices), else all the run's pods for a
        ``data_parallel`` run, else 1 (one pod per device)."""
        given = self.point.get("devices_per_learner")
        if given:
            return int(given)
        return int(self.resources["pods"]) if self.scheme == "data_parallel" else 1

    @property
    def mode(self) -> str:
        return str((self.config.get("tournament") or {}).get("mode", "none"))

    @property
    def num_envs(self) -> int:
        return int((self.config.get("env") or {}).get("num_envs", 0))

    @property
    def job(self) -> str:
        """The job id the run's pods put in their leaderboard entries (``local`` outside Slurm)."""
        return job_id((self.attrs.get(min(self.attrs)) or {}).get("slurm") or {}) if self.attrs else "local"


def job_id(slurm: Mapping[str, Any]) -> str:
    """Job id as the rank program names it (rundir.job_id, from the Slurm ids a log recorded)."""
    return rundir.job_id({k: str(v) for k, v in slurm.items()})


def is_run_dir(p: Path) -> bool:
    return p.is_dir() and rundir.RunDir(p).looks_like_run()


def expand_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories from paths that are run directories or folders holding them (one level,
    e.g. ``runs/bench-learning``). Raises :class:`RunDirError` naming a path that is neither."""
    out: list[Path] = []
    for p in map(Path, paths):
        if is_run_dir(p):
            found = [p]
        elif p.is_dir():
            found = sorted(q for q in p.iterdir() if is_run_dir(q))
        else:
            found = []
        if not found:
            raise RunDirError(
                f"{p}: not a run directory (none of config.yaml, logs/<name>_rank<r>.h5) "
                + ("and no run directories inside it" if p.is_dir() else "(no such directory)")
            )
        out += [q for q in found if q.resolve() not in {x.resolve() for x in out}]
    return out


def _unique_ids(paths: Sequence[Path]) -> list[str]:
    """The shortest path suffixes (1, 2, ... components) that tell the runs apart."""
    parts = [p.resolve().parts for p in paths]
    for k in range(1, max((len(x) for x in parts), default=1) + 1):
        ids = ["/".join(x[-k:]) for x in parts]
        if len(set(ids)) == len(ids):
            return ids
    return [str(p) for p in paths]


def load_run(path: str | Path, label: str | None = None, run_id: str | None = None) -> Run:
    """Read one run directory (all rank logs, config, summary)."""
    path = Path(path)
    if not is_run_dir(path):
        raise RunDirError(f"{path}: not a run directory (none of config.yaml, logs/<name>_rank<r>.h5)")
    logs = {r: read_log(p) for r, p in rundir.RunDir(path).pod_logs().items()}
    config: dict[str, Any] = {}
    if (path / "config.yaml").exists():
        try:
            config = read_yaml(path / "config.yaml", what="run config") or {}
        except (OSError, ValueError) as e:
            raise RunDirError(f"{path / 'config.yaml'}: unreadable ({e})") from None
    elif logs:
        config = logs[min(logs)]["attrs"].get("config") or {}
    summary = None
    if (path / "summary.json").exists():
        try:
            summary = read_json(path / "summary.json", what="run summary")
        except (OSError, ValueError):
            summary = None
    point: dict[str, Any] = {}
    if (path / "resources.json").exists():
        try:
            point = read_json(path / "resources.json", what="resources record")
        except (OSError, ValueError):
            point = {}
    system = label or str(config.get("name") or path.name)
    return Run(
        path=path,
        system=system,
        run=run_id or path.name,
        config=config,
        logs=logs,
        summary=summary,
        attrs={r: log["attrs"] for r, log in logs.items()},
        point=point if isinstance(point, dict) else {},
    )


def load_runs(
    paths: Iterable[str | Path] = (), labels: Mapping[str, str | Path] | Iterable[str] | None = None
) -> list[Run]:
    """Load run directories.

    ``paths``: run directories or folders of them. ``labels``: ``{system: run_dir}`` or
    ``["NAME=RUN_DIR", ...]``; a labelled directory is loaded too (no need to repeat it in
    ``paths``), and a folder of runs gives all its runs that label.
    """
    pairs: list[tuple[str, Path]] = []
    if labels is not None:
        items = labels.items() if isinstance(labels, Mapping) else (_split_label(s) for s in labels)
        pairs = [(str(k), Path(v)) for k, v in items]
    labelled: dict[Path, str] = {}
    order: list[Path] = expand_run_dirs(paths)  # in the order given; labelled ones not among them last
    for name, p in pairs:
        for q in expand_run_dirs([p]):
            labelled[q.resolve()] = name
            order.append(q)
    dirs: list[Path] = []
    for q in order:
        if q.resolve() not in {d.resolve() for d in dirs}:
            dirs.append(q)
    if not dirs:
        raise RunDirError("no run directories given")
    ids = _unique_ids(dirs)
    return split_experiments([load_run(d, labelled.get(d.resolve()), i) for d, i in zip(dirs, ids)])


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def experiment_key(config: Mapping[str, Any], scheme: str = "") -> dict[str, str]:
    """A run's experiment: its config flattened to dotted keys, less :data:`NOT_THE_EXPERIMENT`
    (values as JSON text, so lists and numbers compare as written). A study's random search
    (``scheme`` random_search) draws its pods' ``members`` from its seed: they are the seed's too."""
    import json

    drop = NOT_THE_EXPERIMENT + (("members",) if scheme == "random_search" else ())
    return {
        k: json.dumps(v, sort_keys=True, default=str)
        for k, v in _flat(config).items()
        if not any(k == d or k.startswith(d + ".") for d in drop)
    }


def _short(keys: Sequence[str], key: Mapping[str, str], most: int = 2) -> str:
    bits = [f"{k}={key.get(k, '-').strip(chr(34))}" for k in keys[:most]]
    return ", ".join(bits) + (f", +{len(keys) - most} more" if len(keys) > most else "")


def split_experiments(runs: list[Run]) -> list[Run]:
    """Pool runs as seeds only when they are one experiment: among the runs of one system, task
    and resource point, those whose :func:`experiment_key` differs get a system name of their own
    (``quickstart [tournament.mode=pbt]``: the keys where they differ) and ``not_pooled`` says
    why. Runs at different resource points stay one system (a scaling study's points differ in
    the resources, and with them ``env.num_envs`` where a scheme scales it). A key that only some
    of the runs have (a config written by an older or newer version) is not a difference."""
    groups: dict[tuple[str, str, int], list[Run]] = {}
    key_of: dict[str, dict[str, str]] = {}  # experiment text -> its key
    for r in runs:
        key = experiment_key(r.config, str(r.point.get("study_scheme", "")))
        r.experiment = repr(sorted(key.items()))
        key_of[r.experiment] = key
        groups.setdefault((r.system, r.task, r.pods), []).append(r)
    for (system, _task, _pods), members in groups.items():
        keys = {r.experiment: key_of[r.experiment] for r in members}
        if len(keys) < 2:
            continue
        # a key only some runs have was added (or dropped) by another version: not a difference
        names = sorted(set.intersection(*(set(key) for key in keys.values())))
        differ = [k for k in names if len({key[k] for key in keys.values()}) > 1]
        if not differ:
            continue
        values = {k: sorted({str(key[k]).strip(chr(34)) for key in keys.values()}) for k in differ}
        why = f"{system}: {len(keys)} experiments, not pooled: they differ in " + "; ".join(
            f"{k} ({', '.join(v)})" for k, v in values.items()
        )
        for r in members:
            r.system = f"{system} [{_short(differ, keys[r.experiment])}]"
            r.not_pooled = why
    return runs


def _split_label(s: str) -> tuple[str, str]:
    if "=" not in s:
        raise ValueError(f"label {s!r}: expected NAME=RUN_DIR")
    k, v = s.split("=", 1)
    if not k.strip() or not v.strip():
        raise ValueError(f"label {s!r}: expected NAME=RUN_DIR")
    return k.strip(), v.strip()


# ---------------------------------------------------------------------- tables
