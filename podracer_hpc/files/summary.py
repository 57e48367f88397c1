"""The run's summary, assembled from the run directory: each pod writes its part when it ends.

A pod that ends (trained its budget, or the run reached its target return: ``done``;
checkpointed on a stop: ``stopped``) writes
``pods/pod<i>.json`` (:func:`write_record`) before anything else of its end, and a job's rank 0
then assembles ``summary.json`` from every pod record of the pool (:func:`assemble`). So:

- no pod waits for a final allgather of results: an asynchronous pod's part is on disk the moment
  it finishes, and ``podracer status`` sees it done while the others train;
- a pool of several jobs (``podracer submit --pods-per-job``) gets one summary: each job's end
  rewrites it from what every pod left, and the last job to end writes the complete one (each job
  writes its pods' records before it lists them: of two jobs ending together, at least the later
  lister sees both);
- a pod with no record (it died, or its job has not ended yet) or a stopped one is named in the
  summary (``pods_missing``, ``pods_stopped``), and the summary says ``"complete": false``.

A pod removes its own record when it starts, so a record is always from its latest start.
Nothing here imports torch, h5py or MPI.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from podracer_hpc.files.atomic import atomic_write_bytes
from podracer_hpc.files.bounded import read_json
from podracer_hpc.files.rundir import RunDir, make_dirs

__all__ = ["assemble", "clear_record", "describe_missing", "read_records", "write_record"]

STATES = ("done", "stopped")


def finite_or_none(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def write_record(rundir: RunDir, pod: int, record: dict[str, Any]) -> None:
    """Pod ``pod``'s part of the summary (``state`` done | stopped, and its numbers), atomically.
    Non-finite numbers are written as null (JSON has no NaN)."""
    if record.get("state") not in STATES:
        raise ValueError(f"a pod record's state must be one of {STATES}, got {record.get('state')!r}")
    clean = {k: (finite_or_none(v) if isinstance(v, float) else v) for k, v in record.items()}
    if isinstance(clean.get("verdict"), (list, tuple)):
        mean, se, (lo, hi) = clean["verdict"]
        clean["verdict"] = [finite_or_none(mean), finite_or_none(se), [finite_or_none(lo), finite_or_none(hi)]]
    clean.update(pod=pod, written=time.time())
    make_dirs(rundir.pods_dir)
    atomic_write_bytes(rundir.pod_record(pod), (json.dumps(clean) + "\n").encode(), mode=0o644, sync_dir=False)


def clear_record(rundir: RunDir, pod: int) -> None:
    """Remove pod ``pod``'s record (it starts again: a record must be from its latest start)."""
    rundir.pod_record(pod).unlink(missing_ok=True)


def read_records(rundir: RunDir, pods: range | list[int]) -> dict[int, dict[str, Any]]:
    """The readable records of ``pods`` (an unreadable or foreign one counts as missing)."""
    out: dict[int, dict[str, Any]] = {}
    for i in pods:
        try:
            rec = read_json(rundir.pod_record(i), what="pod record")
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("state") in STATES and rec.get("pod") == i:
            out[i] = rec
    return out


def _num(rec: dict[str, Any], key: str) -> float:
    v = rec.get(key)
    return float(v) if isinstance(v, (int, float)) else math.nan


