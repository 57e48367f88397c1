"""What several benches do the same way: a table printed with aligned columns, and a pool of pods
of jobs/quickstart.yaml trained under mpiexec and judged by its verdict (podracer evaluate on the
summary's own common start states, every pod)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent


def print_table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(x).ljust(w) for x, w in zip(r, widths)))


def train_pool(
    run_dir: Path, pods: int, sets: Sequence[str], job: str = "jobs/quickstart.yaml", what: str = ""
) -> tuple[dict, list[float], float]:
    """Train ``pods`` pods of ``job`` under mpiexec; returns (summary, each pod's mean return on the
    verdict's start states, wall seconds). Exits with the run's stderr when it fails."""
    sys.path.insert(0, str(REPO))
    from podracer_hpc.launch import find_mpiexec

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PODRACER_COMM", None)
    t0 = time.perf_counter()
    r = subprocess.run(
        [
            find_mpiexec(),
            "-n",
            str(pods),
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "train",
            job,
            "--run-dir",
            str(run_dir),
            "--quiet",
            *sum((["--set", s] for s in sets), []),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{what or run_dir} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    ev = subprocess.run(
        [
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "evaluate",
            str(run_dir),
            "--top",
            "0",
            "--episodes",
            str(summary["final_episodes"]),
            "--seed",
            str(summary["final_eval_seed"]),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    return summary, [x["return_mean"] for x in json.loads(ev.stdout.strip().splitlines()[-1])["results"]], wall
