"""podracer vs RLlib PPO on Pendulum-v1, on this machine: wall time and env steps to a return of -250.

    .venv/bin/python bench/vs_rllib.py [--target -250] [--rllib-steps 150000] [--rllib-wall-s 240]
                                       [--out runs/bench-vs-rllib] [--podracer-set KEY=VALUE ...]

Runs, one after the other, as subprocesses:

- podracer: ``<.venv>/bin/podracer train jobs/pendulum_fast.yaml --set eval.interval_env_steps=10000``;
- RLlib: ``.venv-rllib/bin/python -m baselines.rllib.train jobs/rllib/pendulum.yaml`` (RLlib's own
  tuned Pendulum PPO), bounded by ``--rllib-steps`` env steps and ``--rllib-wall-s`` training
  seconds, evaluating every ``--rllib-eval-every`` env steps and stopping at the target.

Both evaluate the same way (20 deterministic episodes from fixed start states). Time to target
is the first evaluation whose mean return is >= the target: its ``wall_s`` (training seconds,
start-up excluded, evaluation included; the process wall time including start-up is reported
too) and its ``env_steps``. When RLlib does not reach the target within its bounds, its best
return is reported, marked ``not reached``, and the ratio is a lower bound (``>=``). Prints a
table, then one JSON line (the last line of stdout).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from podracer_hpc.files.h5log import read_log  # noqa: E402
from podracer_hpc.files.live import find_pod_logs  # noqa: E402
from podracer_hpc.files.rundir import RunDir  # noqa: E402


def run(cmd: list[str], timeout: float, log: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.perf_counter() - t0


def crossing(run_dir: Path, target: float) -> dict:
    """First eval row at or above target; else the best. From rank 0's log."""
    logs = find_pod_logs(run_dir)
    if not logs:
        return {"reached": False, "error": f"no log in {run_dir}"}
    ev = read_log(logs[min(logs)])["eval"]
    n = len(ev.get("env_steps", ()))
    if n == 0:
        return {"reached": False, "error": "no evaluation rows"}
    rets = [float(x) for x in ev["return_mean"]]
    for i, r in enumerate(rets):
        if r >= target:
            return {
                "reached": True,
                "wall_s": float(ev["wall_s"][i]),
                "env_steps": int(ev["env_steps"][i]),
                "return": r,
                "best_return": max(rets),
            }
    b = max(range(n), key=lambda i: rets[i])
    return {
        "reached": False,
        "wall_s": float(ev["wall_s"][-1]),
        "env_steps": int(ev["env_steps"][-1]),
        "return": rets[b],
        "best_return": rets[b],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", type=float, default=-250.0)
    p.add_argument("--out", default="runs/bench-vs-rllib")
    p.add_argument("--podracer", default=str(ROOT / ".venv" / "bin" / "podracer"), help="the podracer CLI")
    p.add_argument(
        "--podracer-job", default="jobs/pendulum_fast.yaml", help="podracer settings tuned for time to target"
    )
    p.add_argument("--podracer-eval-every", type=int, default=10_000)
    p.add_argument(
        "--podracer-steps",
        type=int,
        default=500_000,
        help="podracer env-step budget (it reaches -250 near 200k; the job's own is 1.5M)",
    )
    p.add_argument("--podracer-set", action="append", default=[], help="extra --set for podracer")
    p.add_argument("--podracer-timeout", type=float, default=600)
    p.add_argument("--rllib-python", default=str(ROOT / ".venv-rllib" / "bin" / "python"))
    p.add_argument("--rllib-job", default="jobs/rllib/pendulum.yaml")
    p.add_argument("--rllib-steps", type=int, default=150_000, help="RLlib env-step bound")
    p.add_argument("--rllib-wall-s", type=float, default=240, help="RLlib training-seconds bound")
    p.add_argument("--rllib-eval-every", type=int, default=10_000)
    p.add_argument("--skip-podracer", action="store_true")
    p.add_argument("--skip-rllib", action="store_true")
    args = p.parse_args(argv)

    out = (ROOT / args.out) if not Path(args.out).is_absolute() else Path(args.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}

    if not args.skip_podracer:
        d = out / f"podracer-{stamp}"
        cmd = [
            args.podracer,
            "train",
            args.podracer_job,
            "--run-dir",
            str(d),
            "--quiet",
            "--set",
            f"eval.interval_env_steps={args.podracer_eval_every}",
            "--set",
            f"total_env_steps={args.podracer_steps}",
        ]
        for s in args.podracer_set:
            cmd += ["--set", s]
        print(f"podracer: {' '.join(cmd)}", file=sys.stderr, flush=True)
        rc, proc_s = run(cmd, args.podracer_timeout, out / f"podracer-{stamp}.log")
        results["podracer"] = {"rc": rc, "process_s": proc_s, "run_dir": str(d), **crossing(d, args.target)}

    if not args.skip_rllib:
        d = out / f"rllib-{stamp}"
        if not Path(args.rllib_python).exists():
            results["rllib"] = {
                "rc": -1,
                "reached": False,
                "error": f"{args.rllib_python} missing: see baselines/rllib/README.md",
            }
        else:
            cmd = [
                args.rllib_python,
                "-m",
                "baselines.rllib.train",
                args.rllib_job,
                "--run-dir",
                str(d),
                "--quiet",
                "--set",
                f"total_env_steps={args.rllib_steps}",
                "--set",
                f"eval.interval_env_steps={args.rllib_eval_every}",
                "--stop-at-return",
                str(args.target),
                "--max-wall-s",
                str(args.rllib_wall_s),
            ]
            print(f"rllib: {' '.join(cmd)}", file=sys.stderr, flush=True)
            rc, proc_s = run(cmd, args.rllib_wall_s + 180, out / f"rllib-{stamp}.log")
            results["rllib"] = {"rc": rc, "process_s": proc_s, "run_dir": str(d), **crossing(d, args.target)}
            sj = RunDir(d).summary
            if sj.exists():
                s = json.loads(sj.read_text())
                results["rllib"]["startup_s"] = s.get("startup_s")
                results["rllib"]["steps_per_s"] = s.get("steps_per_s")

    pr, rl = results.get("podracer", {}), results.get("rllib", {})
    ratio = steps_ratio = None
    bound = "="
    if pr.get("reached") and rl.get("wall_s") is not None:
        ratio = rl["wall_s"] / max(pr["wall_s"], 1e-9)
        steps_ratio = rl["env_steps"] / max(pr["env_steps"], 1)
        bound = "=" if rl.get("reached") else ">="

    def fmt(name: str, r: dict) -> str:
        if not r:
            return f"{name:<9} (skipped)"
        if "wall_s" not in r:
            return f"{name:<9} failed: {r.get('error')} (rc {r.get('rc')})"
        status = "reached" if r["reached"] else "not reached"
        return (
            f"{name:<9} {status:<12} {r['wall_s']:>9.1f} {r['env_steps']:>11,} {r['return']:>9.1f} "
            f"{r.get('best_return', math.nan):>9.1f} {r['process_s']:>10.1f}"
        )

    print(f"Pendulum-v1, target eval return >= {args.target:g}, this machine ({os.cpu_count()} cores)")
    print(f"{'system':<9} {'status':<12} {'train s':>9} {'env steps':>11} {'return':>9} {'best':>9} {'process s':>10}")
    print(fmt("podracer", pr))
    print(fmt("rllib", rl))
    if ratio is not None:
        print(
            f"wall-time ratio rllib/podracer {bound} {ratio:.1f}x; env-steps ratio {bound} {steps_ratio:.2f}x"
            + ("" if rl.get("reached") else " (RLlib did not reach the target: lower bounds)")
        )
    summary = {
        "task": "pendulum",
        "target": args.target,
        "podracer": pr,
        "rllib": rl,
        "wall_ratio": None if ratio is None else round(ratio, 2),
        "wall_ratio_bound": bound,
        "env_steps_ratio": None if steps_ratio is None else round(steps_ratio, 3),
        "meets_20x": None if ratio is None else ratio >= 20,
    }
    print(json.dumps(summary), flush=True)
    return 0 if pr.get("reached") else 1


if __name__ == "__main__":
    sys.exit(main())
