"""Tidy tables from the per-rank HDF5 logs of one or many run directories.

A run directory (``podracer train --run-dir``) holds ``config.yaml``, ``logs/<name>_rank<r>.h5``
(``docs/hdf5-schema.md``) and, once the run has ended, ``summary.json``. Logs are read with
:func:`podracer_hpc.h5log.read_log`, which also reads a file that is still being written.

Tables are :class:`Table` objects: named numpy columns of one length (no pandas needed;
``Table.to_pandas()`` if you have it):

- :func:`eval_table`: one row per run x pod x evaluation (the tidy table of the learning curves);
- :func:`run_table`: one row per run (throughput, best and final return, time to a target);
- :func:`tournament_table`: one row per run x pod x tournament round (action, source, hparams);
- :func:`scaling_table`: one row per system x task x resource point (pods): time to target over
  seeds (median, range, how many reached it, the bound when not), throughput, speed-up,
  efficiency, and the ratio to a reference system at the same resources.

Curves (:func:`run_curves`, :func:`mean_curve`) take runs as the samples, not pods (a
tournament's pods copy each other): each run's pods are reduced to one curve first (their mean,
or the best pod), then the mean and the 95% t-interval (:func:`t95`, exact) are over runs.

A run's *resources* (:attr:`Run.resources`: pods, GPUs, CPU cores, nodes) put every system on
one x axis: podracer's pods are its MPI ranks, RLlib's pods-equivalent its learners
(``baselines/rllib``), and a study (``podracer study``) writes what it gave each run into
``<run>/resources.json``.

The *system* of a run (the name its curves carry in a figure) is the label given for it, else
its config ``name``.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence, Union

import numpy as np

from podracer_hpc.h5log import read_log
from podracer_hpc import rundir
from podracer_hpc.records import read_records
from podracer_hpc.status import find_rank_logs

__all__ = [
    "Run",
    "Table",
    "RunDirError",
    "load_run",
    "load_runs",
    "expand_run_dirs",
    "eval_table",
    "run_table",
    "tournament_table",
    "time_to_target",
    "scaling_table",
    "scaling_markdown",
    "cumulative_return_scale",
    "METRICS",
    "target_for",
    "parse_targets",
    "first_crossing",
    "mean_curve",
    "run_curves",
    "t95",
    "REDUCERS",
    "job_id",
    "read_csv",
]


class RunDirError(ValueError):
    """A path that is not a run directory (nor a folder of run directories)."""


# ---------------------------------------------------------------------- the table


class Table:
    """Named 1-D numpy columns of equal length, in order. Strings are object arrays."""

    def __init__(self, columns: Mapping[str, Any] | None = None):
        self.columns: dict[str, np.ndarray] = {}
        n = None
        for k, v in (columns or {}).items():
            a = _as_column(v)
            if n is not None and len(a) != n:
                raise ValueError(f"column {k!r} has {len(a)} rows, the others {n}")
            n = len(a)
            self.columns[k] = a

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> "Table":
        """Rows (dicts) to columns; a key missing from a row becomes NaN (numbers) or '' (strings)."""
        names: list[str] = list(columns or [])
        for r in rows:
            names += [k for k in r if k not in names]
        cols = {}
        for k in names:
            vals = [r.get(k, _MISSING) for r in rows]
            present = [v for v in vals if v is not _MISSING]
            if present and all(isinstance(v, str) for v in present):
                vals = ["" if v is _MISSING else v for v in vals]
            else:
                vals = [math.nan if v is _MISSING else v for v in vals]
            cols[k] = vals
        return cls(cols)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, key: str) -> np.ndarray:
        return self.columns[key]

    def __contains__(self, key: str) -> bool:
        return key in self.columns

    def __repr__(self) -> str:
        return f"Table({len(self)} rows: {', '.join(self.columns)})"

    @property
    def names(self) -> list[str]:
        return list(self.columns)

    def take(self, idx: Any) -> "Table":
        """Rows selected by a boolean mask or an index array."""
        return Table({k: v[idx] for k, v in self.columns.items()})

    def where(self, **equal: Any) -> "Table":
        """Rows whose columns equal the given values, e.g. ``t.where(system="pbt", pod=0)``."""
        mask = np.ones(len(self), dtype=bool)
        for k, v in equal.items():
            mask &= self.columns[k] == v
        return self.take(mask)

    def unique(self, key: str) -> list[Any]:
        """Distinct values of a column, in order of first appearance."""
        seen: dict[Any, None] = {}
        for v in self.columns[key].tolist():
            seen.setdefault(v, None)
        return list(seen)

    def rows(self) -> Iterator[dict[str, Any]]:
        names = self.names
        for vals in zip(*(self.columns[k].tolist() for k in names)):
            yield dict(zip(names, vals))

    def to_csv(self, path: str | Path) -> Path:
        """Write CSV (a header row; floats at full precision, NaN as ``nan``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.names)
            for r in self.rows():
                w.writerow([_cell(v) for v in r.values()])
        return path

    def to_parquet(self, path: str | Path) -> Path | None:
        """Write Parquet if pyarrow is installed; returns None (and writes nothing) otherwise."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            return None
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({k: v.tolist() if v.dtype == object else v for k, v in self.columns.items()}), path)
        return path

    def to_pandas(self) -> Any:
        import pandas as pd  # optional

        return pd.DataFrame(self.columns)


_MISSING = object()


def _as_column(v: Any) -> np.ndarray:
    a = np.asarray(v)
    if a.dtype.kind in "US":
        a = a.astype(object)
    if a.ndim != 1:
        a = a.reshape(-1)
    return a


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)  # round-trips exactly; nan, inf as such
    if isinstance(v, bool):
        return str(v)
    return str(v)


# Columns kept as text when read back: a git revision such as 34425e4 would parse as a float.
TEXT_COLUMNS = frozenset({"git_revision"})


def read_csv(path: str | Path) -> Table:
    """Read a CSV written by :meth:`Table.to_csv`: integer, float and bool columns get their types."""
    with open(path, newline="") as f:
        r = csv.reader(f)
        names = next(r)
        data = list(r)
    cols: dict[str, Any] = {}
    for i, k in enumerate(names):
        vals = [row[i] for row in data]
        cols[k] = np.array(vals, dtype=object) if k in TEXT_COLUMNS else _parse_column(vals)
    return Table(cols)


def _parse_column(vals: list[str]) -> np.ndarray:
    if vals and all(v in ("True", "False") for v in vals):
        return np.array([v == "True" for v in vals])
    try:
        return np.array([int(v) for v in vals], dtype=np.int64)
    except ValueError:
        pass
    try:
        return np.array([float(v) for v in vals], dtype=np.float64)
    except ValueError:
        return np.array(vals, dtype=object)


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

    @property
    def task(self) -> str:
        return str((self.config.get("env") or {}).get("name", ""))

    @property
    def pods(self) -> int:
        """Pods, or pods-equivalent (RLlib's learners): the x axis of scaling figures."""
        return int(self.resources["pods"])

    @property
    def resources(self) -> dict[str, float]:
        """``{pods, gpus, cpus, nodes}`` the run had: the ``resources`` root attribute of its log
        (RLlib's runner records it), else ``<run>/resources.json`` (what a study gave it), else
        from the logs: pods = MPI world size (else the number of rank logs), GPUs = one per pod
        on CUDA, nodes = distinct Slurm node ids (else hosts), CPU cores = ``threads`` x pods
        (NaN with ``threads: 0``, i.e. the node's cores shared)."""
        attrs = [a for a in self.attrs.values()]
        logged = next((a["resources"] for a in attrs if isinstance(a.get("resources"), dict)), None)
        ws = [int(a["world_size"]) for a in attrs if a.get("world_size") is not None]
        pods = max(ws) if ws else max(1, len(self.logs))
        cuda = any(str(a.get("device_type", "")) == "cuda" for a in attrs)
        places = {str((a.get("slurm") or {}).get("SLURM_NODEID", a.get("host", ""))) for a in attrs}
        threads = int(self.config.get("threads", 0) or 0)
        out: dict[str, float] = {"pods": pods, "gpus": pods if cuda else 0, "nodes": max(1, len(places)),
                                 "cpus": threads * pods if threads else math.nan}
        for src in (self.point, logged or {}):
            out.update({k: src[k] for k in ("pods", "gpus", "cpus", "nodes") if src.get(k) is not None})
        return out

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
    logs = {r: read_log(p) for r, p in find_rank_logs(path).items()}
    config: dict[str, Any] = {}
    if (path / "config.yaml").exists():
        import yaml

        config = yaml.safe_load((path / "config.yaml").read_text()) or {}
    elif logs:
        config = logs[min(logs)]["attrs"].get("config") or {}
    summary = None
    if (path / "summary.json").exists():
        try:
            summary = json.loads((path / "summary.json").read_text())
        except ValueError:
            summary = None
    point: dict[str, Any] = {}
    if (path / "resources.json").exists():
        try:
            point = json.loads((path / "resources.json").read_text())
        except ValueError:
            point = {}
    system = label or str(config.get("name") or path.name)
    return Run(path=path, system=system, run=run_id or path.name, config=config, logs=logs, summary=summary,
               attrs={r: log["attrs"] for r, log in logs.items()}, point=point if isinstance(point, dict) else {})


def load_runs(paths: Iterable[str | Path] = (), labels: Mapping[str, str | Path] | Iterable[str] | None = None) -> list[Run]:
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
    return [load_run(d, labelled.get(d.resolve()), i) for d, i in zip(dirs, ids)]


def _split_label(s: str) -> tuple[str, str]:
    if "=" not in s:
        raise ValueError(f"label {s!r}: expected NAME=RUN_DIR")
    k, v = s.split("=", 1)
    if not k.strip() or not v.strip():
        raise ValueError(f"label {s!r}: expected NAME=RUN_DIR")
    return k.strip(), v.strip()


# ---------------------------------------------------------------------- tables

EVAL_COLUMNS = ("system", "task", "run", "pod", "seed", "pods", "mode", "num_envs", "eval_index", "update",
                "env_steps", "wall_s", "return_mean", "return_std", "return_min", "return_max", "episodes",
                "cumulative_return", "device_type", "host", "git_revision", "run_dir")

# What a target is a value of: the evaluation return, or (stock trading) the cumulative return of
# the evaluation episodes on the training window, as a fraction of the initial capital.
METRICS = {"return": "return_mean", "cumulative_return": "cumulative_return"}


def cumulative_return_scale(config: Mapping[str, Any]) -> float | None:
    """Factor from a stock-trading evaluation return to its cumulative return (a fraction of the
    initial capital), or None for other tasks. The trading env's reward is the change in account
    value x ``reward_scale`` (0: ``100 / initial_cash``, i.e. percent), so an episode's return is
    ``(V_end - V_0) x reward_scale`` and its cumulative return ``return / (reward_scale x initial_cash)``."""
    env = config.get("env") or {}
    if str(env.get("name", "")) != "stock_trading":
        return None
    tr = env.get("trading") or {}
    cash = float(tr.get("initial_cash", 1_000_000) or 1_000_000)
    scale = float(tr.get("reward_scale", 0.0) or 0.0) or 100.0 / cash
    return 1.0 / (scale * cash)


def eval_table(runs: Sequence[Run]) -> Table:
    """One row per run x pod x evaluation (columns ``EVAL_COLUMNS``; values as in the logs).

    ``env_steps`` is the pod's own count; ``wall_s`` its training seconds (cumulative over
    resumes, excluding start-up).
    """
    rows = []
    for run in runs:
        cr = cumulative_return_scale(run.config)
        for rank, log in run.logs.items():
            a, ev = log["attrs"], log["eval"]
            for i in range(len(ev.get("env_steps", ()))):
                rows.append({
                    "system": run.system, "task": run.task, "run": run.run, "pod": int(a.get("rank", rank)),
                    "seed": int(a.get("seed", -1)), "pods": run.pods, "mode": run.mode, "num_envs": run.num_envs,
                    "eval_index": i,
                    **{k: ev[k][i].item() for k in ("update", "env_steps", "wall_s", "return_mean", "return_std",
                                                       "return_min", "return_max", "episodes")},
                    "cumulative_return": float(ev["return_mean"][i]) * cr if cr is not None else math.nan,
                    "device_type": str(a.get("device_type", "")), "host": str(a.get("host", "")),
                    "git_revision": str(a.get("git_revision", "")), "run_dir": str(run.path),
                })
    return _typed(Table.from_rows(rows, EVAL_COLUMNS), EVAL_COLUMNS)


def _typed(t: Table, names: Sequence[str]) -> Table:
    """An empty table still has its columns."""
    if len(t):
        return t
    return Table({k: np.array([], dtype=object) for k in names})


def first_crossing(x: Any, y: Any, target: float) -> float:
    """The first ``x[i]`` (in the given order) with ``y[i] >= target``; NaN if none (NaN y never crosses)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    hit = np.flatnonzero(np.nan_to_num(y, nan=-np.inf) >= target)
    return float(x[hit[0]]) if len(hit) else math.nan


Targets = Union[float, Mapping[str, float], None]


def target_for(targets: Targets, task: str) -> float | None:
    """The target return of ``task``: ``targets`` is one number for every task, or ``{task: number}``
    (key ``"*"``: every other task), or None."""
    if targets is None:
        return None
    if isinstance(targets, Mapping):
        v = targets.get(task, targets.get("*"))
        return None if v is None else float(v)
    return float(targets)


def parse_targets(specs: Iterable[str | float] | str | float | None) -> Targets:
    """``["-250"]`` -> -250.0; ``["pendulum=-250", "cartpole=475"]`` -> a dict (``"*"`` for a bare number)."""
    if specs is None:
        return None
    if isinstance(specs, (str, int, float)):
        specs = [specs]
    out: dict[str, float] = {}
    for spec in specs:
        if isinstance(spec, str) and "=" in spec:
            k, v = spec.split("=", 1)
            out[k.strip()] = float(v)
        else:
            out["*"] = float(spec)
    if not out:
        return None
    return out["*"] if list(out) == ["*"] else out


def time_to_target(evals: Table, target: Targets, x: str = "wall_s", y: str = "return_mean") -> Table:
    """Per run: the first ``x`` (``wall_s`` or ``env_steps``, the pod's own) at which any pod's
    evaluation ``y`` (``return_mean``, or ``cumulative_return`` for stock trading) reaches the
    target of the run's task (NaN if none did), and which pod did. Runs of a task without a
    target are left out."""
    rows = []
    for run in evals.unique("run") if len(evals) else []:
        t = evals.where(run=run)
        goal = target_for(target, str(t["task"][0]))
        if goal is None:
            continue
        best, pod = math.inf, -1
        for p in t.unique("pod"):
            u = t.where(pod=p)
            order = np.argsort(u[x], kind="stable")
            v = first_crossing(u[x][order], u[y][order], goal)
            if v < best:
                best, pod = v, int(p)
        rows.append({"system": t["system"][0], "task": t["task"][0], "run": run, "pods": int(t["pods"][0]),
                     "target": goal, f"{x}_to_target": best if math.isfinite(best) else math.nan, "pod": pod})
    return _typed(Table.from_rows(rows), ("system", "task", "run", "pods", "target", f"{x}_to_target", "pod"))


RUN_COLUMNS = ("system", "task", "run", "pods", "gpus", "cpus", "nodes", "mode", "num_envs", "seed", "env_steps", "wall_s", "steps_per_s",
               "steps_per_s_per_pod", "update_steps_per_s", "best_return", "best_return_se", "peak_return",
               "final_return", "best_pod", "rounds",
               "complete", "target", "metric", "wall_s_to_target", "env_steps_to_target", "device_type", "host", "run_dir")


def run_table(runs: Sequence[Run], target: Targets = None, metric: str = "return") -> Table:
    """One row per run.

    ``env_steps``: summed over pods (last train row of each); ``wall_s``: the slowest pod's
    training seconds; ``steps_per_s`` = env_steps / wall_s (the pool's throughput, evaluation and
    tournament included); ``update_steps_per_s``: the sum over pods of their median per-update
    throughput (training only); ``best_return``, ``best_return_se``, ``best_pod``: the run's verdict
    (summary.json: every pod evaluated once more on one common set, ``eval.final_episodes``) when
    the run has one, else the best evaluation of any pod (standard error NaN); ``peak_return``: the
    best evaluation of any pod at any time; ``final_return``: the best of the pods' last evaluations; ``wall_s_to_target`` / ``env_steps_to_target``: the first
    evaluation of any pod at or above the target of the run's task (a number for all tasks, or
    ``{task: number}``; NaN if never reached or no target) of ``metric`` (:data:`METRICS`:
    ``return``, or ``cumulative_return`` for stock trading); ``pods``, ``gpus``, ``cpus``,
    ``nodes``: :attr:`Run.resources`.
    """
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}: one of {', '.join(METRICS)}")
    evals = eval_table(runs)
    y = METRICS[metric]
    ttt_w = time_to_target(evals, target, "wall_s", y) if target is not None else None
    ttt_s = time_to_target(evals, target, "env_steps", y) if target is not None else None
    rows = []
    for run in runs:
        steps, walls, upd, best, finals = [], [], [], [], []
        for log in run.logs.values():
            tr, ev = log["train"], log["eval"]
            if len(tr.get("env_steps", ())):
                steps.append(int(tr["env_steps"][-1]))
                walls.append(float(tr["wall_s"][-1]))
                sps = tr["steps_per_s"][np.isfinite(tr["steps_per_s"])]
                upd.append(float(np.median(sps)) if len(sps) else math.nan)
            r = ev.get("return_mean", np.array([]))
            fin = r[np.isfinite(r)] if len(r) else r
            best.append(float(fin.max()) if len(fin) else -math.inf)
            finals.append(float(r[-1]) if len(r) and math.isfinite(r[-1]) else -math.inf)
        env_steps, wall = int(sum(steps)), (max(walls) if walls else math.nan)
        ranks = list(run.logs)
        best_i = int(np.argmax(best)) if best else -1
        res = run.resources
        row = {
            "system": run.system, "task": run.task, "run": run.run, "pods": int(res["pods"]),
            "gpus": float(res["gpus"]), "cpus": float(res["cpus"]), "nodes": int(res["nodes"]), "mode": run.mode,
            "num_envs": run.num_envs, "seed": int(run.config.get("seed", -1)), "env_steps": env_steps,
            "wall_s": wall, "steps_per_s": env_steps / wall if wall and wall > 0 else math.nan,
            "steps_per_s_per_pod": env_steps / wall / max(1, len(steps)) if wall and wall > 0 else math.nan,
            "update_steps_per_s": float(np.nansum(upd)) if upd else math.nan,
            "best_return": max(best) if best and math.isfinite(max(best)) else math.nan,
            "best_return_se": math.nan,
            "peak_return": max(best) if best and math.isfinite(max(best)) else math.nan,
            "final_return": max(finals) if finals and math.isfinite(max(finals)) else math.nan,
            "best_pod": ranks[best_i] if best_i >= 0 and math.isfinite(best[best_i]) else -1,
            "rounds": _rounds(run),
            "complete": bool(run.summary is not None and run.summary.get("complete", True)),
            "target": math.nan if target_for(target, run.task) is None else target_for(target, run.task),
            "metric": metric,
            "wall_s_to_target": _lookup(ttt_w, run.run, "wall_s_to_target"),
            "env_steps_to_target": _lookup(ttt_s, run.run, "env_steps_to_target"),
            "device_type": str(next(iter(run.attrs.values()), {}).get("device_type", "")),
            "host": str(next(iter(run.attrs.values()), {}).get("host", "")),
            "run_dir": str(run.path),
        }
        verdict = run.summary if run.summary is not None and run.summary.get("final_episodes") else None
        if verdict is not None and verdict.get("best_return") is not None:  # the common-ground verdict
            row.update(best_return=float(verdict["best_return"]), best_pod=int(verdict.get("best_pod", -1)),
                       best_return_se=float(verdict.get("best_return_se") or math.nan))
        rows.append(row)
    return _typed(Table.from_rows(rows, RUN_COLUMNS), RUN_COLUMNS)


def _rounds(run: Run) -> int:
    r = [int(log["tournament"]["round"][-1]) + 1 for log in run.logs.values()
         if len(log["tournament"].get("round", ()))]
    return max(r) if r else 0


def _lookup(t: Table | None, run: str, col: str) -> float:
    if t is None or not len(t):
        return math.nan
    m = t["run"] == run
    return float(t[col][m][0]) if m.any() else math.nan


TOURNAMENT_COLUMNS = ("system", "task", "run", "pod", "pods", "mode", "round", "env_steps", "wall_s", "fitness",
                      "action", "source", "source_job", "source_pod", "source_round", "source_internal",
                      "rejected", "tournament_s", "old_hparams", "new_hparams")


def tournament_table(runs: Sequence[Run]) -> Table:
    """One row per run x pod x tournament round, with the source entry id parsed
    (``source_job``/``source_pod``/``source_round``; ``source_internal``: the entry came from this
    run's own pods) and the new hyperparameters as ``hp_<name>`` columns."""
    rows = []
    for run in runs:
        job = run.job
        for rank, log in run.logs.items():
            to = log["tournament"]
            for rec in read_records(to):
                src, name = rec.source, rec.source.entry
                pod = rec.source.pod
                internal = pod is not None and (name is None or name.job == job) and pod < run.pods
                row = {
                    "system": run.system, "task": run.task, "run": run.run, "pod": int(rank), "pods": run.pods,
                    "mode": run.mode, "round": rec.round, "env_steps": rec.env_steps,
                    "wall_s": rec.wall_s, "fitness": rec.fitness,
                    "action": rec.action, "source": src.id,
                    "source_job": name.job if name else "",
                    "source_pod": pod if pod is not None else -1,
                    "source_round": name.round if name else -1,
                    "source_internal": internal, "rejected": src.rejected,
                    "tournament_s": rec.tournament_s,
                    "old_hparams": json.dumps(rec.old_hparams), "new_hparams": json.dumps(rec.new_hparams),
                }
                for k, v in _hparams(row["new_hparams"]).items():
                    row[f"hp_{k}"] = v
                rows.append(row)
    return _typed(Table.from_rows(rows, TOURNAMENT_COLUMNS), TOURNAMENT_COLUMNS)


def _hparams(s: str) -> dict[str, float]:
    try:
        d = json.loads(s) if s else {}
    except json.JSONDecodeError:
        return {}
    return {str(k): float(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)} \
        if isinstance(d, dict) else {}


# ---------------------------------------------------------------------- curves


def t95(df: float) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom, t(0.975, df),
    exact for any ``df`` (``scipy.stats.t``; ``inf`` gives the normal's 1.95996); NaN for df < 1."""
    return float(_t975(np.array([df], dtype=float))[0])


def _t975(df: np.ndarray) -> np.ndarray:
    """:func:`t95` over an array of degrees of freedom."""
    from scipy import stats  # here, not at import: the tables need no scipy

    df = np.asarray(df, dtype=float)
    out = np.full(df.shape, math.nan)
    ok = df >= 1  # NaN compares False
    out[ok] = stats.t.ppf(0.975, df[ok])
    return out


# How a run's pods become the run's one curve (the run is the independent sample, its pods are not:
# a tournament's pods copy each other).
REDUCERS = {"mean": "the mean of its pods", "best": "its best pod at each point"}
MIN_RUNS_FOR_BAND = 3  # with 2 runs a 95% t-interval is +-12.7 sd/sqrt(2): wider than it says anything


def _pod_curves(evals: Table, x: str, y: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each pod's finite (x, y) points of one run, sorted by x (pods without any left out)."""
    out = []
    for p in evals.unique("pod"):
        u = evals.where(pod=p)
        xs, ys = u[x].astype(float), u[y].astype(float)
        ok = np.isfinite(xs) & np.isfinite(ys)
        if ok.any():
            o = np.argsort(xs[ok], kind="stable")
            out.append((xs[ok][o], ys[ok][o]))
    return out


def _grid(curves: Sequence[tuple[np.ndarray, np.ndarray]], max_points: int) -> np.ndarray:
    """The union of the curves' x values, thinned to about ``max_points`` (each curve's end kept)."""
    grid = np.unique(np.concatenate([c[0] for c in curves]))
    if len(grid) > max_points:
        grid = np.unique(np.concatenate([np.linspace(grid[0], grid[-1], max_points), [c[0][-1] for c in curves]]))
    return grid


def _on_grid(curves: Sequence[tuple[np.ndarray, np.ndarray]], grid: np.ndarray) -> np.ndarray:
    """Curves x grid: each curve interpolated linearly, only inside its own x range (NaN outside)."""
    vals = np.full((len(curves), len(grid)), math.nan)
    for i, (xs, ys) in enumerate(curves):
        inside = (grid >= xs[0]) & (grid <= xs[-1])
        vals[i, inside] = np.interp(grid[inside], xs, ys)
    return vals


def _enough(vals: np.ndarray, min_share: float) -> np.ndarray:
    """Grid points where at least ``min_share`` of the rows (at least one) have data."""
    return np.isfinite(vals).sum(axis=0) >= max(1, math.ceil(min_share * len(vals)))


def _reduce(vals: np.ndarray, how: str, min_share: float) -> np.ndarray:
    """One run's pods x grid to one curve: the mean or the max over the pods with data at each
    point, where at least ``min_share`` of its pods have data (so it does not jump where pods end)."""
    out = np.full(vals.shape[1], math.nan)
    keep = _enough(vals, min_share)
    if keep.any():
        v = vals[:, keep]
        out[keep] = np.nanmean(v, axis=0) if how == "mean" else np.nanmax(v, axis=0)
    return out


def run_curves(evals: Table, x: str = "env_steps", y: str = "return_mean", reduce: str = "mean",
               max_points: int = 400, min_share: float = 0.5) -> dict[str, Any]:
    """Each run's curve of ``y`` vs ``x``, its pods reduced to one (``reduce``: ``"mean"`` of the
    pods, or ``"best"``: the best pod at each point, as time to target takes any pod).

    Each pod's curve is interpolated linearly on a common grid (the union of all pods' ``x``
    values, thinned to ``max_points``), only inside its own range; a run has a value where at
    least ``min_share`` of its pods have data. Returns ``{x, runs, curves}`` (``curves``: runs x
    grid, NaN where a run has none; runs without any data are left out).
    """
    if reduce not in REDUCERS:
        raise ValueError(f"reduce {reduce!r}: one of {', '.join(REDUCERS)}")
    pods = {run: _pod_curves(evals.where(run=run), x, y) for run in (evals.unique("run") if len(evals) else [])}
    pods = {run: c for run, c in pods.items() if c}
    if not pods:
        return {"x": np.array([]), "runs": [], "curves": np.zeros((0, 0))}
    grid = _grid([c for cs in pods.values() for c in cs], max_points)
    curves = np.array([_reduce(_on_grid(cs, grid), reduce, min_share) for cs in pods.values()])
    return {"x": grid, "runs": list(pods), "curves": curves}


def mean_curve(evals: Table, x: str = "env_steps", y: str = "return_mean", max_points: int = 400,
               min_share: float = 0.5, reduce: str = "mean", min_runs: int = MIN_RUNS_FOR_BAND) -> dict[str, Any]:
    """Mean and 95% confidence band of ``y`` over the *runs* of ``evals`` (the independent
    samples: seeds), each run's pods reduced first (:func:`run_curves`, ``reduce``: ``"mean"`` of
    its pods or its ``"best"`` pod).

    Grid points where fewer than ``min_share`` of the runs have data are dropped (so that the
    mean does not jump where runs end). At each grid point: ``n`` runs with data, ``mean``, and
    ``lo``/``hi`` = mean -/+ t(0.975, n-1) * sd / sqrt(n) over the runs, NaN where n < ``min_runs``
    (3: draw the runs themselves then). Returns ``{x, mean, lo, hi, n, runs, curves, reduce}``
    (``curves``: the runs' reduced curves on ``x``, one row per run in ``runs``).
    """
    rc = run_curves(evals, x, y, reduce, max_points, min_share)
    grid, curves = rc["x"], rc["curves"]
    if not len(grid):
        e = np.array([])
        return {"x": e, "mean": e, "lo": e, "hi": e, "n": e.astype(int), "runs": [], "curves": curves,
                "reduce": reduce}
    keep = _enough(curves, min_share)
    grid, curves = grid[keep], curves[:, keep]
    has = np.isfinite(curves).any(axis=1)  # a run with data only where too few runs had: not drawn
    runs, curves = [r for r, h in zip(rc["runs"], has) if h], curves[has]
    n = np.isfinite(curves).sum(axis=0)
    mean = np.nansum(curves, axis=0) / n
    sd = np.sqrt(np.nansum((curves - mean) ** 2, axis=0) / np.maximum(n - 1, 1))
    half = _t975(n - 1.0) * sd / np.sqrt(n)
    half[n < max(2, min_runs)] = math.nan
    return {"x": grid, "mean": mean, "lo": mean - half, "hi": mean + half, "n": n, "runs": runs,
            "curves": curves, "reduce": reduce}


# ---------------------------------------------------------------------- scaling

SCALING_COLUMNS = ("task", "system", "pods", "gpus", "cpus", "nodes", "seeds", "reached", "target", "metric",
                   "time_to_target_median", "time_to_target_min", "time_to_target_max", "time_to_target_bound",
                   "env_steps_to_target_median", "steps_per_s_median", "steps_per_s_min", "steps_per_s_max",
                   "speedup", "efficiency", "throughput_speedup", "throughput_efficiency", "reference",
                   "time_ratio", "time_ratio_bound")


def _censored_median(reached: Sequence[float], n: int) -> float:
    """Median over ``n`` seeds of which ``reached`` got there (the others count as +inf, never
    reached): finite when more than half reached, else inf."""
    vals = sorted(list(reached) + [math.inf] * (n - len(reached)))
    if not vals:
        return math.nan
    m = len(vals)
    return vals[m // 2] if m % 2 else (vals[m // 2 - 1] + vals[m // 2]) / 2


def scaling_table(table: Table, reference: str | None = None) -> Table:
    """One row per task x system x pods of a :func:`run_table` (the runs at a resource point are
    its seeds).

    - ``time_to_target_median``: median over seeds of ``wall_s_to_target``, a seed that never
      reached the target counting as +inf (so the median is ``inf`` when half or more did not);
      ``_min``/``_max``: the range over seeds (``inf`` when one did not reach it); ``reached``:
      how many did; ``time_to_target_bound``: the longest training time of a seed that did not
      reach it (the time is at least that), NaN when all did;
    - ``steps_per_s_median`` / ``_min`` / ``_max``: the pool's throughput (all pods, env steps/s);
    - ``speedup``: the median time at the system's fewest pods / the median time here;
      ``efficiency``: speed-up / (pods / fewest pods), 1 for ideal scaling; the same for
      throughput (``throughput_speedup``, ``throughput_efficiency``);
    - ``time_ratio``: this system's median time / the ``reference`` system's at the same task and
      pods (``reference``: the given system, else the first system of the table); ``time_ratio_bound``
      ``=`` when both reached it, ``>=`` when only the reference did (the ratio uses this
      system's bound), ``<=`` when only this system did, ``""`` otherwise (ratio NaN).
    """
    if not len(table):
        return _typed(Table.from_rows([]), SCALING_COLUMNS)
    systems = table.unique("system")
    ref = reference if reference is not None else systems[0]
    rows: list[dict[str, Any]] = []
    for task in table.unique("task"):
        t = table.where(task=task)
        for system in [s for s in systems if s in set(t["system"].tolist())]:
            u = t.where(system=system)
            for pods in sorted({int(p) for p in u["pods"].tolist()}):
                v = u.where(pods=pods)
                ttt = np.asarray(v["wall_s_to_target"], dtype=float)
                hit = ttt[np.isfinite(ttt)]
                miss = ~np.isfinite(ttt)
                n = len(v)
                target = float(v["target"][0])
                sps = np.asarray(v["steps_per_s"], dtype=float)
                sps = sps[np.isfinite(sps)]
                esteps = np.asarray(v["env_steps_to_target"], dtype=float)
                rows.append({
                    "task": str(task), "system": str(system), "pods": pods,
                    "gpus": float(np.nanmax(v["gpus"])) if np.isfinite(v["gpus"].astype(float)).any() else math.nan,
                    "cpus": float(np.nanmax(v["cpus"])) if np.isfinite(v["cpus"].astype(float)).any() else math.nan,
                    "nodes": int(np.max(v["nodes"])), "seeds": n, "reached": int(len(hit)), "target": target,
                    "metric": str(v["metric"][0]) if "metric" in v else "return",
                    "time_to_target_median": _censored_median(hit.tolist(), n) if math.isfinite(target) else math.nan,
                    "time_to_target_min": (float(hit.min()) if len(hit) else math.inf) if math.isfinite(target)
                    else math.nan,
                    "time_to_target_max": (math.inf if miss.any() else float(ttt.max())) if math.isfinite(target)
                    else math.nan,
                    "time_to_target_bound": float(np.nanmax(np.asarray(v["wall_s"], dtype=float)[miss]))
                    if miss.any() and math.isfinite(target) else math.nan,
                    "env_steps_to_target_median": _censored_median(esteps[np.isfinite(esteps)].tolist(), n)
                    if math.isfinite(target) else math.nan,
                    "steps_per_s_median": float(np.median(sps)) if len(sps) else math.nan,
                    "steps_per_s_min": float(sps.min()) if len(sps) else math.nan,
                    "steps_per_s_max": float(sps.max()) if len(sps) else math.nan,
                })
    out = rows
    for r in out:  # speed-up and efficiency against the same system's fewest pods
        base = min((q for q in out if q["task"] == r["task"] and q["system"] == r["system"]), key=lambda q: q["pods"])
        k = r["pods"] / base["pods"]
        t0, t1 = base["time_to_target_median"], r["time_to_target_median"]
        r["speedup"] = t0 / t1 if math.isfinite(t0) and math.isfinite(t1) and t1 > 0 else math.nan
        r["efficiency"] = r["speedup"] / k if math.isfinite(r["speedup"]) else math.nan
        s0, s1 = base["steps_per_s_median"], r["steps_per_s_median"]
        r["throughput_speedup"] = s1 / s0 if s0 and math.isfinite(s0) and math.isfinite(s1) else math.nan
        r["throughput_efficiency"] = r["throughput_speedup"] / k if math.isfinite(r["throughput_speedup"]) else math.nan
        # against the reference system at the same task and pods
        r["reference"], r["time_ratio"], r["time_ratio_bound"] = ref, math.nan, ""
        peer = next((q for q in out if q["task"] == r["task"] and q["system"] == ref and q["pods"] == r["pods"]), None)
        if peer is None:
            continue
        mine, theirs = r["time_to_target_median"], peer["time_to_target_median"]
        if math.isfinite(mine) and math.isfinite(theirs) and theirs > 0:
            r["time_ratio"], r["time_ratio_bound"] = mine / theirs, "="
        elif math.isfinite(theirs) and theirs > 0 and math.isfinite(r["time_to_target_bound"]):
            r["time_ratio"], r["time_ratio_bound"] = r["time_to_target_bound"] / theirs, ">="
        elif math.isfinite(mine) and math.isfinite(peer["time_to_target_bound"]) and peer["time_to_target_bound"] > 0:
            r["time_ratio"], r["time_ratio_bound"] = mine / peer["time_to_target_bound"], "<="
    return _typed(Table.from_rows(out, SCALING_COLUMNS), SCALING_COLUMNS)


def _num(v: float, fmt: str = "{:.1f}") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def scaling_markdown(sc: Table) -> str:
    """The scaling table as Markdown (one line per task x system x pods), for bench/RESULTS.md
    and the study's report: time to target as median [min, max] over seeds, or ``not reached
    (> bound s)``; throughput; speed-up and efficiency; the ratio to the reference system."""
    if not len(sc):
        return "(no runs)\n"
    ref = str(sc["reference"][0])
    metric = str(sc["metric"][0])
    lines = [f"| task | system | pods | GPUs | CPUs | nodes | seeds | reached | time to {metric} target (s), median "
             f"[min, max] | env steps to target (median) | env steps/s (median) | speed-up | efficiency | "
             f"time / {ref} |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sc.rows():
        med, lo, hi = r["time_to_target_median"], r["time_to_target_min"], r["time_to_target_max"]
        if math.isnan(r["target"]):
            ttt = "no target"
        elif math.isfinite(med):
            ttt = f"{med:.1f} [{lo:.1f}, {'not reached' if math.isinf(hi) else f'{hi:.1f}'}]"
        else:
            ttt = f"not reached (> {_num(r['time_to_target_bound'])})" + (
                f"; {r['reached']} seed reached it at {lo:.1f}" if r["reached"] else "")
        ratio = {"=": "", ">=": "≥ ", "<=": "≤ "}.get(r["time_ratio_bound"])
        ratio = f"{ratio}{r['time_ratio']:.2f}x" if ratio is not None and r["time_ratio_bound"] else ""
        steps = _num(r["env_steps_to_target_median"], "{:,.0f}")
        lines.append(
            f"| {r['task']} | {r['system']} | {r['pods']} | {_num(r['gpus'], '{:g}')} | {_num(r['cpus'], '{:g}')} | "
            f"{r['nodes']} | {r['seeds']} | {r['reached']}/{r['seeds']} | {ttt} | "
            f"{'not reached' if steps == 'inf' else steps} | {_num(r['steps_per_s_median'], '{:,.0f}')} | "
            f"{_num(r['speedup'], '{:.2f}')} | {_num(r['efficiency'], '{:.2f}')} | {ratio or 'n/a'} |")
    return "\n".join(lines) + "\n"