def _ranges(pods: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out: list[str] = []
    for p in sorted(pods):
        if out and out[-1].rpartition("-")[2] == str(p - 1):
            head = out[-1].partition("-")[0]
            out[-1] = f"{head}-{p}"
        else:
            out.append(str(p))
    return ", ".join(out)


def assemble(
    records: dict[int, dict[str, Any]],
    pool_size: int,
    *,
    task: str,
    revision: str,
    tournament: bool,
    final_episodes: int = 0,
    final_eval_seed: int | None = None,
) -> dict[str, Any]:
    """The run's summary from the pods' records (pool indices 0..``pool_size``-1): totals over the
    pods that left a record, the best pod, the verdict on common start states when every pod is
    done with one, and which pods are missing or stopped (then ``"complete": false``)."""
    parts = [records[i] for i in sorted(records)]
    done = [i for i in range(pool_size) if records.get(i, {}).get("state") == "done"]
    missing = [i for i in range(pool_size) if i not in records]
    stopped = [i for i in range(pool_size) if records.get(i, {}).get("state") == "stopped"]
    complete = len(done) == pool_size
    finals = [f for p in parts if math.isfinite(f := _num(p, "final"))]
    bests = [b for p in parts if math.isfinite(b := _num(p, "best"))]
    run_wall = max((_num(p, "run_wall") for p in parts if math.isfinite(_num(p, "run_wall"))), default=0.0)
    summary: dict[str, Any] = {
        "task": task,
        "pods": pool_size,
        "env_steps": int(sum(_num(p, "env_steps") for p in parts if math.isfinite(_num(p, "env_steps")))),
        "wall_s": round(max((_num(p, "wall_s") for p in parts if math.isfinite(_num(p, "wall_s"))), default=0.0), 3),
        "steps_per_s": round(
            sum(_num(p, "run_steps") for p in parts if math.isfinite(_num(p, "run_steps"))) / max(run_wall, 1e-9), 1
        ),
        "best_return": max(bests) if bests else None,
        "final_return": max(finals) if finals else None,
        "git_revision": revision,
        "algos": [records.get(i, {}).get("algo") for i in range(pool_size)],  # each pod's learner, by pod
    }

    def key_best(i: int) -> float:
        b = _num(records[i], "best")
        return b if math.isfinite(b) else -math.inf

    best_pod = max(records, key=key_best) if records else None
    verdicts = {i: records[i].get("verdict") for i in records}
    if complete and final_episodes and all(isinstance(v, list) for v in verdicts.values()):

        def key_verdict(i: int) -> float:
            m = verdicts[i][0]
            return float(m) if isinstance(m, (int, float)) else -math.inf

        best_pod = max(verdicts, key=key_verdict)
        mean, se, (lo, hi) = verdicts[best_pod]
        summary.update(
            peak_return=summary["best_return"],
            best_return=mean,
            best_return_se=se,
            best_return_ci95=[lo, hi],
            final_episodes=final_episodes,
            final_eval_seed=final_eval_seed,
        )
    if not complete:
        summary["complete"] = False
        if missing:
            summary["pods_missing"] = missing  # no record: died, or its job has not ended (yet)
        if stopped:
            summary["pods_stopped"] = stopped  # checkpointed on a stop: run (or submit) again to resume
        summary["pods_done"] = len(done)
    reached = {i: r["reached"] for i, r in records.items() if isinstance(r.get("reached"), int) and r["reached"] > 0}
    if any(r.get("target_end") for r in parts) and reached:  # eval.stop_at_return ended the run
        first = min(reached.values())
        summary["ended_at_target"] = {"env_steps": first, "pods": [i for i in sorted(reached) if reached[i] == first]}
    if tournament or "final_episodes" in summary:
        summary["best_pod"] = best_pod
    if tournament:
        summary["rounds"] = max((int(p.get("rounds") or 0) for p in parts), default=0)
    unpublished = {i: int(records[i].get("publish_failed") or 0) for i in sorted(records)}
    if any(unpublished.values()):  # rounds whose winner could not write its entry (a full disk)
        summary["publish_failed"] = {str(i): n for i, n in unpublished.items() if n}
    jobs = sorted({str(p["job"]) for p in parts if p.get("job")})
    if len(jobs) > 1:
        summary["jobs"] = jobs
    return summary


def describe_missing(summary: dict[str, Any]) -> str:
    """One line naming the pods a summary lacks (for a job's end and for ``--wait``)."""
    bits = []
    if summary.get("pods_missing"):
        bits.append(f"no record from pod(s) {_ranges(summary['pods_missing'])} (died, or their job has not ended)")
    if summary.get("pods_stopped"):
        bits.append(f"pod(s) {_ranges(summary['pods_stopped'])} stopped with a checkpoint")
    return "; ".join(bits)
