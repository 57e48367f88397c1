"""What the gymnasium bridges cost, side by side with what they wrap.

    python bench/gym_envs.py [--num-envs 8 64] [--steps 300] [--pod-envs 4096] [--repeats 3]

Rows, each a ratio to its peer in the same run (A and B alternated ``--repeats`` times, the
median kept, so a shared machine's load falls on both):

- ``gymnasium task``: the pod's env of ``env.name: gymnasium`` (``GymVecEnv`` of Acrobot-v1,
  tensors at the boundary, episode bookkeeping) vs a bare ``gymnasium`` ``SyncVectorEnv`` with
  same-step autoreset stepped with numpy actions (the peer); ``async`` vs that same peer.
- ``podracer vector env``: ``gymnasium.make_vec("podracer/Pendulum-v0", ...)`` stepped through
  gymnasium's API (numpy in and out) vs the pod's own batched env (``make_env("pendulum")``,
  tensors) at ``--pod-envs`` envs.

Prints a table, then one JSON line with every measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

import podracer_hpc.gym_envs  # noqa: F401  (registers podracer/Pendulum-v0)
from podracer_hpc.envs import make_env
from podracer_hpc.envs.gym_adapter import GymVecEnv


def rate(step, acts: list, n: int, steps: int) -> float:
    """Env steps/s of ``steps`` calls of ``step`` (5 warm-up calls first; actions cycled)."""
    for i in range(5):
        step(acts[i % len(acts)])
    t0 = time.perf_counter()
    for i in range(steps):
        step(acts[i % len(acts)])
    return n * steps / (time.perf_counter() - t0)


def side_by_side(make_a, make_b, repeats: int) -> tuple[float, float]:
    """Median steps/s of A and of B, measured alternately."""
    a, b = [], []
    for _ in range(repeats):
        a.append(make_a())
        b.append(make_b())
    return statistics.median(a), statistics.median(b)


def gym_task_row(mode: str, n: int, steps: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    acts_np = [rng.integers(0, 3, n) for _ in range(16)]
    acts_t = [torch.as_tensor(a) for a in acts_np]

    def ours() -> float:
        env = GymVecEnv("Acrobot-v1", n, vectorization=mode)
        env.reset(0)
        r = rate(env.step, acts_t, n, steps)
        env.close()
        return r

    def peer() -> float:
        env = gym.make_vec(
            "Acrobot-v1",
            num_envs=n,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        )
        env.reset(seed=0)
        r = rate(env.step, acts_np, n, steps)
        env.close()
        return r

    a, b = side_by_side(ours, peer, repeats)
    return {
        "row": f"gymnasium task ({mode})",
        "env": "Acrobot-v1",
        "num_envs": n,
        "steps_per_s": a,
        "peer": "bare SyncVectorEnv",
        "peer_steps_per_s": b,
        "ratio": a / b,
    }


def vector_env_row(n: int, steps: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    acts_t = [4 * torch.rand(n, 1, generator=g) - 2 for _ in range(16)]
    acts_np = [a.numpy() for a in acts_t]

    def ours() -> float:
        env = gym.make_vec("podracer/Pendulum-v0", num_envs=n, vectorization_mode="vector_entry_point")
        env.reset(seed=0)
        return rate(env.step, acts_np, n, steps)

    def peer() -> float:
        env = make_env("pendulum", n)
        env.reset(0)
        return rate(env.step, acts_t, n, steps)

    a, b = side_by_side(ours, peer, repeats)
    return {
        "row": "podracer vector env",
        "env": "podracer/Pendulum-v0",
        "num_envs": n,
        "steps_per_s": a,
        "peer": "the pod's env (make_env)",
        "peer_steps_per_s": b,
        "ratio": a / b,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-envs", type=int, nargs="+", default=[8, 64])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--pod-envs", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for n in args.num_envs:
        rows.append(gym_task_row("sync", n, args.steps, args.repeats))
        rows.append(gym_task_row("async", n, args.steps, args.repeats))
    rows.append(vector_env_row(args.pod_envs, args.steps, args.repeats))
    print(f"{'row':26} {'env':22} {'envs':>6} {'steps/s':>11} {'peer steps/s':>13} {'ratio':>6}  peer")
    for r in rows:
        print(
            f"{r['row']:26} {r['env']:22} {r['num_envs']:>6} {r['steps_per_s']:>11,.0f} "
            f"{r['peer_steps_per_s']:>13,.0f} {r['ratio']:>6.2f}  {r['peer']}"
        )
    load = os.getloadavg()[0]
    print(
        json.dumps(
            {
                "bench": "gym_envs",
                "threads": args.threads,
                "cpus": os.cpu_count(),
                "load_1min": load,
                "steps": args.steps,
                "repeats": args.repeats,
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
