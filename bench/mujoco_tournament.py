"""A P-pod tournament vs P independent pods on a MuJoCo task, the same total env-step budget.

    python bench/mujoco_tournament.py                      # halfcheetah, 4 pods x 250k steps
    python bench/mujoco_tournament.py --task hopper --steps-per-pod 500000 --round 100000
    python bench/mujoco_tournament.py --seed 4 --warmup 100000  # first round after 100k steps
    python bench/mujoco_tournament.py --job jobs/halfcheetah_cleanrl.yaml --pods 8 --steps-per-pod 1000000 \
        --round 100000 --mode pbt --systems tournament       # the PBT study

Runs, one after the other, ``mpiexec -n P podracer train jobs/<task>.yaml`` twice: with the job's
tournament (ElegantRL rule: every ``--round`` env steps the pods evaluate, exchange fitness,
publish to the leaderboard and the weaker ones load a better agent) and with
``tournament.mode=none`` (the same seeds, no exchange). Each pod's final deterministic
evaluation (``eval.episodes`` episodes, fixed start states) is read from its HDF5 log. The claim
checked: the tournament's best pod is at least as good as the best independent pod.
One torch thread and one envpool thread per pod; prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from podracer_hpc.files.h5log import read_log  # noqa: E402
from podracer_hpc.files.live import find_pod_logs  # noqa: E402
from podracer_hpc.launch import find_mpiexec  # noqa: E402


def final_returns(run_dir: Path) -> list[float]:
    """The last evaluation return of every rank, in rank order."""
    logs = find_pod_logs(run_dir)
    return [float(read_log(logs[r])["eval"]["return_mean"][-1]) for r in sorted(logs)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="halfcheetah", help="a MuJoCo job in jobs/ (halfcheetah, hopper, walker2d)")
    ap.add_argument(
        "--job", default="", help="a job file instead of jobs/<task>.yaml (e.g. jobs/halfcheetah_cleanrl.yaml)"
    )
    ap.add_argument("--pods", type=int, default=4)
    ap.add_argument("--steps-per-pod", type=int, default=250_000)
    ap.add_argument("--round", type=int, default=50_000, help="env steps per pod between tournament rounds")
    ap.add_argument(
        "--mode",
        default="elegantrl",
        choices=["elegantrl", "pbt"],
        help="tournament rule (pbt: the bottom quarter copies the top quarter, no hparam_space)",
    )
    ap.add_argument(
        "--warmup", type=int, default=0, help="tournament.warmup_env_steps: env steps per pod before the first round"
    )
    ap.add_argument("--seed", type=int, default=0, help="pod r trains with seed + r")
    ap.add_argument(
        "--systems", default="tournament,independent", help="which to run, comma-separated (the claim needs both)"
    )
    ap.add_argument("--out", default=str(REPO / "runs" / "bench-mujoco-tournament"))
    ap.add_argument("--podracer", default=str(Path(sys.executable).parent / "podracer"))
    args = ap.parse_args(argv)
    job = args.job or f"jobs/{args.task}.yaml"
    out = Path(args.out) / f"{Path(job).stem}-{int(time.time())}"
    common = [
        f"seed={args.seed}",
        f"total_env_steps={args.steps_per_pod}",
        "threads=1",
        "env.mujoco.num_threads=1",
        f"eval.interval_env_steps={args.round}",
        f"tournament.interval_env_steps={args.round}",
        "log.progress_interval_s=60",
    ]
    systems = {
        "tournament": [
            f"tournament.mode={args.mode}",
            f"tournament.top_k={args.pods}",
            f"tournament.warmup_env_steps={args.warmup}",
        ],
        "independent": ["tournament.mode=none"],
    }
    wanted = [x.strip() for x in args.systems.split(",") if x.strip()]
    unknown = sorted(set(wanted) - set(systems))
    if unknown or not wanted:
        ap.error(f"--systems: unknown {unknown or wanted}; choose from {', '.join(systems)}")
    systems = {k: v for k, v in systems.items() if k in wanted}
    res: dict[str, dict] = {}
    for name, extra in systems.items():
        run_dir = out / name
        cmd = [find_mpiexec(), "-n", str(args.pods), args.podracer, "train", job, "--run-dir", str(run_dir)]
        for kv in common + extra:
            cmd += ["--set", kv]
        print(f"[{name}] {' '.join(cmd)}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=REPO).returncode
        wall = time.perf_counter() - t0
        if rc != 0:
            print(f"{name}: podracer exited with {rc} (logs in {run_dir})", file=sys.stderr)
            return rc
        rets = final_returns(run_dir)
        res[name] = {
            "final_returns": rets,
            "best": max(rets),
            "mean": sum(rets) / len(rets),
            "wall_s": wall,
            "run_dir": str(run_dir),
        }
    print(
        f"\n{job}: {args.pods} pods x {args.steps_per_pod:,} env steps, seeds {args.seed}-"
        f"{args.seed + args.pods - 1}, rounds every {args.round:,} after a warm-up of {max(args.round, args.warmup):,}"
    )
    print(
        f"{'system':<12}"
        + "".join(f"{'pod ' + str(r):>10}" for r in range(args.pods))
        + f"{'best':>10}{'mean':>10}{'wall s':>8}"
    )
    for name, r in res.items():
        print(
            f"{name:<12}"
            + "".join(f"{x:>10.1f}" for x in r["final_returns"])
            + f"{r['best']:>10.1f}{r['mean']:>10.1f}{r['wall_s']:>8.0f}"
        )
    ok = None
    if len(res) == 2:
        ok = res["tournament"]["best"] >= res["independent"]["best"]
        print(
            f"tournament best {res['tournament']['best']:.1f} vs independent best "
            f"{res['independent']['best']:.1f}: {'at least as good' if ok else 'WORSE'}"
        )
    print(
        json.dumps(
            {
                "bench": "mujoco_tournament",
                "task": args.task,
                "job": job,
                "pods": args.pods,
                "seed": args.seed,
                "steps_per_pod": args.steps_per_pod,
                "round": args.round,
                "warmup": args.warmup,
                "mode": args.mode,
                "systems": res,
                "tournament_at_least_as_good": ok,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
