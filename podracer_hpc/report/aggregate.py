"""Tidy tables from the per-rank HDF5 logs of one or many run directories.

A run directory (``podracer train --run-dir``) holds ``config.yaml``, ``logs/<name>_rank<r>.h5``
(``docs/hdf5-schema.md``) and, once the run has ended, ``summary.json``. Logs are read with
:func:`podracer_hpc.files.h5log.read_log`, which also reads a file that is still being written.

Tables are :class:`Table` objects: named numpy columns of one length (no pandas needed;
``Table.to_pandas()`` if you have it):

- :func:`eval_table`: one row per run x pod x evaluation (the tidy table of the learning curves);
- :func:`run_table`: one row per run (throughput, best and final return, time to a target);
- :func:`tournament_table`: one row per run x pod x tournament round (action, source, hparams);
- :func:`scaling_table`: one row per system x task x resource point (pods): time to target over
  seeds (median, range, how many reached it, the bound when not), throughput, speed-up,
  efficiency, and the ratio to a reference system at the same resources; and the same target in
  *device-equivalent* time (:class:`DeviceModel`, :func:`device_markdown`).

Device-equivalent time is what a pool would take when every pod has its own device, read from
logs made anywhere (a loaded 2-core machine included): ``env steps per pod to the target x
seconds per env step of one pod on its device + seconds spent in rounds`` (+ a modelled
all-reduce for one learner with N times the envs). The first factor comes from the logs and does
not depend on the machine's load; the second from a named source (a one-pod run of the same
system, or a value given); the third from the ``/tournament`` rows (``docs/studies.md``).

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

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np

from podracer_hpc.files.records import read_records
from podracer_hpc.report.curves import MIN_RUNS_FOR_BAND, REDUCERS, mean_curve, run_curves, t95
from podracer_hpc.report.runs import Run, RunDirError, expand_run_dirs, job_id, load_run, load_runs
from podracer_hpc.report.tables import Table, read_csv, typed

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
    "DeviceModel",
    "SCHEMES",
    "device_markdown",
    "device_verdicts",
    "paired_seeds",
    "paired_difference",
    "verdicts_markdown",
    "run_costs",
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


EVAL_COLUMNS = (
    "system",
    "task",
    "run",
    "pod",
    "seed",
    "pods",
    "mode",
    "num_envs",
    "eval_index",
    "update",
    "env_steps",
    "wall_s",
    "return_mean",
    "return_std",
    "return_min",
    "return_max",
    "episodes",
    "cumulative_return",
    "device_type",
    "host",
    "git_revision",
    "run_dir",
)

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
                rows.append(
                    {
                        "system": run.system,
                        "task": run.task,
                        "run": run.run,
                        "pod": int(a.get("rank", rank)),
                        "seed": int(a.get("seed", -1)),
                        "pods": run.pods,
                        "mode": run.mode,
                        "num_envs": run.num_envs,
                        "eval_index": i,
                        **{
                            k: ev[k][i].item()
                            for k in (
                                "update",
                                "env_steps",
                                "wall_s",
                                "return_mean",
                                "return_std",
                                "return_min",
                                "return_max",
                                "episodes",
                            )
                        },
                        "cumulative_return": float(ev["return_mean"][i]) * cr if cr is not None else math.nan,
                        "device_type": str(a.get("device_type", "")),
                        "host": str(a.get("host", "")),
                        "git_revision": str(a.get("git_revision", "")),
                        "run_dir": str(run.path),
                    }
                )
    return typed(Table.from_rows(rows, EVAL_COLUMNS), EVAL_COLUMNS)


def first_crossing(x: Any, y: Any, target: float) -> float:
    """The first ``x[i]`` (in the given order) with ``y[i] >= target``; NaN if none (NaN y never crosses)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    hit = np.flatnonzero(np.nan_to_num(y, nan=-np.inf) >= target)
    return float(x[hit[0]]) if len(hit) else math.nan


Targets = Union[float, Mapping[str, float], None]


def target_for(targets: Targets, task: str) -> float | None:
    """The target return of ``task``: ``targets`` is one number for every task, or ``{task: number}``
    (key ``"*"``: every other task; a task that names its env, ``gymnasium:Acrobot-v1``, is also
    found by its env id or its task name), or None."""
    if targets is None:
        return None
    if isinstance(targets, Mapping):  # a task that names its env (gymnasium:Acrobot-v1): that, the env id, the task
        base, _, env_id = task.partition(":")
        v = next((targets[k] for k in (task, env_id, base, "*") if k and k in targets), None)
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
        rows.append(
            {
                "system": t["system"][0],
                "task": t["task"][0],
                "run": run,
                "pods": int(t["pods"][0]),
                "target": goal,
                f"{x}_to_target": best if math.isfinite(best) else math.nan,
                "pod": pod,
            }
        )
    return typed(Table.from_rows(rows), ("system", "task", "run", "pods", "target", f"{x}_to_target", "pod"))


