"""agent.compile side by side: eager vs torch.compile'd agents on this machine, one thread each.

Two parts, one run:

1. The update step: PPO's minibatch step (loss, backward, gradient clip, Adam) on 128 rows (the
   halfcheetah job's minibatch) and SAC's and TD3's gradient update on 256 transitions, at 64x64
   and 256x256 networks. The variants run in alternating blocks (eager, compiled, eager, ...) so
   that a change in the machine's load hits both; the table gives each one's median block.
2. End to end: the halfcheetah (PPO, MuJoCo on the host) and pendulum (PPO, torch env) jobs for
   ``--steps`` env steps each, an eager and a compiled pod with their iterations interleaved, from
   the pod's construction: the time with compiling included, the compile time (the first
   iterations' time beyond the steady rate) and the steady env steps/s.

    PYTHONPATH=$PWD python bench/compile.py [--steps 200000] [--pendulum-steps 200000] [--quick]

Prints a table and, last, one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from podracer_hpc.agents.ppo import PPOAgent  # noqa: E402
from podracer_hpc.agents.replay import ReplayBuffer  # noqa: E402
from podracer_hpc.agents.sac import SACAgent  # noqa: E402
from podracer_hpc.agents.td3 import TD3Agent  # noqa: E402
from podracer_hpc.config import PPOConfig, SACConfig, TD3Config, load_config  # noqa: E402
from podracer_hpc.pod import Pod  # noqa: E402
from _timing import alternate_blocks  # noqa: E402  (bench/_timing.py)

REPO = Path(__file__).resolve().parent.parent
OBS, ACT = 17, 6  # halfcheetah's


def ppo_step(hidden: int, mode: str):
    """A function doing 8 PPO minibatch steps of 128 rows (one epoch over 1,024), and its count."""
    torch.manual_seed(0)
    cfg = PPOConfig(hidden_sizes=[hidden, hidden], activation="relu", num_minibatches=8, update_epochs=1,
                    compile=mode)
    agent = PPOAgent(OBS, ACT, False, 0, 16, cfg)
    g = torch.Generator().manual_seed(0)
    B = 1024
    batch = (torch.randn(B, OBS), torch.randn(B, ACT), torch.randn(B) - 5, torch.randn(B), torch.randn(B),
             torch.randn(B))

    def run() -> None:
        agent.update(*batch, g, 0.5)
    return run, 8


def offpolicy_step(algo: str, hidden: int, mode: str):
    """A function doing 8 gradient updates of SAC or TD3 on 256 transitions, and its count."""
    torch.manual_seed(0)
    cls, cfg_cls = (SACAgent, SACConfig) if algo == "sac" else (TD3Agent, TD3Config)
    agent = cls(OBS, ACT, cfg_cls(hidden_sizes=[hidden, hidden], compile=mode, policy_delay=2)
                if algo == "td3" else cfg_cls(hidden_sizes=[hidden, hidden], compile=mode))
    buf = ReplayBuffer(4096, 16, OBS, ACT, "cpu")
    for _ in range(256):
        buf.add(torch.randn(16, OBS), torch.rand(16, ACT) * 2 - 1, torch.randn(16), torch.randn(16, OBS),
                torch.zeros(16, dtype=torch.bool), torch.zeros(16, dtype=torch.bool))
    g = torch.Generator().manual_seed(0)

    def run() -> None:
        agent.update(buf, g, 8)
    return run, 8


def time_blocks(makers: dict[str, tuple], blocks: int, seconds: float) -> dict[str, dict]:
    """Median ms per step of each variant over alternating blocks of about ``seconds`` each."""
    out, runs = {}, {}
    for name, (make, args) in makers.items():
        t0 = time.perf_counter()
        run, per = make(*args)
        run()
        run()  # compiles (and warms up) here
        runs[name] = (run, per)
        out[name] = {"first_s": time.perf_counter() - t0}
    for name, ms in alternate_blocks(runs, blocks, seconds).items():
        out[name].update(ms=ms, median_ms=statistics.median(ms))
    return out


def end_to_end(job: str, steps: int) -> dict[str, dict]:
    """One eager and one compiled pod of ``job`` for ``steps`` env steps each (no evaluations),
    their iterations interleaved (a change of the machine's load hits both): each one's time from
    its construction (compiling included), its steady env steps/s (median iteration after the
    first three) and its compile time (the first three iterations' time beyond the steady rate)."""
    Pod(load_config(str(REPO / job), ["threads=1"]))  # imports (MuJoCo, gymnasium) outside the timing
    pods, times, build = {}, {}, {}
    for mode in ("off", "on"):
        t0 = time.perf_counter()
        pods[mode] = Pod(load_config(str(REPO / job), [f"total_env_steps={steps}", f"agent.compile={mode}",
                                                       "threads=1"]))
        build[mode], times[mode] = time.perf_counter() - t0, []
    while any(p.env_steps < steps for p in pods.values()):
        for mode, pod in pods.items():
            if pod.env_steps < steps:
                t1 = time.perf_counter()
                float(pod.train_iteration()["loss"])  # the host sync a logged row does
                times[mode].append(time.perf_counter() - t1)
    out = {}
    for mode, pod in pods.items():
        ts = times[mode]
        steady = statistics.median(ts[min(3, len(ts) - 1):])
        wall = build[mode] + sum(ts)
        out[mode] = {"mode": mode, "env_steps": pod.env_steps, "wall_s": wall, "build_s": build[mode],
                     "compile_s": max(0.0, sum(ts[:3]) - len(ts[:3]) * steady),
                     "steady_sps": pod.env_steps / len(ts) / steady, "end_to_end_sps": pod.env_steps / wall,
                     "env_compiled": pod.env_compiled}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200_000, help="env steps of the halfcheetah runs")
    ap.add_argument("--pendulum-steps", type=int, default=200_000, help="env steps of the pendulum runs")
    ap.add_argument("--blocks", type=int, default=5, help="alternating timing blocks per variant")
    ap.add_argument("--block-s", type=float, default=1.0, help="seconds per timing block")
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny end-to-end runs, short blocks")
    ap.add_argument("--skip-e2e", action="store_true", help="the update steps only")
    ap.add_argument("--skip-update", action="store_true", help="the end-to-end runs only")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.pendulum_steps, args.blocks, args.block_s = 4096, 16384, 2, 0.3
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    rows = []
    for hidden in () if args.skip_update else (64, 256):
        cases = {"ppo": ppo_step, "sac": lambda h, m: offpolicy_step("sac", h, m),
                 "td3": lambda h, m: offpolicy_step("td3", h, m)}
        for algo, maker in cases.items():
            res = time_blocks({mode: (maker, (hidden, mode)) for mode in ("off", "on")}, args.blocks, args.block_s)
            e, c = res["off"], res["on"]
            rows.append({"part": "update", "algo": algo, "hidden": hidden, "eager_ms": e["median_ms"],
                         "compiled_ms": c["median_ms"], "speedup": e["median_ms"] / c["median_ms"],
                         "compile_s": c["first_s"] - e["first_s"]})
    print(f"update step, one thread, load average {load:.2f} (PPO: 128 rows; SAC/TD3: 256)")
    print(f"{'algo':5} {'net':>8} {'eager ms':>9} {'compiled ms':>12} {'speedup':>8} {'compile s':>10}")
    for r in rows:
        print(f"{r['algo']:5} {r['hidden']:>4}x{r['hidden']:<3} {r['eager_ms']:9.3f} {r['compiled_ms']:12.3f} "
              f"{r['speedup']:7.2f}x {r['compile_s']:10.1f}")
    e2e = []
    if not args.skip_e2e:
        for job, steps in (("jobs/halfcheetah.yaml", args.steps), ("jobs/pendulum.yaml", args.pendulum_steps)):
            runs = end_to_end(job, steps)
            e, c = runs["off"], runs["on"]
            e2e.append({"part": "end_to_end", "job": job, "env_steps": c["env_steps"], "eager": e, "compiled": c,
                        "speedup_end_to_end": c["end_to_end_sps"] / e["end_to_end_sps"],
                        "speedup_steady": c["steady_sps"] / e["steady_sps"]})
        print(f"\nend to end, one pod, one thread, load average {os.getloadavg()[0]:.2f}")
        print(f"{'job':24} {'steps':>8} {'mode':>8} {'wall s':>8} {'compile s':>10} {'steady sps':>11} "
              f"{'e2e sps':>9} {'speedup':>8}")
        for r in e2e:
            for mode in ("eager", "compiled"):
                x = r[mode]
                sp = f"{r['speedup_end_to_end']:7.2f}x" if mode == "compiled" else ""
                print(f"{Path(r['job']).name:24} {x['env_steps']:>8} {mode:>8} {x['wall_s']:8.1f} "
                      f"{x['compile_s']:10.1f} {x['steady_sps']:11.0f} {x['end_to_end_sps']:9.0f} {sp:>8}")
    print(json.dumps({"bench": "compile", "threads": 1, "load_start": load, "update": rows, "end_to_end": e2e,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
