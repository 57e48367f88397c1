"""Learning benchmark: the jobs' full runs over seeds, steps and seconds to a target return.

    python bench/learning.py                                  # pendulum seeds 0,1,2, cartpole
    python bench/learning.py --only pendulum --seeds 0
    python bench/learning.py --only halfcheetah hopper walker2d   # MuJoCo v5, 1M steps, 3 seeds
    python bench/learning.py --only pendulum pendulum_sac pendulum_td3   # learners side by side at -250
    python bench/learning.py --only halfcheetah_sac --max-cpu-min 60 --eval-every 200000   # the off-policy jobs' budget

Two kinds of target (SUITE): ``reach`` (classic control) passes when an evaluation reaches the
target within the budget; ``final`` (MuJoCo, the issue's "at 1M env steps ... mean of 3 seeds")
passes when the mean over seeds of the evaluation at the end of the budget is at least the
target and every run took at most ``--max-cpu-min`` (20) CPU-minutes (user + system time of the
process, all threads). MuJoCo runs are single pods (tournament.mode=none) on one torch thread and
one envpool thread. The table gives each seed's final and best evaluation (10 deterministic
episodes from fixed start states) and, per task, the mean with a 95% t-band over the seeds.
The Pendulum jobs of every learner (PPO's jobs/pendulum.yaml, jobs/pendulum_sac.yaml,
jobs/pendulum_td3.yaml) also report env steps and wall seconds to -250 (COMPARE_AT), and the
off-policy ones their ratio to PPO's (mean over seeds, each with its band), evaluated often enough
to resolve it (each task's eval interval in SUITE).

Prints a table, then one JSON line. Each run is a normal `podracer train` run in its own
run directory (logs and checkpoints kept under --out), read back from its HDF5 log.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # analysis/ is the checkout's, not an installed package

from analysis.aggregate import t95  # noqa: E402
from podracer_hpc.config import load_config  # noqa: E402
from podracer_hpc.files.h5log import read_log  # noqa: E402
from podracer_hpc.files.rundir import RunDir  # noqa: E402
from podracer_hpc.rank.program import train  # noqa: E402

# task: (job, target evaluation return, env-step budget, kind, default seeds[, eval interval])
SUITE = {
    "pendulum": ("jobs/pendulum.yaml", -200.0, 3_000_000, "reach", (0, 1, 2), 25_000),
    "pendulum_sac": ("jobs/pendulum_sac.yaml", -250.0, 100_000, "reach", (0, 1, 2), 2048),
    "pendulum_td3": ("jobs/pendulum_td3.yaml", -250.0, 100_000, "reach", (0, 1, 2), 2048),
    "cartpole": ("jobs/cartpole.yaml", 475.0, 1_000_000, "reach", (0,)),
    # rl-baselines3-zoo's tuned PPO at 1M steps: 5,819 / 2,410 / 3,479 (one run each); the targets:
    "halfcheetah": ("jobs/halfcheetah.yaml", 5000.0, 1_000_000, "final", (0, 1, 2)),
    "hopper": ("jobs/hopper.yaml", 2500.0, 1_000_000, "final", (0, 1, 2)),
    "walker2d": ("jobs/walker2d.yaml", 3500.0, 1_000_000, "final", (0, 1, 2)),
    # The off-policy jobs at TD3/SAC level (CleanRL's SAC 9,635, TD3 9,018 at 1M; run
    # with --max-cpu-min 60, the budget)
    "halfcheetah_sac": ("jobs/halfcheetah_sac.yaml", 9000.0, 1_000_000, "final", (0, 1, 2)),
    "halfcheetah_td3": ("jobs/halfcheetah_td3.yaml", 9000.0, 1_000_000, "final", (0, 1, 2)),
}
DEFAULT = ("pendulum", "cartpole")
COMPARE_AT = -250.0  # the Pendulum learners are compared at this return
PEER = "pendulum"  # ... against PPO's job
MUJOCO_SET = ["tournament.mode=none", "threads=1", "env.mujoco.num_threads=1"]


def first_reaching(log: dict, target: float) -> tuple[float, float]:
    ev = log["eval"]
    for steps, wall, ret in zip(ev["env_steps"], ev["wall_s"], ev["return_mean"]):
        if ret >= target:
            return int(steps), float(wall)
    return math.nan, math.nan


def cpu_s() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def mean_band(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (nan for one value)."""
    if len(xs) < 2:
        return (xs[0] if xs else math.nan), math.nan
    return statistics.fmean(xs), t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(SUITE), nargs="*", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: each task's own (SUITE)")
    ap.add_argument("--out", default=str(REPO / "runs" / "bench-learning"))
    ap.add_argument("--eval-every", type=int, default=0, help="evaluation interval; 0: each task's (SUITE), else 100k")
    ap.add_argument("--max-cpu-min", type=float, default=20.0, help="'final' targets: each run's CPU-minute limit")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides of every run")
    args = ap.parse_args()
    rows = []
    for task in args.only or DEFAULT:
        job, target, budget, kind, seeds = SUITE[task][:5]
        every = args.eval_every or (SUITE[task][5] if len(SUITE[task]) > 5 else 100_000)
        for seed in args.seeds or seeds:
            run_dir = Path(args.out) / f"{task}-seed{seed}-{int(time.time())}"
            # 'final' targets are at the budget; 'reach' runs use the job's own (shorter) budget
            extra = [*MUJOCO_SET, f"total_env_steps={budget}"] if kind == "final" else []
            cfg = load_config(
                REPO / job,
                [f"seed={seed}", f"eval.interval_env_steps={every}", "log.progress_interval_s=60", *extra, *args.set],
            )
            print(
                f"running {task} seed {seed} ({cfg.total_env_steps:,} steps) -> {run_dir}", file=sys.stderr, flush=True
            )
            cpu0 = cpu_s()
            res = train(cfg, run_dir, quiet=True)
            cpu = cpu_s() - cpu0
            log = read_log(RunDir(run_dir, cfg.name).log(0))
            steps, wall = first_reaching(log, target)
            at_steps, at_wall = first_reaching(log, COMPARE_AT) if task.startswith("pendulum") else (math.nan, math.nan)
            rows.append(
                {
                    "task": task,
                    "algo": cfg.agent.algo,
                    "seed": seed,
                    "target": target,
                    "budget": budget,
                    "kind": kind,
                    "steps_to_target": steps,
                    "wall_s_to_target": wall,
                    "steps_to_compare": at_steps,
                    "wall_s_to_compare": at_wall,
                    "final_return": res.summary["final_return"],
                    "best_return": res.summary["best_return"],
                    "steps_per_s": res.summary["steps_per_s"],
                    "wall_s": res.summary["wall_s"],
                    "cpu_min": cpu / 60,
                    "passed": bool(steps == steps and steps <= budget)
                    if kind == "reach"
                    else bool(cpu / 60 <= args.max_cpu_min),
                }
            )
    print(
        f"{'task':<12}{'seed':>5}{'target':>9}{'steps to target':>17}{'s to target':>13}"
        f"{'final':>9}{'best':>9}{'wall s':>8}{'CPU min':>8}{'steps/s':>9}  ok"
    )
    for r in rows:
        print(
            f"{r['task']:<12}{r['seed']:>5}{r['target']:>9.0f}{r['steps_to_target']:>17,.0f}"
            f"{r['wall_s_to_target']:>13.1f}{r['final_return']:>9.1f}{r['best_return']:>9.1f}"
            f"{r['wall_s']:>8.0f}{r['cpu_min']:>8.1f}{r['steps_per_s']:>9,.0f}  {'yes' if r['passed'] else 'NO'}"
        )
    verdicts = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        rs = [r for r in rows if r["task"] == task]
        if rs[0]["kind"] == "final":
            finals = [r["final_return"] for r in rs]
            mean, half = mean_band(finals)
            ok = mean >= rs[0]["target"] and all(r["passed"] for r in rs)
            verdicts[task] = {
                "mean_final_return": mean,
                "band95": half,
                "seeds": len(rs),
                "target": rs[0]["target"],
                "max_cpu_min": max(r["cpu_min"] for r in rs),
                "passed": ok,
            }
            print(
                f"{task}: mean final return over {len(rs)} seeds {mean:,.1f} +- {half:,.0f} (95% t-band; target "
                f"{rs[0]['target']:,.0f}, each run <= {args.max_cpu_min:.0f} CPU-min): {'met' if ok else 'NOT met'}"
            )
        else:
            verdicts[task] = {"passed": all(r["passed"] for r in rs)}
    compare = compare_learners(rows)
    print(
        json.dumps(
            {
                "bench": "learning",
                "all_passed": all(v["passed"] for v in verdicts.values()),
                "tasks": verdicts,
                "compare_at": COMPARE_AT,
                "compare": compare,
                "rows": rows,
            }
        )
    )
    return 0