RUN_COLUMNS = (
    "system",
    "task",
    "run",
    "pods",
    "gpus",
    "cpus",
    "nodes",
    "mode",
    "num_envs",
    "seed",
    "env_steps",
    "wall_s",
    "steps_per_s",
    "steps_per_s_per_pod",
    "update_steps_per_s",
    "best_return",
    "best_return_se",
    "peak_return",
    "final_return",
    "best_pod",
    "rounds",
    "complete",
    "target",
    "metric",
    "wall_s_to_target",
    "env_steps_to_target",
    "scheme",
    "devices_per_learner",
    "env_steps_per_pod",
    "env_steps_per_pod_to_target",
    "round_s",
    "round_s_to_target",
    "rounds_to_target",
    "allreduce_s_to_target",
    "own_step_s",
    "device_step_s",
    "device_step_source",
    "device_s_to_target",
    "device_s_bound",
    "device_type",
    "host",
    "run_dir",
)

# How a run's pods map onto devices (``<run>/resources.json`` ``scheme``): ``pods``, one pod per
# device (a pool, best-of-N, random search); ``data_parallel``, one learner whose envs stand for
# ``pods`` devices' (one learner with N times the envs; RLlib's learners), so its env steps per
# device are its env steps / pods, and each gradient step costs an all-reduce.
SCHEMES = ("pods", "data_parallel")


@dataclass(frozen=True)
class DeviceModel:
    """Where device-equivalent time takes its constants from (a study file's ``device_step_s``,
    ``device_reference``, ``systems.<name>.device_step_s`` and ``allreduce.*``).

    Seconds per env step of one pod on its device: ``step_s_of[system]`` when given, else
    ``step_s``, else the median over seeds of the one-pod runs (``pods`` 1) of ``reference``
    (default: the system itself) of ``(training seconds - seconds in rounds) / env steps``.
    The all-reduce of one gradient step over ``N`` devices (``data_parallel`` runs, N > 1):
    ``2 x param_bytes / bandwidth + latency x log2 N`` (a ring's bytes, a tree's latency);
    ``param_bytes`` 0: 4 bytes per parameter the run's log records (``param_count``).
    Seconds of one round: ``round_s`` when given (a stated cost, e.g. measured on an idle machine or
    a GPU cluster), else each round's smallest ``tournament_s`` over the pods in the run's logs."""

    step_s: float = 0.0
    reference: str = ""
    step_s_of: Mapping[str, float] = field(default_factory=dict)
    allreduce_gbytes_per_s: float = 25.0
    allreduce_latency_s: float = 1e-5
    param_bytes: float = 0.0
    round_s: float = 0.0

    def allreduce_s(self, devices: int, param_count: float) -> float:
        """Seconds of one all-reduce of the gradients over ``devices`` (0 for one device; NaN
        when the parameter bytes are unknown)."""
        if devices <= 1:
            return 0.0
        nbytes = self.param_bytes if self.param_bytes > 0 else 4.0 * param_count
        if not nbytes > 0:
            return math.nan
        return 2.0 * nbytes / (self.allreduce_gbytes_per_s * 1e9) + self.allreduce_latency_s * math.log2(devices)

    def step_for(self, system: str, rows: Sequence[Mapping[str, Any]]) -> tuple[float, str]:
        """(seconds per env step of one pod of ``system``, where that number came from)."""
        if self.step_s_of.get(system, 0.0) > 0:
            return float(self.step_s_of[system]), f"systems.{system}.device_step_s"
        if self.step_s > 0:
            return float(self.step_s), "device_step_s"
        ref = self.reference or system
        own = [float(r["own_step_s"]) for r in rows if r["system"] == ref and int(r["pods"]) == 1]
        own = [v for v in own if math.isfinite(v)]
        if not own:
            return math.nan, f"none: no one-pod run of {ref} (add point 1, or set device_step_s)"
        return float(np.median(own)), f"{ref} at 1 pod ({len(own)} run{'s' * (len(own) != 1)})"


def run_costs(run: Run) -> dict[str, Any]:
    """What device-equivalent time reads from one run's logs: ``rounds`` (one ``(env_steps,
    seconds)`` per round: the pods' fewest env steps at it and their smallest ``tournament_s``:
    the last pod to arrive waits for nobody, so its seconds are the round's own work, not the
    time-sharing skew of the machine the logs were made on), ``final_steps`` (each pod's last
    env steps), ``own_step_s`` (median over pods of ``(training seconds - own round seconds) /
    env steps``), ``param_count`` and ``grad_steps(x)``: the gradient steps up to env step ``x``
    of pod 0 (PPO: its updates x epochs x minibatches; SAC/TD3: the logged ``grad_steps``)."""
    per_round: dict[int, list[tuple[int, float]]] = {}
    final, own = [], []
    for log in run.logs.values():
        to, tr = log["tournament"], log["train"]
        ts = np.asarray(to.get("tournament_s", ()), dtype=float)
        for i, rnd in enumerate(to.get("round", ())):
            per_round.setdefault(int(rnd), []).append((int(to["env_steps"][i]), float(ts[i])))
        if len(tr.get("env_steps", ())):
            steps, wall = int(tr["env_steps"][-1]), float(tr["wall_s"][-1])
            final.append(steps)
            own.append((wall - float(np.nansum(ts))) / steps if steps > 0 else math.nan)
    rounds = []
    for rnd in sorted(per_round):
        secs = [t for _, t in per_round[rnd] if math.isfinite(t)]
        rounds.append((min(s for s, _ in per_round[rnd]), min(secs) if secs else 0.0))
    first = run.logs[min(run.logs)] if run.logs else {"train": {}, "attrs": {}}
    agent = ((first["attrs"].get("config") or run.config).get("agent")) or {}
    per_update = int(agent.get("update_epochs", 1) or 1) * int(agent.get("num_minibatches", 1) or 1)
    tr0 = first["train"]

    def grad_steps(x: float) -> float:
        steps = np.asarray(tr0.get("env_steps", ()), dtype=float)
        upto = steps <= x
        g = np.asarray(tr0.get("grad_steps", np.full(len(steps), -1)), dtype=float)[upto]
        return float(g[g >= 0].sum()) if (g >= 0).any() else float(upto.sum() * per_update)

    return {
        "rounds": rounds,
        "final_steps": final,
        "own_step_s": float(np.nanmedian(own)) if np.isfinite(own).any() else math.nan,
        "param_count": float(first["attrs"].get("param_count", math.nan)),
        "grad_steps": grad_steps,
    }


