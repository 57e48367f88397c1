"""Env steps/s of the MuJoCo v5 tasks on each backend, side by side with gymnasium's SyncVectorEnv.

    python bench/mujoco_envs.py [--num-envs 64] [--steps 200] [--tasks hopper,ant] [--threads 0]

Rows: ``envpool`` and ``gymnasium`` are the VecEnv adapters of podracer_hpc.envs.mujoco (tensors
at the boundary, same-step autoreset, episode bookkeeping); ``gym-sync-raw`` is a bare
``gymnasium.vector.SyncVectorEnv`` stepped with numpy actions (the reference). Random uniform
actions, so the falling tasks reset often (resets are part of the cost). Prints a table, then
one JSON line with every measurement.
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
from podracer_hpc.envs.mujoco import GYM_IDS


def _steps_per_s(env, acts: list, n: int, steps: int) -> float:
    """Env steps/s of ``steps`` batched steps after 5 warm-up steps (actions cycled), then close."""
    for i in range(5):
        env.step(acts[i % len(acts)])
    t0 = time.perf_counter()
    for i in range(steps):
        env.step(acts[i % len(acts)])
    dt = time.perf_counter() - t0
    env.close()
    return n * steps / dt


def time_adapter(task: str, backend: str, n: int, steps: int, threads: int) -> float:
    opts = {"num_threads": threads} if backend == "envpool" else {}
    env = make_env(task, n, "cpu", seed=0, backend=backend, **opts)
    env.reset(0)
    g = torch.Generator().manual_seed(0)
    acts = [env.action_high * (2 * torch.rand(n, env.act_dim, generator=g) - 1) for _ in range(16)]
    return _steps_per_s(env, acts, n, steps)


def time_raw_gym(task: str, n: int, steps: int) -> float:
    import gymnasium as gym

    env = gym.vector.SyncVectorEnv([lambda: gym.make(GYM_IDS[task]) for _ in range(n)],
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    hi = env.single_action_space.high
    acts = [hi * rng.uniform(-1, 1, (n, *env.single_action_space.shape)).astype(np.float32) for _ in range(16)]
    return _steps_per_s(env, acts, n, steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--steps", type=int, default=200, help="timed steps of the whole batch")
    p.add_argument("--tasks", default=",".join(GYM_IDS))
    p.add_argument("--threads", type=int, default=0, help="envpool worker threads (0 = envpool's default)")
    a = p.parse_args()
    torch.set_num_threads(1)
    backends = (["envpool"] if importlib.util.find_spec("envpool") else []) + ["gymnasium", "gym-sync-raw"]
    rows = []
    for task in a.tasks.split(","):
        for b in backends:
            sps = time_raw_gym(task, a.num_envs, a.steps) if b == "gym-sync-raw" else \
                time_adapter(task, b, a.num_envs, a.steps, a.threads)
            rows.append({"task": task, "backend": b, "num_envs": a.num_envs, "steps_per_s": round(sps, 1)})
    by = {(r["task"], r["backend"]): r["steps_per_s"] for r in rows}
    print(f"MuJoCo v5 env steps/s, {a.num_envs} envs, {a.steps} batch steps, {os.cpu_count()} CPUs visible, "
          f"envpool threads={a.threads or 'default'}")
    print(f"{'task':<12}" + "".join(f"{b:>15}" for b in backends) +
          ("  envpool/raw" if "envpool" in backends else ""))
    for task in a.tasks.split(","):
        line = f"{task:<12}" + "".join(f"{by[(task, b)]:>15,.0f}" for b in backends)
        if "envpool" in backends:
            line += f"  {by[(task, 'envpool')] / by[(task, 'gym-sync-raw')]:>10.1f}x"
        print(line)
    print(json.dumps({"bench": "mujoco_envs", "num_envs": a.num_envs, "steps": a.steps,
                      "cpus": os.cpu_count(), "results": rows}))


if __name__ == "__main__":
    main()