def compare_learners(rows: list[dict]) -> dict[str, dict]:
    """Env steps and wall seconds to COMPARE_AT per Pendulum learner (mean and 95% t-band over the
    seeds), and each off-policy learner's ratio to PPO's job (means; printed as a table)."""
    out: dict[str, dict] = {}
    for task in dict.fromkeys(r["task"] for r in rows if r["task"].startswith("pendulum")):
        rs = [r for r in rows if r["task"] == task]
        steps = [r["steps_to_compare"] for r in rs]
        walls = [r["wall_s_to_compare"] for r in rs]
        reached = all(x == x for x in steps)
        out[task] = {
            "algo": rs[0]["algo"],
            "seeds": len(rs),
            "reached": reached,
            "steps": mean_band(steps) if reached else (math.nan, math.nan),
            "wall_s": mean_band(walls) if reached else (math.nan, math.nan),
            "cpu_min": statistics.fmean(r["cpu_min"] for r in rs),
        }
    if not out:
        return out
    print(f"\nto {COMPARE_AT:.0f} on Pendulum (mean +- 95% t-band over seeds; x: ratio to PPO's job)")
    print(f"{'task':<14}{'algo':<6}{'seeds':>6}{'env steps':>22}{'wall s':>18}{'CPU min/run':>12}")
    peer = out.get(PEER)
    for task, c in out.items():
        ratio = ""
        if peer and task != PEER and c["reached"] and peer["reached"]:
            c["steps_ratio"] = c["steps"][0] / peer["steps"][0]
            c["wall_ratio"] = c["wall_s"][0] / peer["wall_s"][0]
            ratio = f"  x{c['steps_ratio']:.3f} steps, x{c['wall_ratio']:.2f} wall"
        print(
            f"{task:<14}{c['algo']:<6}{c['seeds']:>6}{c['steps'][0]:>12,.0f} +- {c['steps'][1]:>6,.0f}"
            f"{c['wall_s'][0]:>10.1f} +- {c['wall_s'][1]:>4.1f}{c['cpu_min']:>12.2f}{ratio}"
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