def _device_row(run: Run, row: dict[str, Any], device: DeviceModel) -> dict[str, Any]:
    """A run's device-equivalent columns, except those that need the other runs (the step seconds)."""
    costs = run_costs(run)
    m = run.devices_per_learner  # a learner's envs stand for m devices': per device, its env steps / m
    x = float(row["env_steps_to_target"])
    reached = math.isfinite(x)
    budget = float(max(costs["final_steps"], default=0))
    ar = device.allreduce_s(m, costs["param_count"])
    upto = x if reached else math.inf
    if device.round_s > 0:  # a stated cost per round instead of the seconds the logs measured
        costs["rounds"] = [(steps, device.round_s) for steps, _ in costs["rounds"]]
    return {
        "scheme": run.scheme,
        "devices_per_learner": m,
        "env_steps_per_pod": budget / m,
        "env_steps_per_pod_to_target": x / m if reached else math.nan,
        "round_s": float(sum(t for _, t in costs["rounds"])),
        "round_s_to_target": float(sum(t for s, t in costs["rounds"] if s < upto)),
        "rounds_to_target": sum(1 for s, _ in costs["rounds"] if s < upto),
        "allreduce_s_to_target": (ar * costs["grad_steps"](upto) if ar else 0.0),
        "own_step_s": costs["own_step_s"],
    }


def _with_device_time(rows: list[dict[str, Any]], device: DeviceModel) -> None:
    """Fill in each row's step seconds (from its named source) and device-equivalent time: to the
    target when reached, else the bound the run's whole budget took (censored)."""
    for r in rows:
        r["device_step_s"], r["device_step_source"] = device.step_for(str(r["system"]), rows)
        if device.round_s > 0 and r["round_s"] > 0:
            r["device_step_source"] += f"; rounds {device.round_s:g} s each (round_s)"
        steps = r["env_steps_per_pod_to_target"] if math.isfinite(r["env_steps_per_pod_to_target"]) else None
        total = (steps if steps is not None else r["env_steps_per_pod"]) * r["device_step_s"]
        total += r["round_s_to_target"] + r["allreduce_s_to_target"]
        r["device_s_to_target"] = total if steps is not None else math.nan
        r["device_s_bound"] = total if steps is None and math.isfinite(r["target"]) else math.nan


