"""A monitor's poll as the logs grow: ``podracer status --watch`` / ``--wait`` at 10^3 vs 10^5 rows
per rank.

For each log length, a handful of rank logs are built (through h5log's writer), read once, then
a few rows are appended to each and one poll is timed, two ways side by side:

- ``incremental``: the :class:`live.Monitor` a watcher keeps (only the appended rows are read);
- ``full``: reading every log again (``h5log.read_log``, what a poll did before).

Prints a table, then one JSON line: the time per poll at each length and the ratios
long/short (incremental should stay near 1, full grows with the log).

    python bench/status_poll.py [--ranks 4] [--short 1000] [--long 100000] [--repeats 5]

``--pods 1024,4096``: a poll of a pool of that many simulated pods (a short log each), before
and after the parts' aggregates: ``logs`` (no aggregate: every changed log is opened), and
``aggregates`` (parts of ``--per-part`` pods, each written as its rank 0 writes
``parts/part<k>.json``: a poll reads one file per part).

    python bench/status_poll.py --pods 1024,4096 [--per-part 512]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from podracer_hpc.files import heartbeat
from podracer_hpc.files.h5log import H5Writer, read_log
from podracer_hpc.files.live import Monitor
from podracer_hpc.files.rundir import RunDir

CFG = {"name": "bench", "total_env_steps": 10**9, "env": {"name": "pendulum"}, "tournament": {"mode": "elegantrl"}}


def build(root: Path, ranks: int, rows: int) -> list[Path]:
    """``ranks`` logs of ``rows`` train rows (and an eval and a tournament row per 100)."""
    paths = []
    for r in range(ranks):
        p = root / "logs" / f"bench_rank{r}.h5"
        with H5Writer(p, {"config": CFG, "seed": r, "rank": r, "world_size": ranks}) as w:
            i = np.arange(rows)
            w.extend(
                "train",
                {
                    "update": i,
                    "env_steps": (i + 1) * 2048,
                    "wall_s": i * 0.1,
                    "steps_per_s": np.full(rows, 2e4),
                    "return_mean": -1000.0 + i * 1e-3,
                },
            )
            e = np.arange(max(1, rows // 100))
            w.extend("eval", {"env_steps": (e + 1) * 204800, "return_mean": -1000.0 + e})
            w.extend(
                "tournament",
                {
                    "round": e,
                    "env_steps": (e + 1) * 204800,
                    "fitness": -1000.0 + e,
                    "action": ["keep"] * len(e),
                    "source_kind": [""] * len(e),
                    "source_id": [""] * len(e),
                    "source_rejected": np.zeros(len(e), np.int64),
                },
            )
        paths.append(p)
    return paths


def append(paths: list[Path], start: int, k: int) -> None:
    for r, p in enumerate(paths):
        with H5Writer(p, {}) as w:
            i = np.arange(start, start + k)
            w.extend(
                "train",
                {"update": i, "env_steps": (i + 1) * 2048, "wall_s": i * 0.1, "steps_per_s": np.full(k, 2e4)},
                flush=True,
            )


def measure(rows: int, ranks: int, repeats: int, k: int = 5) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="status_poll_") as tmp:
        root = Path(tmp)
        paths = build(root, ranks, rows)
        m = Monitor(root)
        m.poll()
        inc, full, read = [], [], []
        for rep in range(repeats):
            append(paths, rows + rep * k, k)
            before = m.rows_read
            t0 = time.perf_counter()
            m.poll()
            inc.append(time.perf_counter() - t0)
            read.append(m.rows_read - before)
            t0 = time.perf_counter()
            for p in paths:
                read_log(p)
            full.append(time.perf_counter() - t0)
    return {
        "incremental_ms": 1e3 * statistics.median(inc),
        "full_ms": 1e3 * statistics.median(full),
        "rows_read_per_poll": statistics.median(read),
    }


def beat_of(pod: int, per_part: int, update: int) -> dict:
    """A pod's heartbeat as the rank program writes it (the fields status shows)."""
    return {
        "pod": pod,
        "rank": pod % per_part,
        "part": pod // per_part,
        "host": f"node{pod // 8:04d}",
        "device": f"cuda:{pod % 8}",
        "pid": 10_000 + pod,
        "job": str(900 + pod // per_part),
        "seed": pod,
        "algo": "ppo",
        "total": 10**9,
        "state": "running",
        "wait": -1,
        "doing": "training",
        "t": time.time(),
        "update": update,
        "env_steps": update * 2048,
        "wall_s": update * 0.1,
        "steps_per_s": 2e4,
        "rounds": update // 100,
        "last_eval": -500.0,
        "best_eval": -400.0,
        "last_action": "r3: keep",
    }


def write_aggregates(root: Path, pods: int, per_part: int, update: int) -> None:
    rd = RunDir(root)
    for k in range(0, pods, per_part):
        part = k // per_part
        beats = [beat_of(p, per_part, update) for p in range(k, min(pods, k + per_part))]
        heartbeat.write_aggregate(
            rd,
            part,
            {"job": str(900 + part), "pool_size": pods, "state": "running", "hosts": [], "pods": beats},
        )


def measure_pool(pods: int, per_part: int, repeats: int, rows: int = 100) -> dict[str, float]:
    """One poll of ``pods`` simulated pods after each appended rows (logs) or its rank 0 rewrote
    its aggregate (aggregates)."""
    with tempfile.TemporaryDirectory(prefix="status_pool_") as tmp:
        root = Path(tmp)
        (root / "config.yaml").write_text(json.dumps(CFG))
        paths = build(root, pods, rows)
        m = Monitor(root)
        m.poll()
        logs = []
        for rep in range(repeats):
            append(paths, rows + rep * 5, 5)
            t0 = time.perf_counter()
            m.poll()
            logs.append(time.perf_counter() - t0)
        write_aggregates(root, pods, per_part, rows)
        m = Monitor(root)
        m.poll()
        agg = []
        for rep in range(repeats):
            append(paths, rows + (repeats + rep) * 5, 5)  # the logs grow too: a poll must not read them
            write_aggregates(root, pods, per_part, rows + rep)
            t0 = time.perf_counter()
            st = m.poll()
            agg.append(time.perf_counter() - t0)
        assert len(st) == pods and st[-1].updates == rows + repeats - 1, "the aggregates were not what was read"
    return {"logs_s": statistics.median(logs), "aggregates_s": statistics.median(agg)}


def main_pool(sizes: list[int], per_part: int, repeats: int) -> int:
    res = {n: measure_pool(n, per_part, repeats) for n in sizes}
    print(f"one incremental poll of a pool of simulated pods (median of {repeats}; parts of {per_part} pods)")
    print(f"{'pods':>6}  {'logs s':>8}  {'aggregates s':>12}")
    for n, r in res.items():
        print(f"{n:>6,}  {r['logs_s']:>8.3f}  {r['aggregates_s']:>12.3f}")
    print(
        json.dumps({"bench": "status_poll_pool", "per_part": per_part, "results": {str(n): r for n, r in res.items()}})
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--short", type=int, default=1000)
    ap.add_argument("--long", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pods", default="", help="comma-separated pool sizes: time a poll of that many pods")
    ap.add_argument("--per-part", type=int, default=512, help="pods per part (one aggregate each) with --pods")
    a = ap.parse_args(argv)
    if a.pods:
        try:
            sizes = [int(x) for x in a.pods.split(",")]
        except ValueError:
            print(f"status_poll: --pods takes comma-separated numbers, got {a.pods!r}", file=sys.stderr)
            return 2
        if min(sizes) < 1 or a.per_part < 1 or a.repeats < 1:
            print("status_poll: --pods, --per-part and --repeats must be >= 1", file=sys.stderr)
            return 2
        return main_pool(sizes, a.per_part, a.repeats)
    if min(a.ranks, a.short, a.long, a.repeats) < 1:
        print("status_poll: --ranks, --short, --long and --repeats must be >= 1", file=sys.stderr)
        return 2
    res = {n: measure(n, a.ranks, a.repeats) for n in (a.short, a.long)}
    print(f"one poll of {a.ranks} rank logs after 5 rows were appended to each (median of {a.repeats})")
    print(f"{'rows/rank':>10}  {'incremental ms':>14}  {'full re-read ms':>15}  {'rows read':>9}")
    for n, r in res.items():
        print(f"{n:>10,}  {r['incremental_ms']:>14.2f}  {r['full_ms']:>15.2f}  {r['rows_read_per_poll']:>9.0f}")
    s, l_ = res[a.short], res[a.long]
    out = {
        "bench": "status_poll",
        "ranks": a.ranks,
        "rows": [a.short, a.long],
        "incremental_ms": [s["incremental_ms"], l_["incremental_ms"]],
        "full_ms": [s["full_ms"], l_["full_ms"]],
        "incremental_long_over_short": l_["incremental_ms"] / s["incremental_ms"],
        "full_long_over_short": l_["full_ms"] / s["full_ms"],
        "full_over_incremental_at_long": l_["full_ms"] / l_["incremental_ms"],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
