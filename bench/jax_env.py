"""What the jax task's adapter costs, side by side with the torch env it reproduces.

    python bench/jax_env.py [--num-envs 4096] [--steps 300] [--repeats 3] [--threads 1] [--device cpu]

Rows at each ``--num-envs``, each a ratio to the torch Pendulum (``make_env("pendulum")``, eager
torch ops) measured in the same run (A and B alternated ``--repeats`` times, the median kept, so a
shared machine's load falls on both):

- ``jax adapter``: ``make_env("jax", factory=podracer_hpc.envs.jax_pendulum:make)``, the pod's
  view: torch actions in, DLPack to JAX, the jit(vmap) step with time limit and auto-reset,
  DLPack back, the episode totals in torch;
- ``jax step alone``: the adapter's compiled step called on JAX arrays (no DLPack, no torch):
  what the adapter itself adds is the gap between the two JAX rows.

The same actions (uniform torques) go to every env. On a GPU (``--device cuda``; a CUDA jax)
each timing ends with a device synchronize. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()  # waits for every stream of the device: JAX's too


def rate(step, acts: list, n: int, steps: int, device: str, ready=None) -> float:
    """Env steps/s of ``steps`` calls of ``step`` (10 warm-up calls first, compiles included there);
    ``ready(out)`` waits for the last output where the step returns JAX arrays (dispatched asynchronously)."""
    for i in range(10):
        out = step(acts[i % len(acts)])
    sync(device)
    t0 = time.perf_counter()
    for i in range(steps):
        out = step(acts[i % len(acts)])
    if ready is not None:
        ready(out)
    sync(device)
    return n * steps / (time.perf_counter() - t0)


def rows_at(n: int, steps: int, repeats: int, device: str) -> list[dict]:
    from podracer_hpc.envs import make_env

    g = torch.Generator().manual_seed(0)
    acts = [(4 * torch.rand(n, 1, generator=g) - 2).to(device) for _ in range(16)]
    torch_env = make_env("pendulum", n, device=device)
    jax_env = make_env("jax", n, device=device, factory="podracer_hpc.envs.jax_pendulum:make")
    torch_env.reset(0)
    jax_env.reset(0)
    import jax

    jacts = [jax.device_put(a.cpu().numpy(), jax_env.jax_device) for a in acts]

    def bare(a):
        out = jax_env._step_fn(jax_env.state, jax_env.keys, jax_env.t, a)
        jax_env.state, jax_env.keys, jax_env.t = out[:3]
        return out

    measured = {"torch": [], "adapter": [], "bare": []}
    for _ in range(repeats):
        measured["torch"].append(rate(torch_env.step, acts, n, steps, device))
        measured["adapter"].append(rate(jax_env.step, acts, n, steps, device))
        measured["bare"].append(rate(bare, jacts, n, steps, device, ready=jax.block_until_ready))
    peer = statistics.median(measured["torch"])
    out = []
    for key, row in (("adapter", "jax adapter"), ("bare", "jax step alone")):
        a = statistics.median(measured[key])
        out.append({"row": row, "num_envs": n, "device": device, "steps_per_s": a, "peer": "torch Pendulum",
                    "peer_steps_per_s": peer, "ratio": a / peer})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-envs", type=int, nargs="+", default=[4096])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: XLA's CPU client on one thread too)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(args.threads)  # before jax is imported: the adapter reads it then
    rows = [r for n in args.num_envs for r in rows_at(n, args.steps, args.repeats, args.device)]
    import jax

    print(f"{'row':16} {'device':7} {'envs':>8} {'steps/s':>13} {'torch steps/s':>14} {'ratio':>6}")
    for r in rows:
        print(f"{r['row']:16} {r['device']:7} {r['num_envs']:>8} {r['steps_per_s']:>13,.0f} "
              f"{r['peer_steps_per_s']:>14,.0f} {r['ratio']:>6.2f}")
    print(json.dumps({"bench": "jax_env", "threads": args.threads, "cpus": os.cpu_count(),
                      "load_1min": os.getloadavg()[0], "jax": jax.__version__, "torch": torch.__version__,
                      "xla_flags": os.environ.get("XLA_FLAGS", ""), "steps": args.steps, "repeats": args.repeats,
                      "rows": rows}))


if __name__ == "__main__":
    main()
