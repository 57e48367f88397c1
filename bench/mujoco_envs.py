"""Env steps/s of the MuJoCo v5 tasks on each backend, side by side with gymnasium's SyncVectorEnv.

    python bench/mujoco_envs.py [--num-envs 64] [--steps 200] [--tasks hopper,ant] [--threads 0]
    python bench/mujoco_envs.py --backends warp --device cuda --num-envs 4096 32768 --tasks halfcheetah,ant

Rows: ``envpool``, ``gymnasium`` and ``warp`` are the VecEnv adapters of podracer_hpc.envs.mujoco
(tensors at the boundary or on the device, same-step autoreset, episode bookkeeping);
``gym-sync-raw`` is a bare ``gymnasium.vector.SyncVectorEnv`` stepped with numpy actions (the
reference). Random uniform actions, so the falling tasks reset often (resets are part of the
cost). ``build_s`` in the JSON is the adapter's construction time (for warp: model upload, kernel
compilation or cache load, graph capture). Prints a table, then one JSON line with every
measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

import numpy as np
import torch

from podracer_hpc.envs import make_env
from podracer_hpc.envs.mujoco_tasks import GYM_IDS


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _steps_per_s(env, acts: list, n: int, steps: int, device: str = "cpu") -> float:
    """Env steps/s of ``steps`` batched steps after 5 warm-up steps (actions cycled), then close."""
    for i in range(5):
        env.step(acts[i % len(acts)])
    _sync(device)
    t0 = time.perf_counter()
    for i in range(steps):
        env.step(acts[i % len(acts)])
    _sync(device)
    dt = time.perf_counter() - t0
    env.close()
    return n * steps / dt


def time_adapter(task: str, backend: str, n: int, steps: int, threads: int, device: str = "cpu") -> tuple[float, float]:
    """(env steps/s, construction seconds) of the ``backend`` adapter on ``device``."""
    opts = {"num_threads": threads} if backend == "envpool" else {}
    t0 = time.perf_counter()
    env = make_env(task, n, device, seed=0, backend=backend, **opts)
    env.reset(0)
    _sync(device)
    build_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    acts = [(env.action_high * (2 * torch.rand(n, env.act_dim, generator=g) - 1)).to(device) for _ in range(16)]
    return _steps_per_s(env, acts, n, steps, device), build_s


def time_raw_gym(task: str, n: int, steps: int) -> float:
    import gymnasium as gym

    env = gym.vector.SyncVectorEnv(
        [lambda: gym.make(GYM_IDS[task]) for _ in range(n)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    hi = env.single_action_space.high
    acts = [hi * rng.uniform(-1, 1, (n, *env.single_action_space.shape)).astype(np.float32) for _ in range(16)]
    return _steps_per_s(env, acts, n, steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-envs", type=int, nargs="+", default=[64], help="batch sizes (one row each)")
    p.add_argument("--steps", type=int, default=200, help="timed steps of the whole batch")
    p.add_argument("--tasks", default=",".join(GYM_IDS))
    p.add_argument("--threads", type=int, default=0, help="envpool worker threads (0 = envpool's default)")
    p.add_argument(
        "--backends",
        default="",
        help="comma-separated: envpool,gymnasium,warp,gym-sync-raw (default: the CPU ones installed)",
    )
    p.add_argument("--device", default="cpu", help="device of the adapters' tensors (warp simulates there)")
    a = p.parse_args()
    torch.set_num_threads(1)
    backends = (
        a.backends.split(",")
        if a.backends
        else (["envpool"] if importlib.util.find_spec("envpool") else []) + ["gymnasium", "gym-sync-raw"]
    )
    tasks = a.tasks.split(",")
    rows = []
    for task in tasks:
        for n in a.num_envs:
            for b in backends:
                if b == "gym-sync-raw":
                    sps, build_s = time_raw_gym(task, n, a.steps), None
                else:
                    sps, build_s = time_adapter(task, b, n, a.steps, a.threads, a.device)
                rows.append(
                    {
                        "task": task,
                        "backend": b,
                        "num_envs": n,
                        "device": a.device if b != "gym-sync-raw" else "cpu",
                        "steps_per_s": round(sps, 1),
                        "build_s": None if build_s is None else round(build_s, 2),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)  # as they come (a long run shows progress)
    by = {(r["task"], r["num_envs"], r["backend"]): r["steps_per_s"] for r in rows}
    ratio = "envpool" in backends and "gym-sync-raw" in backends
    print(
        f"MuJoCo v5 env steps/s, {a.steps} batch steps, device {a.device}, {os.cpu_count()} CPUs visible, "
        f"envpool threads={a.threads or 'default'}"
    )
    print(f"{'task':<12}{'envs':>8}" + "".join(f"{b:>15}" for b in backends) + ("  envpool/raw" if ratio else ""))
    for task in tasks:
        for n in a.num_envs:
            line = f"{task:<12}{n:>8}" + "".join(f"{by[(task, n, b)]:>15,.0f}" for b in backends)
            if ratio:
                line += f"  {by[(task, n, 'envpool')] / by[(task, n, 'gym-sync-raw')]:>10.1f}x"
            print(line)
    print(
        json.dumps(
            {
                "bench": "mujoco_envs",
                "num_envs": a.num_envs,
                "steps": a.steps,
                "device": a.device,
                "cpus": os.cpu_count(),
                "results": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
