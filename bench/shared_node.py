"""A pod's training speed on a node it does not have to itself.

Runs the Pendulum training bench (jobs/pendulum.yaml, 512 envs) and HalfCheetah
(jobs/halfcheetah.yaml, its defaults: 16 envs, envpool/gymnasium on the CPU) for a few seconds each,
alone and next to two busy processes (``while True: pass``), with

- ``before``: the thread count the old default chose here (the CPUs of the affinity mask divided
  by the ranks on the node: all of them), and
- ``after``: the default of podracer_hpc/cluster/device.py (``threads: 0``): on a node whose CPUs are not
  bound to the pod it takes no more threads than are idle at start-up.

Each measurement is a fresh process (torch's thread pool is per process). Prints a table and one
JSON line. Usage: python bench/shared_node.py [--seconds 8] [--cases pendulum,halfcheetah]
[--policies before,after] [--conds alone,busy] [--busy 2] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = {"pendulum": "jobs/pendulum.yaml", "halfcheetah": "jobs/halfcheetah.yaml"}

# `podracer bench train` without its gymnasium reference, and with one measured update at least
# (a HalfCheetah update is 2,048 env steps and 320 minibatches: a minute on a busy node before)
PROBE = r"""
import json, sys, time, torch
from podracer_hpc.config import load_config
from podracer_hpc.cluster.device import set_cpu_threads, threads_reason
from podracer_hpc.pod import Pod
job, threads, seconds, sets = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
cfg = load_config(job, [f"threads={threads}", "device=cpu", *sets])
n = set_cpu_threads(cfg.threads)
pod = Pod(cfg, device=torch.device("cpu"))
pod.train_iteration()  # warm-up
s0, t0, k = pod.env_steps, time.perf_counter(), 0
while time.perf_counter() - t0 < seconds or k < 1:
    pod.train_iteration()
    k += 1
dt = time.perf_counter() - t0
print(json.dumps({"threads": n, "why": threads_reason(), "steps_per_s": (pod.env_steps - s0) / dt,
                  "s_per_update": dt / k}))
"""


def old_default_threads() -> int:
    """What pod.set_cpu_threads(0, 1) chose before pods bound their threads, on an unbound node
    without Slurm/OMP settings."""
    return max(1, len(os.sched_getaffinity(0)))


def _niced(n: int):
    return (lambda: os.nice(n)) if n else None


def measure(job: str, threads: int, seconds: float, sets: list[str] = (), nice: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_"))}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with subprocess.Popen(
        [sys.executable, "-c", PROBE, job, str(threads), str(seconds), *sets],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
        preexec_fn=_niced(nice),
    ) as p:
        try:
            out, err = p.communicate(timeout=1800)
        finally:
            if p.poll() is None:
                p.kill()
    if p.returncode != 0:
        raise RuntimeError(err[-2000:])
    res = json.loads(out.strip().splitlines()[-1])
    res.update(load_before=round(load, 2), wall_s=round(time.perf_counter() - t0, 1))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--cases", default="pendulum,halfcheetah")
    ap.add_argument("--policies", default="before,after")
    ap.add_argument("--busy", type=int, default=2, help="extra busy processes in the 'busy' condition")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every run")
    ap.add_argument("--conds", default="alone,busy")
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness of the measured process and the busy ones (root: e.g. -10, so that other users' "
        "processes on a shared machine weigh ~10x less and 'alone' is nearly alone)",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # the busy processes go too (finally below)
    rows = []
    for case in args.cases.split(","):
        for policy in args.policies.split(","):
            threads = old_default_threads() if policy == "before" else 0
            for cond in args.conds.split(","):
                hogs = (
                    [
                        subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_niced(args.nice))
                        for _ in range(args.busy)
                    ]
                    if cond == "busy"
                    else []
                )
                try:
                    time.sleep(1.0 if hogs else 0)
                    r = measure(CASES[case], threads, args.seconds, args.set, args.nice)
                finally:
                    for h in hogs:
                        h.kill()
                        h.wait()
                r.update(case=case, policy=policy, cond=cond)
                rows.append(r)
                print(
                    f"# {case} {policy} {cond}: {r['steps_per_s']:,.0f} steps/s ({r['threads']} threads: {r['why']}; "
                    f"load before {r['load_before']})",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"{os.cpu_count()} CPUs, busy = {args.busy} extra `while True: pass` processes; load = 1-min load average "
        f"before each run (other users of the machine included); niceness of the measured and busy processes "
        f"{args.nice}"
    )
    print(
        f"{'case':<12}{'policy':<8}{'threads':>8}{'alone steps/s':>15}{'busy steps/s':>14}{'slowdown':>10}"
        f"{'load alone/busy':>17}"
    )
    for case in args.cases.split(","):
        for policy in args.policies.split(","):
            a = next((r for r in rows if (r["case"], r["policy"], r["cond"]) == (case, policy, "alone")), None)
            b = next((r for r in rows if (r["case"], r["policy"], r["cond"]) == (case, policy, "busy")), None)
            if a is None or b is None:
                continue
            th = f"{a['threads']}/{b['threads']}"
            print(
                f"{case:<12}{policy:<8}{th:>8}{a['steps_per_s']:>15,.0f}{b['steps_per_s']:>14,.0f}"
                f"{a['steps_per_s'] / max(b['steps_per_s'], 1e-9):>9.1f}x"
                f"{a['load_before']:>9.1f}/{b['load_before']:.1f}"
            )
    print(
        json.dumps(
            {
                "bench": "shared_node",
                "cpus": os.cpu_count(),
                "busy": args.busy,
                "sets": args.set,
                "nice": args.nice,
                "rows": rows,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
