"""An off-policy pod's throughput and time to a return, next to a PPO pod on the same task.

    python bench/offpolicy_pod.py                                   # Pendulum SAC vs PPO, CPU
    python bench/offpolicy_pod.py --job jobs/pendulum_td3.yaml
    python bench/offpolicy_pod.py --device cuda --set env.num_envs=4096 --set agent.batch_size=8192 \\
        --set agent.updates_per_step=2 --set agent.learning_starts=16384 --steps 2000000   # bench/gpu_check.sh

Each pod is a normal `podracer train` run (its own run directory under --out), read back from its
HDF5 log: env steps/s and gradient steps/s over the run (evaluations included), and the env steps
and wall seconds at which its evaluation first reached --target. The peer is the PPO job on the
same device (--peer, with the same --device; '' to skip). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np

from podracer_hpc.config import load_config
from podracer_hpc.files.h5log import read_log
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.rank.program import train

REPO = Path(__file__).resolve().parent.parent


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def measure(job: str, sets: list[str], steps: int, target: float, out: Path) -> dict:
    cfg = load_config(REPO / job, [*sets, *([f"total_env_steps={steps}"] if steps else [])])
    run_dir = out / f"{Path(job).stem}-{int(time.time())}"
    print(
        f"running {job} ({cfg.agent.algo}, {cfg.env.num_envs} envs, {cfg.total_env_steps:,} steps) -> {run_dir}",
        file=sys.stderr,
        flush=True,
    )
    cpu0 = cpu_s()
    res = train(cfg, run_dir, quiet=True)
    cpu = cpu_s() - cpu0
    log = read_log(RunDir(run_dir, cfg.name).log(0))
    tr, ev = log["train"], log["eval"]
    grad = np.asarray(tr.get("grad_steps", []), dtype=float)
    grad_steps = float(grad[grad >= 0].sum()) if len(grad) and (grad >= 0).any() else math.nan
    wall = float(tr["wall_s"][-1])
    hit = [i for i, r in enumerate(ev["return_mean"]) if r >= target]
    return {
        "job": job,
        "algo": cfg.agent.algo,
        "device": cfg.device,
        "num_envs": cfg.env.num_envs,
        "env_steps": int(tr["env_steps"][-1]),
        "wall_s": wall,
        "cpu_min": cpu / 60,
        "env_steps_per_s": float(tr["env_steps"][-1]) / wall,
        "grad_steps": grad_steps,
        "grad_steps_per_s": grad_steps / wall if grad_steps == grad_steps else math.nan,
        "steps_to_target": int(ev["env_steps"][hit[0]]) if hit else None,
        "wall_s_to_target": float(ev["wall_s"][hit[0]]) if hit else None,
        "best_return": res.summary["best_return"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", default="jobs/pendulum_sac.yaml")
    ap.add_argument("--peer", default="jobs/pendulum.yaml", help="the PPO job beside it ('' for none)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=0, help="env steps of the off-policy pod (0: its job's)")
    ap.add_argument("--peer-steps", type=int, default=0, help="env steps of the peer (0: its job's)")
    ap.add_argument("--target", type=float, default=-250.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "runs" / "bench-offpolicy"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="overrides of the off-policy pod")
    args = ap.parse_args()
    common = [f"device={args.device}", f"seed={args.seed}", "log.progress_interval_s=30", "tournament.mode=none"]
    every = ["eval.interval_env_steps=4096"]
    rows = [measure(args.job, [*common, *every, *args.set], args.steps, args.target, Path(args.out))]
    if args.peer:
        rows.append(
            measure(args.peer, [*common, "eval.interval_env_steps=25000"], args.peer_steps, args.target, Path(args.out))
        )
    print(
        f"{'job':<28}{'algo':<5}{'envs':>6}{'env steps':>11}{'wall s':>8}{'CPU min':>8}{'env st/s':>10}"
        f"{'grad st/s':>10}{'steps to ' + str(int(args.target)):>14}{'s to it':>9}{'best':>9}"
    )
    for r in rows:
        to = f"{r['steps_to_target']:,}" if r["steps_to_target"] is not None else "not reached"
        ws = f"{r['wall_s_to_target']:.1f}" if r["wall_s_to_target"] is not None else "-"
        print(
            f"{r['job']:<28}{r['algo']:<5}{r['num_envs']:>6}{r['env_steps']:>11,}{r['wall_s']:>8.1f}"
            f"{r['cpu_min']:>8.2f}{r['env_steps_per_s']:>10,.0f}{r['grad_steps_per_s']:>10,.0f}{to:>14}{ws:>9}"
            f"{r['best_return']:>9.1f}"
        )
    ratio = {}
    if len(rows) == 2 and rows[0]["steps_to_target"] and rows[1]["steps_to_target"]:
        ratio = {
            "steps": rows[0]["steps_to_target"] / rows[1]["steps_to_target"],
            "wall": rows[0]["wall_s_to_target"] / rows[1]["wall_s_to_target"],
        }
        print(
            f"to {args.target:g}: x{ratio['steps']:.3f} the env steps and x{ratio['wall']:.2f} the wall time of "
            f"{rows[1]['job']}"
        )
    print(json.dumps({"bench": "offpolicy_pod", "target": args.target, "ratio_to_peer": ratio, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
