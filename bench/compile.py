"""agent.compile side by side: today's code (the revision the work started from, ``--old-ref``),
eager and compiled agents of this checkout, on this machine, one thread each.

Two parts, one run:

1. The update step: PPO's minibatch step (the loss and its gradients, gradient clip, Adam; today
   through autograd, this checkout's written out: agents/ppo_grads.py) on 128 rows (the
   halfcheetah job's minibatch) and SAC's and TD3's gradient update on 256 transitions, at 64x64
   and 256x256 networks. The variants run in alternating blocks (today, eager, compiled, today, ...)
   so that a change in the machine's load hits all of them; the table gives each one's median
   block. Today's PPO is ``agents/ppo.py`` of ``--old-ref`` (loaded from git beside this one).
2. End to end: the halfcheetah (PPO, MuJoCo on the host) and pendulum (PPO, torch env) jobs for
   ``--steps`` env steps each, one fresh process per run (today's code from ``git archive`` of
   ``--old-ref``; this checkout eager; compiled with a cold inductor cache, a new directory; and
   compiled again with that now warm cache, as a requeue on the same node finds it), the runs in
   turn, ``--repeats`` rounds: the time from the pod's construction (compiling included), the
   compile time (the first iterations' time beyond the steady rate) and the steady env steps/s.
   One torch thread and, for MuJoCo, one EnvPool thread in every variant (``JOB_SET``).
   Start-up outside the training clock (imports, the first torch optimizer's torch._dynamo) is
   outside this timing for every variant alike.

    PYTHONPATH=$PWD python bench/compile.py [--old-ref 225d40a] [--steps 200000] [--repeats 2] [--quick]

Prints a table and, last, one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import alternate_blocks, module_at  # noqa: E402  (bench/_timing.py)

from podracer_hpc.agents.ppo import PPOAgent  # noqa: E402
from podracer_hpc.agents.replay import ReplayBuffer  # noqa: E402
from podracer_hpc.agents.sac import SACAgent  # noqa: E402
from podracer_hpc.agents.settings import PPOConfig, SACConfig, TD3Config  # noqa: E402
from podracer_hpc.agents.td3 import TD3Agent  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OBS, ACT = 17, 6  # halfcheetah's


def old_ppo(ref: str) -> type:
    """``PPOAgent`` of revision ``ref`` (``agents/ppo.py`` from git, as the module
    ``podracer_hpc.agents._old_ppo``; the rest of the package is the checkout's)."""
    return module_at(ref, "ppo").PPOAgent


def ppo_step(hidden: int, mode: str, cls: type = PPOAgent):
    """A function doing 8 PPO minibatch steps of 128 rows (one epoch over 1,024), and its count."""
    torch.manual_seed(0)
    cfg = PPOConfig(hidden_sizes=[hidden, hidden], activation="relu", num_minibatches=8, update_epochs=1, compile=mode)
    agent = cls(OBS, ACT, False, 0, 16, cfg)
    g = torch.Generator().manual_seed(0)
    B = 1024
    batch = (
        torch.randn(B, OBS),
        torch.randn(B, ACT),
        torch.randn(B) - 5,
        torch.randn(B),
        torch.randn(B),
        torch.randn(B),
    )

    def run() -> None:
        agent.update(*batch, g, 0.5)

    return run, 8


def offpolicy_step(algo: str, hidden: int, mode: str):
    """A function doing 8 gradient updates of SAC or TD3 on 256 transitions, and its count."""
    torch.manual_seed(0)
    cls, cfg_cls = (SACAgent, SACConfig) if algo == "sac" else (TD3Agent, TD3Config)
    agent = cls(
        OBS,
        ACT,
        cfg_cls(hidden_sizes=[hidden, hidden], compile=mode, policy_delay=2)
        if algo == "td3"
        else cfg_cls(hidden_sizes=[hidden, hidden], compile=mode),
    )
    buf = ReplayBuffer(4096, 16, OBS, ACT, "cpu")
    for _ in range(256):
        buf.add(
            torch.randn(16, OBS),
            torch.rand(16, ACT) * 2 - 1,
            torch.randn(16),
            torch.randn(16, OBS),
            torch.zeros(16, dtype=torch.bool),
            torch.zeros(16, dtype=torch.bool),
        )
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


# one torch thread and one envpool thread for every variant (as bench/learning.py's MuJoCo runs):
# "one thread each", and on 2 cores the physics and the pod's bookkeeping then overlap best
JOB_SET = {"jobs/halfcheetah.yaml": ["env.mujoco.num_threads=1"]}


def worker(tree: str, job: str, mode: str, steps: int) -> dict:
    """One pod of ``job`` (from ``tree``'s code) for ``steps`` env steps, timed from its
    construction (run in a fresh process: ``--worker``). ``mode`` ``today`` is ``tree``'s code
    as it is (before agent.compile existed), else this checkout's ``agent.compile``."""
    sys.path.insert(0, tree)
    for name in [m for m in sys.modules if m == "podracer_hpc" or m.startswith("podracer_hpc.")]:
        del sys.modules[name]  # the tree's package, not the one this script imported
    from podracer_hpc.config import load_config as load
    from podracer_hpc.pod import Pod as TreePod

    torch.set_num_threads(1)
    # start-up outside the timing, alike for every variant: MuJoCo/gymnasium imports, torch._dynamo
    # (imported by a process's first torch optimizer)
    TreePod(load(str(Path(tree) / job), ["threads=1"]))
    torch.optim.Adam([torch.zeros(1, requires_grad=True)], fused=True)
    overrides = [f"total_env_steps={steps}", "threads=1", *JOB_SET.get(job, [])] + (
        [] if mode == "today" else [f"agent.compile={mode}"]
    )
    t0 = time.perf_counter()
    pod = TreePod(load(str(Path(tree) / job), overrides))
    build, ts = time.perf_counter() - t0, []
    while pod.env_steps < steps:
        t1 = time.perf_counter()
        float(pod.train_iteration()["loss"])  # the host sync a logged row does
        ts.append(time.perf_counter() - t1)
    steady = statistics.median(ts[min(3, len(ts) - 1) :])
    wall = build + sum(ts)
    return {
        "mode": mode,
        "env_steps": pod.env_steps,
        "wall_s": wall,
        "build_s": build,
        "compile_s": max(0.0, sum(ts[:3]) - len(ts[:3]) * steady),
        "steady_sps": pod.env_steps / len(ts) / steady,
        "end_to_end_sps": pod.env_steps / wall,
        "env_compiled": bool(getattr(pod, "env_compiled", False)),
    }


def end_to_end(job: str, steps: int, old_tree: str, repeats: int) -> dict[str, dict]:
    """Today's code, eager, compiled from a cold and then from a warm cache: ``repeats`` rounds of
    fresh processes, the variants in turn; each variant's figures are its median run's."""
    variants = (
        ("today", old_tree, "today"),
        ("eager", str(REPO), "off"),
        ("compiled, cold cache", str(REPO), "on"),
        ("compiled, warm cache", str(REPO), "on"),
    )
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
            env = {k: v for k, v in os.environ.items() if k not in ("PODRACER_CACHE_DIR", "TORCHINDUCTOR_VEC_ISA_OK")}
            env["TORCHINDUCTOR_CACHE_DIR"] = cache  # fresh for the cold run, then warm
            for name, tree, mode in variants:
                cmd = [sys.executable, __file__, "--worker", tree, job, mode, str(steps)]
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
                if r.returncode:
                    raise SystemExit(f"{name} run of {job} failed:\n{r.stderr[-3000:]}")
                runs[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
    return {
        name: {**sorted(rs, key=lambda x: x["wall_s"])[len(rs) // 2], "wall_s_all": [x["wall_s"] for x in rs]}
        for name, rs in runs.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--old-ref",
        default="225d40a",
        help="today's code: the revision to compare with (default: the revision before agent.compile)",
    )
    ap.add_argument("--steps", type=int, default=200_000, help="env steps of the halfcheetah runs")
    ap.add_argument("--pendulum-steps", type=int, default=200_000, help="env steps of the pendulum runs")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of end-to-end runs (a median is reported)")
    ap.add_argument("--blocks", type=int, default=5, help="alternating timing blocks per variant")
    ap.add_argument("--block-s", type=float, default=1.0, help="seconds per timing block")
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny end-to-end runs, short blocks")
    ap.add_argument("--skip-e2e", action="store_true", help="the update steps only")
    ap.add_argument("--skip-update", action="store_true", help="the end-to-end runs only")
    ap.add_argument("--worker", nargs=4, metavar=("TREE", "JOB", "MODE", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        tree, job, mode, steps = args.worker
        print(json.dumps(worker(tree, job, mode, int(steps))))
        return
    if args.quick:
        args.steps, args.pendulum_steps, args.blocks, args.block_s, args.repeats = 4096, 16384, 2, 0.3, 1
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    rows = []
    today_ppo = None if args.skip_update else old_ppo(args.old_ref)
    for hidden in () if args.skip_update else (64, 256):
        cases = {
            "ppo": ppo_step,
            "sac": lambda h, m: offpolicy_step("sac", h, m),
            "td3": lambda h, m: offpolicy_step("td3", h, m),
        }
        for algo, maker in cases.items():
            makers = {mode: (maker, (hidden, mode)) for mode in ("off", "on")}
            if algo == "ppo":
                makers = {"today": (ppo_step, (hidden, "off", today_ppo)), **makers}
            res = time_blocks(makers, args.blocks, args.block_s)
            e, c = res["off"], res["on"]
            t = res.get("today", {}).get("median_ms")
            rows.append(
                {
                    "part": "update",
                    "algo": algo,
                    "hidden": hidden,
                    "today_ms": t,
                    "eager_ms": e["median_ms"],
                    "compiled_ms": c["median_ms"],
                    "speedup": e["median_ms"] / c["median_ms"],
                    "eager_vs_today": t / e["median_ms"] if t else None,
                    "compiled_vs_today": t / c["median_ms"] if t else None,
                    "compile_s": c["first_s"] - e["first_s"],
                }
            )
    print(f"update step, one thread, load average {load:.2f} (PPO: 128 rows; SAC/TD3: 256); today = {args.old_ref}")
    print(
        f"{'algo':5} {'net':>8} {'today ms':>9} {'eager ms':>9} {'compiled ms':>12} {'compiled x eager':>17} "
        f"{'x today: eager':>15} {'compiled':>9} {'compile s':>10}"
    )
    for r in rows:
        t = r["today_ms"]
        print(
            f"{r['algo']:5} {r['hidden']:>4}x{r['hidden']:<3} {t or float('nan'):9.3f} {r['eager_ms']:9.3f} "
            f"{r['compiled_ms']:12.3f} {r['speedup']:16.2f}x {r['eager_vs_today'] or float('nan'):14.2f}x "
            f"{r['compiled_vs_today'] or float('nan'):8.2f}x {r['compile_s']:10.1f}"
        )
    e2e = []
    if not args.skip_e2e:
        with tempfile.TemporaryDirectory(prefix="podracer-today-") as old_tree:
            archive = subprocess.run(["git", "archive", args.old_ref], cwd=REPO, check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", old_tree], input=archive, check=True)
            for job, steps in (("jobs/halfcheetah.yaml", args.steps), ("jobs/pendulum.yaml", args.pendulum_steps)):
                runs = end_to_end(job, steps, old_tree, args.repeats)
                today = runs["today"]
                for name, x in runs.items():
                    x["x_today_end_to_end"] = x["end_to_end_sps"] / today["end_to_end_sps"]
                    x["x_today_steady"] = x["steady_sps"] / today["steady_sps"]
                e2e.append({"part": "end_to_end", "job": job, "env_steps": today["env_steps"], "runs": runs})
        print(
            f"\nend to end, one pod, one thread, fresh processes, median of {args.repeats} rounds; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        print(
            f"{'job':17} {'steps':>8} {'variant':>21} {'wall s':>7} {'compile s':>10} {'steady sps':>11} "
            f"{'e2e sps':>8} {'x today e2e':>12} {'steady':>7}"
        )
        for r in e2e:
            for name, x in r["runs"].items():
                print(
                    f"{Path(r['job']).name:17} {x['env_steps']:>8} {name:>21} {x['wall_s']:7.1f} "
                    f"{x['compile_s']:10.1f} {x['steady_sps']:11.0f} {x['end_to_end_sps']:8.0f} "
                    f"{x['x_today_end_to_end']:11.2f}x {x['x_today_steady']:6.2f}x"
                )
    print(
        json.dumps(
            {
                "bench": "compile",
                "old_ref": args.old_ref,
                "threads": 1,
                "load_start": load,
                "update": rows,
                "end_to_end": e2e,
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
