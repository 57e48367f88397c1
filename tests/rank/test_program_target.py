"""The rank program under a real mpiexec, ended by its target return (``eval.stop_at_return``):
the first pod to reach it is never cut short by another's notice, the run is complete, and a run
again leaves it as it is. (The rank program's other end-to-end tests: tests/test_pod.py,
tests/system/test_chaos.py.)"""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli, run_mpi

from podracer_hpc.files.h5log import read_log

pytestmark = pytest.mark.mpi
TARGET = -900.0  # Pendulum's first evaluations are near -1,200; the job's pods pass -900 within 20k env steps
BUDGET = 200_000  # env steps a pod: far more than the target takes


def train(n: int, run: Path, *sets: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    args = ["-m", "podracer_hpc.cli", "train", "jobs/pendulum_fast.yaml", "--run-dir", str(run), *extra]
    for kv in (
        f"total_env_steps={BUDGET}",
        "eval.interval_env_steps=4096",
        "eval.episodes=8",
        "eval.final_episodes=8",
        *sets,
    ):
        args += ["--set", kv]
    return run_mpi(n, *args)


def first_crossings(run: Path, n: int) -> dict[int, int | None]:
    """Env steps of each pod's first evaluation at or above the target, from its log."""
    out = {}
    for i in range(n):
        ev = read_log(run / "logs" / f"pendulum_fast_rank{i}.h5")["eval"]
        hit = np.flatnonzero(np.asarray(ev["return_mean"]) >= TARGET)
        out[i] = int(ev["env_steps"][hit[0]]) if len(hit) else None
    return out


@pytest.mark.parametrize("mode", ["none", "elegantrl", "async"])
def test_the_pool_ends_where_its_first_pod_reaches_the_target(tmp_path, mode):
    """3 pods without rounds (they never meet while training), with a round every 8,192 env steps,
    or with asynchronous PBT rounds: the run ends complete long before its budget, at the env steps
    where the first pod reached the target, and every pod trained and evaluated at least that far
    (so no pod that would have reached it sooner was stopped first)."""
    run = tmp_path / mode
    tournament = ("tournament.mode=pbt", "tournament.sync=async") if mode == "async" else (f"tournament.mode={mode}",)
    r = train(3, run, f"eval.stop_at_return={TARGET}", *tournament, "tournament.interval_env_steps=8192")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert "complete" not in summary  # complete: only an incomplete summary says so
    hits = first_crossings(run, 3)
    first = min(e for e in hits.values() if e is not None)
    assert summary["ended_at_target"] == {"env_steps": first, "pods": [i for i, e in hits.items() if e == first]}
    records = [json.loads((run / "pods" / f"pod{i}.json").read_text()) for i in range(3)]
    assert all(rec["state"] == "done" and rec["target_end"] for rec in records)
    assert all(first <= rec["env_steps"] < BUDGET // 4 for rec in records), [rec["env_steps"] for rec in records]
    assert all(rec["reached"] == hits[i] for i, rec in enumerate(records))
    assert all(isinstance(rec["verdict"], list) for rec in records)  # the final evaluation, as at a budget's end
    for i in range(3):
        ev = read_log(run / "logs" / f"pendulum_fast_rank{i}.h5")["eval"]
        assert int(np.max(ev["env_steps"])) >= first, i
    if mode != "none":
        assert summary["rounds"] >= 1
    assert "eval.stop_at_return -900 reached by pod" in r.stderr
    status = run_cli("status", str(run), timeout=120)
    assert f"finished at its target (eval.stop_at_return): pod {summary['ended_at_target']['pods'][0]}" in status.stdout
    if mode != "none":
        return
    # a run again is told the run is complete and changes nothing (once: it reads files only)
    before = (run / "summary.json").stat().st_mtime_ns
    again = train(3, run, f"eval.stop_at_return={TARGET}", *tournament, "tournament.interval_env_steps=8192")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "is complete" in again.stderr and (run / "summary.json").stat().st_mtime_ns == before


def test_a_stop_before_the_target_resumes_and_trains_to_the_budget(tmp_path):
    """With a target no pod reaches, a stop is a stop (resumable, the run incomplete) and the
    resumed run trains its whole budget, as without a target."""
    run = tmp_path / "run"
    sets = ("eval.stop_at_return=1000", "tournament.mode=none", "total_env_steps=16384")
    r = train(2, run, *sets, extra=("--stop-after-updates", "2"))
    assert r.returncode == 75, r.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is False and summary["pods_stopped"] == [0, 1]
    r = train(2, run, *sets)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert "complete" not in summary and "ended_at_target" not in summary
    records = [json.loads((run / "pods" / f"pod{i}.json").read_text()) for i in range(2)]
    assert [(rec["env_steps"], rec["reached"], rec["target_end"]) for rec in records] == [(16384, None, False)] * 2
