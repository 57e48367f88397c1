"""Learning benchmark: the jobs' full runs over seeds, steps and seconds to a target return.

    python bench/learning.py                       # pendulum seeds 0,1,2 (3M steps), cartpole (1M)
    python bench/learning.py --only pendulum --seeds 0

Prints a table, then one JSON line. Each run is a normal `podracer train` run in its own
run directory (logs and checkpoints kept under --out), read back from its HDF5 log.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from podracer_hpc.config import load_config
from podracer_hpc.h5log import read_log
from podracer_hpc.run import train

REPO = Path(__file__).resolve().parent.parent
# job, target evaluation return, env-step budget the issue allows
SUITE = {
    "pendulum": ("jobs/pendulum.yaml", -200.0, 3_000_000),
    "cartpole": ("jobs/cartpole.yaml", 475.0, 1_000_000),
}


def first_reaching(log: dict, target: float) -> tuple[float, float]:
    ev = log["eval"]
    for steps, wall, ret in zip(ev["env_steps"], ev["wall_s"], ev["return_mean"]):
        if ret >= target:
            return int(steps), float(wall)
    return math.nan, math.nan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(SUITE), nargs="*", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=str(REPO / "runs" / "bench-learning"))
    ap.add_argument("--eval-every", type=int, default=100_000)
    args = ap.parse_args()
    rows = []
    for task in args.only or SUITE:
        job, target, budget = SUITE[task]
        seeds = args.seeds if task == "pendulum" else args.seeds[:1]
        for seed in seeds:
            run_dir = Path(args.out) / f"{task}-seed{seed}-{int(time.time())}"
            cfg = load_config(REPO / job, [f"seed={seed}", f"eval.interval_env_steps={args.eval_every}",
                                           "log.progress_interval_s=0"])
            print(f"running {task} seed {seed} ({cfg.total_env_steps:,} steps) -> {run_dir}", file=sys.stderr, flush=True)
            res = train(cfg, run_dir, quiet=True)
            log = read_log(run_dir / "logs" / f"{cfg.name}_rank0.h5")
            steps, wall = first_reaching(log, target)
            rows.append({
                "task": task, "seed": seed, "target": target, "budget": budget,
                "steps_to_target": steps, "wall_s_to_target": wall,
                "final_return": res.summary["final_return"], "best_return": res.summary["best_return"],
                "steps_per_s": res.summary["steps_per_s"], "wall_s": res.summary["wall_s"],
                "passed": bool(steps == steps and steps <= budget),
            })
    print(f"{'task':<10}{'seed':>5}{'target':>9}{'steps to target':>17}{'s to target':>13}"
          f"{'final':>9}{'best':>9}{'steps/s':>10}  ok")
    for r in rows:
        print(f"{r['task']:<10}{r['seed']:>5}{r['target']:>9.0f}{r['steps_to_target']:>17,.0f}"
              f"{r['wall_s_to_target']:>13.1f}{r['final_return']:>9.1f}{r['best_return']:>9.1f}"
              f"{r['steps_per_s']:>10,.0f}  {'yes' if r['passed'] else 'NO'}")
    print(json.dumps({"bench": "learning", "all_passed": all(r["passed"] for r in rows), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
