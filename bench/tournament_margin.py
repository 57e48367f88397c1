"""The ElegantRL rule's margin (tournament.margin_se): how many standard errors of the paired
difference on common start states a candidate must win by before a pod takes it.

    python bench/tournament_margin.py                        # margins 0 1 2 3, seeds 0-2, the quickstart
    python bench/tournament_margin.py --margins 0 1 --seeds 0 --set total_env_steps=200000

Each run is ``mpiexec -n 4 podracer train jobs/quickstart.yaml`` (ElegantRL rule, a round every
100k env steps) with ``tournament.margin_se`` set; reported per run: the best pod by the run's
verdict (100 episodes on common start states), the pool's mean on the same set, how many rounds
replaced a pod, and how many re-evaluated an entry first. Side by side in one run; a table, then
one line of JSON with the mean over seeds per margin.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _pool import print_table, train_pool  # noqa: E402  (bench/_pool.py)

from podracer_hpc.files.h5log import read_log  # noqa: E402
from podracer_hpc.files.records import read_records  # noqa: E402
from podracer_hpc.files.rundir import RunDir  # noqa: E402

PODS = 4
COMMON = ["threads=1", "log.progress_interval_s=0", "tournament.interval_env_steps=50000"]


def one(margin: float, seed: int, out: Path, extra: list[str]) -> dict:
    d = out / f"m{margin:g}-s{seed}"
    summary, pods, wall = train_pool(
        d,
        PODS,
        [*COMMON, f"tournament.margin_se={margin}", f"seed={seed}", *extra],
        what=f"margin {margin} seed {seed}",
    )
    moved = verified = 0
    for k in range(PODS):
        for rec in read_records(read_log(RunDir(d, "quickstart").log(k))["tournament"]):
            moved += rec.action in ("copy_pod", "load_entry")
            verified += rec.compared.verified
    return {
        "margin": margin,
        "seed": seed,
        "best": summary["best_return"],
        "pool_mean": statistics.mean(pods),
        "replaced": moved,
        "verified": verified,
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--margins", type=float, nargs="+", default=[0.0, 1.0, 2.0, 3.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another override for every run")
    ap.add_argument("--out", default="", help="keep the run directories here (default: a temporary folder)")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="podracer-margin-"))
    rows = [one(m, s, out, args.set) for s in args.seeds for m in args.margins]
    head = ("margin_se", "seed", "best pod (verdict)", "pool mean", "rounds replaced", "re-evaluated first", "wall s")
    table = [
        (
            f"{r['margin']:g}",
            r["seed"],
            f"{r['best']:.1f}",
            f"{r['pool_mean']:.1f}",
            r["replaced"],
            r["verified"],
            f"{r['wall_s']:.0f}",
        )
        for r in rows
    ]
    print_table(head, table)
    by = {m: [r for r in rows if r["margin"] == m] for m in args.margins}
    print(
        json.dumps(
            {
                "bench": "tournament_margin",
                "pods": PODS,
                "seeds": args.seeds,
                "margins": {
                    f"{m:g}": {
                        "best_mean": statistics.mean(r["best"] for r in v),
                        "pool_mean": statistics.mean(r["pool_mean"] for r in v),
                        "replaced_mean": statistics.mean(r["replaced"] for r in v),
                    }
                    for m, v in by.items()
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
