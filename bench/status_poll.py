"""A monitor's poll as the logs grow: ``podracer status --watch`` / ``--wait`` at 10^3 vs 10^5 rows
per rank (issue 26, item 6).

For each log length, a handful of rank logs are built (through h5log's writer), read once, then
a few rows are appended to each and one poll is timed, two ways side by side:

- ``incremental``: the :class:`live.Monitor` a watcher keeps (only the appended rows are read);
- ``full``: reading every log again (``h5log.read_log``, what a poll did before).

Prints a table, then one JSON line: the time per poll at each length and the ratios
long/short (incremental should stay near 1, full grows with the log).

    python bench/status_poll.py [--ranks 4] [--short 1000] [--long 100000] [--repeats 5]
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

from podracer_hpc.files.h5log import H5Writer, read_log
from podracer_hpc.files.live import Monitor

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--short", type=int, default=1000)
    ap.add_argument("--long", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
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
