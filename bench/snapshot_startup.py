"""File-name calls of one rank's start from the code snapshot: plain sources vs the compiled snapshot.

    python bench/snapshot_startup.py [--repeat 3]

Opt-in (needs strace; not in bench/run_all.sh or CI). A snapshot of this checkout is made as
``podracer submit`` makes it (podracer_hpc/launch/snapshot.py, compiled), and a copy of it without
``__pycache__`` (what snapshots were before). Each case runs ``python -c "import
podracer_hpc.rank.program"`` (every rank's first import) with the snapshot on PYTHONPATH and
PYTHONSAFEPATH=1, as the batch script runs a rank:

- ``plain, writes .pyc``: sources only, PYTHONDONTWRITEBYTECODE unset (the first ranks of a job
  compile every module and race to write ``__pycache__`` into the shared snapshot);
- ``plain, no .pyc written``: sources only, PYTHONDONTWRITEBYTECODE=1 (every rank compiles
  every module in memory at every start);
- ``compiled snapshot``: the snapshot as written now, PYTHONDONTWRITEBYTECODE=1.

Each under ``strace -f`` (%file calls plus getdents64; bench/container_metadata.py's counter):
the calls in all, those on the snapshot (each a metadata round trip on a parallel filesystem),
the failed ones, and the ``.pyc`` files left in the snapshot; then the wall seconds of the same
start without strace. Medians of ``--repeat``. Prints a table, then a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from container_metadata import CODE, count  # noqa: E402

from podracer_hpc.launch.snapshot import make_snapshot, plan_snapshot  # noqa: E402


def wall(env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", CODE], env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    if shutil.which("strace") is None:
        print("snapshot_startup: needs strace (apt-get install strace)", file=sys.stderr)
        return 2
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    base |= {"PYTHONSAFEPATH": "1", "OMP_NUM_THREADS": "1"}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        snap = make_snapshot(plan_snapshot(Path(tmp) / "run", str(REPO / "jobs" / "quickstart.yaml")))
        plain = Path(tmp) / "plain"
        shutil.copytree(snap.path, plain, ignore=shutil.ignore_patterns("__pycache__"))
        cases = {
            "plain, writes .pyc": (plain, {}),
            "plain, no .pyc written": (plain, {"PYTHONDONTWRITEBYTECODE": "1"}),
            "compiled snapshot": (snap.path, {"PYTHONDONTWRITEBYTECODE": "1"}),
        }
        for name, (tree, extra) in cases.items():
            env = {**base, "PYTHONPATH": str(tree), **extra}
            runs, written = [], 0
            for _ in range(args.repeat):
                had = set(tree.rglob("*.pyc"))
                runs.append(count([sys.executable, "-c", CODE], env, (str(tree),)))
                written = max(written, len(set(tree.rglob("*.pyc")) - had))
                if name.startswith("plain"):  # each run as a first start: no bytecode left from the last
                    for c in tree.rglob("__pycache__"):
                        shutil.rmtree(c)
            row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            row["pyc_written"] = written
            row["wall_s"] = statistics.median(wall(env) for _ in range(args.repeat))
            if name.startswith("plain"):
                for c in tree.rglob("__pycache__"):
                    shutil.rmtree(c)
            rows[name] = row
    print(f"{'case':<24} {'calls':>7} {'on snapshot':>12} {'failed':>7} {'.pyc written':>13} {'wall s':>7}")
    for name, r in rows.items():
        print(
            f"{name:<24} {int(r['calls']):>7} {int(r['on_shared']):>12} {int(r['failed']):>7} "
            f"{r['pyc_written']:>13} {r['wall_s']:>7.2f}"
        )
    print(
        json.dumps(
            {"bench": "snapshot_startup", "code": CODE, "repeat": args.repeat, "python": sys.version.split()[0], **rows}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