def run_table(
    runs: Sequence[Run], target: Targets = None, metric: str = "return", device: DeviceModel | None = None
) -> Table:
    """One row per run.

    ``env_steps``: summed over pods (last train row of each); ``wall_s``: the slowest pod's
    training seconds; ``steps_per_s`` = env_steps / wall_s (the pool's throughput, evaluation and
    tournament included); ``update_steps_per_s``: the sum over pods of their median per-update
    throughput (training only); ``best_return``, ``best_return_se``, ``best_pod``: the run's verdict
    (summary.json: every pod evaluated once more on one common set, ``eval.final_episodes``) when
    the run has one, else the best evaluation of any pod (standard error NaN); ``peak_return``: the
    best evaluation of any pod at any time; ``final_return``: the best of the pods' last evaluations;
    ``wall_s_to_target`` / ``env_steps_to_target``: the first
    evaluation of any pod at or above the target of the run's task (a number for all tasks, or
    ``{task: number}``; NaN if never reached or no target) of ``metric`` (:data:`METRICS`:
    ``return``, or ``cumulative_return`` for stock trading); ``pods``, ``gpus``, ``cpus``,
    ``nodes``: :attr:`Run.resources`.

    Device-equivalent time (``device``: its constants, default :class:`DeviceModel`'s):
    ``scheme`` (:data:`SCHEMES`); ``devices_per_learner`` (:attr:`Run.devices_per_learner`: all the
    pods of a data-parallel run, a study's ``devices_per_pod``, else 1); ``env_steps_per_pod`` (the
    budget per device: a learner's env steps / its devices) and ``env_steps_per_pod_to_target``; ``round_s`` and
    ``round_s_to_target`` (the rounds before the crossing, :func:`run_costs`);
    ``allreduce_s_to_target`` (a learner of several devices: one all-reduce over them per gradient
    step); ``own_step_s`` (this run's seconds per env step of a pod, rounds
    left out); ``device_step_s`` and ``device_step_source`` (the number used and where it came
    from); ``device_s_to_target`` = steps per pod x step seconds + round seconds + all-reduce
    seconds (NaN when not reached); ``device_s_bound``: the same over the whole budget for a run
    that did not reach the target (censored: its time is at least that).
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
            "system": run.system,
            "task": run.task,
            "run": run.run,
            "pods": int(res["pods"]),
            "gpus": float(res["gpus"]),
            "cpus": float(res["cpus"]),
            "nodes": int(res["nodes"]),
            "mode": run.mode,
            "num_envs": run.num_envs,
            "seed": int(run.config.get("seed", -1)),
            "env_steps": env_steps,
            "wall_s": wall,
            "steps_per_s": env_steps / wall if wall and wall > 0 else math.nan,
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
        row.update(_device_row(run, row, device or DeviceModel()))
        verdict = run.summary if run.summary is not None and run.summary.get("final_episodes") else None
        if verdict is not None and verdict.get("best_return") is not None:  # the common-ground verdict
            row.update(
                best_return=float(verdict["best_return"]),
                best_pod=int(verdict.get("best_pod", -1)),
                best_return_se=float(verdict.get("best_return_se") or math.nan),
            )
        rows.append(row)
    _with_device_time(rows, device or DeviceModel())
    return typed(Table.from_rows(rows, RUN_COLUMNS), RUN_COLUMNS)


def _rounds(run: Run) -> int:
    r = [
        int(log["tournament"]["round"][-1]) + 1 for log in run.logs.values() if len(log["tournament"].get("round", ()))
    ]
    return max(r) if r else 0


def _lookup(t: Table | None, run: str, col: str) -> float:
    if t is None or not len(t):
        return math.nan
    m = t["run"] == run
    return float(t[col][m][0]) if m.any() else math.nan


TOURNAMENT_COLUMNS = (
    "system",
    "task",
    "run",
    "pod",
    "pods",
    "mode",
    "round",
    "env_steps",
    "wall_s",
    "fitness",
    "action",
    "source",
    "source_job",
    "source_pod",
    "source_round",
    "source_internal",
    "rejected",
    "tournament_s",
    "old_hparams",
    "new_hparams",
    "algo",
)


def tournament_table(runs: Sequence[Run]) -> Table:
    """One row per run x pod x tournament round, with the source entry id parsed
    (``source_job``/``source_pod``/``source_round``; ``source_internal``: the entry came from this
    run's own pods), the pod's learner (``algo``) and the new hyperparameters as ``hp_<name>`` columns."""
    rows = []
    for run in runs:
        job = run.job
        for rank, log in run.logs.items():
            to = log["tournament"]
            algo = str(((log["attrs"].get("config") or {}).get("agent") or {}).get("algo", "ppo"))  # the rank's config
            for rec in read_records(to):
                src, name = rec.source, rec.source.entry
                pod = rec.source.pod
                internal = pod is not None and (name is None or name.job == job) and pod < run.pods
                row = {
                    "system": run.system,
                    "task": run.task,
                    "run": run.run,
                    "pod": int(rank),
                    "pods": run.pods,
                    "mode": run.mode,
                    "round": rec.round,
                    "env_steps": rec.env_steps,
                    "wall_s": rec.wall_s,
                    "fitness": rec.fitness,
                    "action": rec.action,
                    "source": src.id,
                    "source_job": name.job if name else "",
                    "source_pod": pod if pod is not None else -1,
                    "source_round": name.round if name else -1,
                    "source_internal": internal,
                    "rejected": src.rejected,
                    "tournament_s": rec.tournament_s,
                    "old_hparams": json.dumps(rec.old_hparams),
                    "new_hparams": json.dumps(rec.new_hparams),
                    "algo": rec.algo or algo,
                }
                for k, v in _hparams(row["new_hparams"]).items():
                    row[f"hp_{k}"] = v
                rows.append(row)
    return typed(Table.from_rows(rows, TOURNAMENT_COLUMNS), TOURNAMENT_COLUMNS)


def _hparams(s: str) -> dict[str, float]:
    try:
        d = json.loads(s) if s else {}
    except json.JSONDecodeError:
        return {}
    return (
        {str(k): float(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if isinstance(d, dict)
        else {}
    )


SCALING_COLUMNS = (
    "task",
    "system",
    "pods",
    "gpus",
    "cpus",
    "nodes",
    "seeds",
    "reached",
    "target",
    "metric",
    "time_to_target_median",
    "time_to_target_min",
    "time_to_target_max",
    "time_to_target_bound",
    "env_steps_to_target_median",
    "steps_per_s_median",
    "steps_per_s_min",
    "steps_per_s_max",
    "speedup",
    "efficiency",
    "throughput_speedup",
    "throughput_efficiency",
    "reference",
    "time_ratio",
    "time_ratio_bound",
    "env_steps_per_pod_to_target_median",
    "env_steps_per_pod_to_target_min",
    "env_steps_per_pod_to_target_max",
    "env_steps_per_pod_bound",
    "device_s_mean",
    "device_s_ci",
    "device_s_median",
    "device_s_min",
    "device_s_max",
    "device_s_censored",
    "device_s_bound",
    "device_speedup",
    "device_efficiency",
    "device_step_s",
    "device_step_source",
    "device_round_s_mean",
    "device_rounds_mean",
    "device_s_seeds",
)


def _censored_median(reached: Sequence[float], n: int) -> float:
    """Median over ``n`` seeds of which ``reached`` got there (the others count as +inf, never
    reached): finite when more than half reached, else inf."""
    vals = sorted(list(reached) + [math.inf] * (n - len(reached)))
    if not vals:
        return math.nan
    m = len(vals)
    return vals[m // 2] if m % 2 else (vals[m // 2 - 1] + vals[m // 2]) / 2


def _device_stats(v: Table) -> dict[str, Any]:
    """The device-equivalent columns of one task x system x pods (its runs are the seeds)."""
    n = len(v)
    col = {
        k: np.asarray(v[k], dtype=float) if k in v else np.full(n, math.nan)
        for k in (
            "device_s_to_target",
            "device_s_bound",
            "env_steps_per_pod_to_target",
            "env_steps_per_pod",
            "device_step_s",
            "round_s_to_target",
            "rounds_to_target",
        )
    }
    t, bound = col["device_s_to_target"], col["device_s_bound"]
    hit, miss = np.isfinite(t), ~np.isfinite(t) & np.isfinite(bound)
    known = hit | miss
    vals = np.where(hit, t, bound)[known]  # a censored seed counts at its bound: the mean is then a lower bound
    mean = float(vals.mean()) if len(vals) else math.nan
    ci = math.nan
    if hit.sum() == n >= MIN_RUNS_FOR_BAND:
        ci = _t_half_width(vals)
    steps = col["env_steps_per_pod_to_target"]
    sh = steps[np.isfinite(steps)]
    src = sorted({str(x) for x in v["device_step_source"].tolist()}) if "device_step_source" in v else []
    return {
        "env_steps_per_pod_to_target_median": _censored_median(sh.tolist(), n),
        "env_steps_per_pod_to_target_min": float(sh.min()) if len(sh) else math.inf,
        "env_steps_per_pod_to_target_max": math.inf if len(sh) < n else float(sh.max()),
        "env_steps_per_pod_bound": float(col["env_steps_per_pod"][~np.isfinite(steps)].max())
        if len(sh) < n
        else math.nan,
        "device_s_mean": mean,
        "device_s_ci": ci,
        "device_s_median": _censored_median(t[hit].tolist(), n) if known.any() else math.nan,
        "device_s_min": float(t[hit].min()) if hit.any() else (math.inf if known.any() else math.nan),
        "device_s_max": (math.inf if miss.any() else float(t[hit].max())) if known.any() else math.nan,
        "device_s_censored": int(miss.sum()),
        "device_s_bound": float(bound[miss].max()) if miss.any() else math.nan,
        "device_step_s": float(np.nanmedian(col["device_step_s"]))
        if np.isfinite(col["device_step_s"]).any()
        else math.nan,
        "device_step_source": "; ".join(src),
        "device_round_s_mean": float(col["round_s_to_target"][known].mean()) if known.any() else math.nan,
        "device_rounds_mean": float(col["rounds_to_target"][known].mean()) if known.any() else math.nan,
        "device_s_seeds": json.dumps(
            {
                str(int(float(seed))): [float(t[i] if hit[i] else bound[i]), int(miss[i])]
                for i, seed in enumerate(v["seed"].tolist() if "seed" in v else [])
                if known[i]
            },
            sort_keys=True,
        ),
    }


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
        return typed(Table.from_rows([]), SCALING_COLUMNS)
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
                rows.append(
                    {
                        "task": str(task),
                        "system": str(system),
                        "pods": pods,
                        "gpus": float(np.nanmax(v["gpus"])) if np.isfinite(v["gpus"].astype(float)).any() else math.nan,
                        "cpus": float(np.nanmax(v["cpus"])) if np.isfinite(v["cpus"].astype(float)).any() else math.nan,
                        "nodes": int(np.max(v["nodes"])),
                        "seeds": n,
                        "reached": int(len(hit)),
                        "target": target,
                        "metric": str(v["metric"][0]) if "metric" in v else "return",
                        "time_to_target_median": _censored_median(hit.tolist(), n)
                        if math.isfinite(target)
                        else math.nan,
                        "time_to_target_min": (float(hit.min()) if len(hit) else math.inf)
                        if math.isfinite(target)
                        else math.nan,
                        "time_to_target_max": (math.inf if miss.any() else float(ttt.max()))
                        if math.isfinite(target)
                        else math.nan,
                        "time_to_target_bound": float(np.nanmax(np.asarray(v["wall_s"], dtype=float)[miss]))
                        if miss.any() and math.isfinite(target)
                        else math.nan,
                        "env_steps_to_target_median": _censored_median(esteps[np.isfinite(esteps)].tolist(), n)
                        if math.isfinite(target)
                        else math.nan,
                        "steps_per_s_median": float(np.median(sps)) if len(sps) else math.nan,
                        "steps_per_s_min": float(sps.min()) if len(sps) else math.nan,
                        "steps_per_s_max": float(sps.max()) if len(sps) else math.nan,
                        **_device_stats(v),
                    }
                )
    out = rows
    for r in out:  # speed-up and efficiency against the same system's fewest pods
        base = min((q for q in out if q["task"] == r["task"] and q["system"] == r["system"]), key=lambda q: q["pods"])
        k = r["pods"] / base["pods"]
        t0, t1 = base["time_to_target_median"], r["time_to_target_median"]
        r["speedup"] = t0 / t1 if math.isfinite(t0) and math.isfinite(t1) and t1 > 0 else math.nan
        r["efficiency"] = r["speedup"] / k if math.isfinite(r["speedup"]) else math.nan
        d0, d1 = base["device_s_median"], r["device_s_median"]
        r["device_speedup"] = d0 / d1 if math.isfinite(d0) and math.isfinite(d1) and d1 > 0 else math.nan
        r["device_efficiency"] = r["device_speedup"] / k if math.isfinite(r["device_speedup"]) else math.nan
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
    return typed(Table.from_rows(out, SCALING_COLUMNS), SCALING_COLUMNS)


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
    lines = [
        f"| task | system | pods | GPUs | CPUs | nodes | seeds | reached | time to {metric} target (s), median "
        f"[min, max] | env steps to target (median) | env steps/s (median) | speed-up | efficiency | "
        f"time / {ref} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sc.rows():
        med, lo, hi = r["time_to_target_median"], r["time_to_target_min"], r["time_to_target_max"]
        if math.isnan(r["target"]):
            ttt = "no target"
        elif math.isfinite(med):
            ttt = f"{med:.1f} [{lo:.1f}, {'not reached' if math.isinf(hi) else f'{hi:.1f}'}]"
        else:
            ttt = f"not reached (> {_num(r['time_to_target_bound'])})" + (
                f"; {r['reached']} seed reached it at {lo:.1f}" if r["reached"] else ""
            )
        ratio = {"=": "", ">=": "≥ ", "<=": "≤ "}.get(r["time_ratio_bound"])
        ratio = f"{ratio}{r['time_ratio']:.2f}x" if ratio is not None and r["time_ratio_bound"] else ""
        steps = _num(r["env_steps_to_target_median"], "{:,.0f}")
        lines.append(
            f"| {r['task']} | {r['system']} | {r['pods']} | {_num(r['gpus'], '{:g}')} | {_num(r['cpus'], '{:g}')} | "
            f"{r['nodes']} | {r['seeds']} | {r['reached']}/{r['seeds']} | {ttt} | "
            f"{'not reached' if steps == 'inf' else steps} | {_num(r['steps_per_s_median'], '{:,.0f}')} | "
            f"{_num(r['speedup'], '{:.2f}')} | {_num(r['efficiency'], '{:.2f}')} | {ratio or 'n/a'} |"
        )
    return "\n".join(lines) + "\n"


def _censored(v: float, fmt: str) -> str:
    return "n/a" if not math.isfinite(v) else fmt.format(v)


def device_markdown(sc: Table) -> str:
    """Device-equivalent time to the target as Markdown (one line per task x system x pods):
    env steps per pod to the target (median [min, max] over seeds), device-equivalent seconds
    (mean +- the 95% t half-width with at least 3 seeds, all reached; ``≥ mean`` when a seed did not
    reach it, counted at its budget's time: a censored lower bound), the wall seconds of this
    machine beside them, and where the seconds per env step came from. A seed that did not reach
    the target is never dropped: ``≥`` marks it."""
    if not len(sc):
        return "(no runs)\n"
    lines = [
        "| task | system | pods | seeds | reached | env steps per pod to target, median [min, max] | "
        "device-equivalent s to target, mean ± 95% t | device-equivalent speed-up | wall s to target (median, "
        "this machine) | s per env step (source) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sc.rows():
        if not math.isfinite(r["target"]):
            continue
        med, lo, hi = (r[f"env_steps_per_pod_to_target_{k}"] for k in ("median", "min", "max"))
        budget = _censored(r["env_steps_per_pod_bound"], "{:,.0f}")
        if math.isfinite(med):
            steps = f"{med:,.0f} [{lo:,.0f}, {'≥ ' + budget if math.isinf(hi) else f'{hi:,.0f}'}]"
        else:
            steps = f"≥ {budget} (budget)"
        mean, ci, cens = r["device_s_mean"], r["device_s_ci"], int(r["device_s_censored"])
        if not math.isfinite(mean):
            dev = "n/a"
        elif cens:
            dev = f"≥ {mean:.3g} ({cens} of {r['seeds']} censored at the budget)"
        else:
            dev = f"{mean:.3g}" + (
                f" ± {ci:.2g}" if math.isfinite(ci) else f" [{r['device_s_min']:.3g}, {r['device_s_max']:.3g}]"
            )
        wall = r["time_to_target_median"]
        wall_s = f"{wall:.1f}" if math.isfinite(wall) else f"≥ {_num(r['time_to_target_bound'])}"
        lines.append(
            f"| {r['task']} | {r['system']} | {r['pods']} | {r['seeds']} | {r['reached']}/{r['seeds']} | {steps} | "
            f"{dev} | {_num(r['device_speedup'], '{:.2f}')} | {wall_s} | "
            f"{_censored(r['device_step_s'], '{:.3g}')} ({r['device_step_source'] or 'n/a'}) |"
        )
    verdicts = verdicts_markdown(device_verdicts(sc))
    if verdicts:
        lines += ["", "Each system that holds rounds against the fastest that holds none (device-equivalent time):", ""]
        lines.append(verdicts.rstrip("\n"))
    return "\n".join(lines) + "\n"


VERDICT_COLUMNS = (
    "task",
    "pods",
    "system",
    "alternative",
    "system_s",
    "alternative_s",
    "lead",
    "lead_bound",
    "round_share",
    "break_even_round_s",
    "seeds_sooner",
    "seeds_same",
    "seeds_later",
    "seeds_unknown",
    "vs_best_of_n_s",
    "vs_best_of_n_ci",
    "vs_best_of_n_seeds",
    "vs_best_of_n",
)


def _t_half_width(x: np.ndarray) -> float:
    """The half-width of the 95% Student-t interval of the mean of ``x`` (at least 2 values)."""
    return t95(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)


def _seed_times(text: Any) -> dict[str, tuple[float, bool]]:
    """A scaling row's ``device_s_seeds`` (JSON: seed -> [seconds, censored]) as a dict."""
    try:
        data = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}
    return {str(k): (float(x), bool(c)) for k, (x, c) in data.items()}


def paired_seeds(mine: Any, theirs: Any) -> tuple[int, int, int, int]:
    """The seeds two systems both ran, compared one by one in device-equivalent time (for a
    tournament and random search one seed is one set of starting pods): how many ``mine`` reached
    sooner, at the same time, later, and unknown. A censored seed is only known to take at least
    its bound, so it loses to a seed that reached the target before that bound and is unknown
    otherwise."""
    a, b = _seed_times(mine), _seed_times(theirs)
    out = [0, 0, 0, 0]
    for seed in set(a) & set(b):
        (x, cx), (y, cy) = a[seed], b[seed]
        if not cx and not cy:
            k = 1 if math.isclose(x, y, rel_tol=1e-9) else 0 if x < y else 2
        elif cy and not cx:
            k = 0 if x < y else 3
        elif cx and not cy:
            k = 2 if y < x else 3
        else:
            k = 3
        out[k] += 1
    return out[0], out[1], out[2], out[3]


def paired_difference(mine: Any, theirs: Any) -> tuple[float, float, int, str]:
    """``mine - theirs`` in device-equivalent seconds over the seeds both ran and both reached the
    target on (a censored seed's time is only a bound, and a bound on either side would lean the
    difference one way): its mean, the half-width of its 95% t-interval, the number of seeds, and
    the verdict: ``worse`` (the interval lies above 0: later beyond the seeds' noise), ``better``
    (below 0), ``within noise``, or ``unknown`` (fewer than 2 such seeds)."""
    a, b = _seed_times(mine), _seed_times(theirs)
    d = np.array([a[s][0] - b[s][0] for s in set(a) & set(b) if not a[s][1] and not b[s][1]], dtype=float)
    if d.size < 2:
        return (float(d.mean()) if d.size else math.nan), math.nan, int(d.size), "unknown"
    mean, half = float(d.mean()), _t_half_width(d)
    verdict = "worse" if mean - half > 0 else "better" if mean + half < 0 else "within noise"
    return mean, half, int(d.size), verdict


# A lead's bound by which side had a censored seed (its mean is then a lower bound); both: neither
# mean is the time
_LEAD_BOUND = {(False, False): "", (True, False): "<=", (False, True): ">=", (True, True): "?"}


def device_verdicts(sc: Table, lead: float = 1.3, best_of_n: str = "best_of_n") -> Table:
    """Each system that holds rounds against the fastest system that holds none, per task and
    pods, in device-equivalent time (a :func:`scaling_table` with its device columns).

    ``lead`` = the alternative's mean device seconds / the system's (``lead_bound`` ``"<="`` when
    the system's seeds were censored at the budget, ``">="`` when only the alternative's were:
    a censored mean is a lower bound); ``seeds_sooner``/``_same``/``_later``/``_unknown``: the
    seeds compared one by one (:func:`paired_seeds`); ``round_share``: the system's mean seconds
    in rounds over its mean time; ``break_even_round_s``: the cost of one round at which the
    system would lead by the factor ``lead`` (its training time unchanged, the same number of
    rounds), when the system reached the target on every seed:
    ``(alternative / lead - training) / rounds``; 0 or less means it cannot lead by that much
    even with free rounds. When only the alternative had a
    censored seed its mean is a lower bound, and so is the break-even (``lead_bound`` ``">="``).
    ``vs_best_of_n*``: the system against the series named ``best_of_n`` (N independent pods) at
    the same task and pods, seed by seed (:func:`paired_difference`); ``vs_best_of_n`` is ``none``
    when the study has no such series there."""
    rows = [r for r in sc.rows() if math.isfinite(r["target"]) and math.isfinite(r["device_s_mean"])]
    out = []
    for r in rows:
        if not r["device_rounds_mean"] > 0:
            continue
        peers = [
            q for q in rows if q["task"] == r["task"] and q["pods"] == r["pods"] and not q["device_rounds_mean"] > 0
        ]
        if not peers:
            continue
        # the fastest alternative: every seed reached before any censored one, then the lower mean
        alt = min(peers, key=lambda q: (int(q["device_s_censored"]) > 0, q["device_s_mean"]))
        mine, theirs = float(r["device_s_mean"]), float(alt["device_s_mean"])
        censored = (int(r["device_s_censored"]) > 0, int(alt["device_s_censored"]) > 0)  # (its, the other's)
        bound = _LEAD_BOUND[censored]
        rounds_s, n = float(r["device_round_s_mean"]), float(r["device_rounds_mean"])
        even = (theirs / lead - (mine - rounds_s)) / n if bound in ("", ">=") and n > 0 else math.nan
        sooner, same, later, unknown = paired_seeds(r.get("device_s_seeds", ""), alt.get("device_s_seeds", ""))
        bon = [q for q in peers if q["system"] == best_of_n]
        vs = (
            paired_difference(r.get("device_s_seeds", ""), bon[0].get("device_s_seeds", ""))
            if bon
            else (math.nan, math.nan, 0, "none")
        )
        out.append(
            {
                "task": r["task"],
                "pods": r["pods"],
                "system": r["system"],
                "alternative": alt["system"],
                "system_s": mine,
                "alternative_s": theirs,
                "lead": theirs / mine if mine > 0 else math.nan,
                "lead_bound": bound,
                "round_share": rounds_s / mine if mine > 0 else math.nan,
                "break_even_round_s": even,
                "seeds_sooner": sooner,
                "seeds_same": same,
                "seeds_later": later,
                "seeds_unknown": unknown,
                "vs_best_of_n_s": vs[0],
                "vs_best_of_n_ci": vs[1],
                "vs_best_of_n_seeds": vs[2],
                "vs_best_of_n": vs[3],
            }
        )
    return typed(Table.from_rows(out, VERDICT_COLUMNS), VERDICT_COLUMNS)


def _vs_best_of_n(r: Mapping[str, Any]) -> str:
    """A verdict row's comparison with best of N, as a table cell."""
    what, n, mean, half = r["vs_best_of_n"], int(r["vs_best_of_n_seeds"]), r["vs_best_of_n_s"], r["vs_best_of_n_ci"]
    if what == "none":
        return "n/a (no best_of_n series)"
    if what == "unknown":
        return f"unknown ({n} seed{'s' if n != 1 else ''} both reached)"
    verdict = {"worse": "worse beyond noise", "better": "better beyond noise"}.get(what, what)
    return f"{mean:+.3g} ± {half:.2g} ({n}): {verdict}"


def verdicts_markdown(v: Table, lead: float = 1.3) -> str:
    """:func:`device_verdicts` as Markdown: one line per system that holds rounds."""
    if not len(v):
        return ""
    lines = [
        f"| task | pods | system | fastest system without rounds | device s: system / alternative | "
        f"lead | seeds, paired: sooner / same / later | share of its time in rounds | "
        f"leads by {lead:g}x while a round costs at most | against best of N: s later, 95% t (seeds both reached) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in v.rows():
        sign = {"": "", "<=": "≤ ", ">=": "≥ ", "?": "? "}[r["lead_bound"]]
        even, lower = r["break_even_round_s"], r["lead_bound"] == ">="
        if not math.isfinite(even):
            even_s = "n/a (a seed did not reach the target)"
        elif even <= 1e-9:  # (rounding: a break-even of exactly 0 s)
            even_s = (
                "? (the alternative's time is a lower bound)" if lower else "never (its training alone is too long)"
            )
        else:
            even_s = f"≥ {even:.3g} s" if lower else f"{even:.3g} s"
        paired = f"{int(r['seeds_sooner'])} / {int(r['seeds_same'])} / {int(r['seeds_later'])}"
        paired += f" ({int(r['seeds_unknown'])} unknown)" if int(r["seeds_unknown"]) else ""
        lines.append(
            f"| {r['task']} | {r['pods']} | {r['system']} | {r['alternative']} | "
            f"{r['system_s']:.3g} / {r['alternative_s']:.3g} | {sign}{r['lead']:.2f}x | {paired} | "
            f"{r['round_share']:.0%} | {even_s} | {_vs_best_of_n(r)} |"
        )
    return "\n".join(lines) + "\n"
