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

    python bench/jax_env.py --playground CartpoleBalance [--impl jax] --num-envs 256 4096

(with MuJoCo Playground installed: ``.venv-mjx``, docs/jax.md) measures a real Playground env
instead, against Playground's own ``jax.jit(jax.vmap(env.step))`` (the peer: no time limit, no
auto-reset, no torch) in the same run: ``jax adapter`` (the pod's view, as above) and ``jax step
alone`` (the adapter's compiled step with its time limit and auto-reset, JAX arrays in and out).
Actions uniform in [-1, 1].
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


def adapter_rows(
    env, acts: list, peer, peer_on_jax: bool, peer_name: str, n: int, steps: int, repeats: int, device: str
) -> list[dict]:
    """The rows ``jax adapter`` (``env.step``, the pod's view) and ``jax step alone`` (its compiled
    step, JAX arrays in and out) of the jax task's ``env``, each against ``peer`` (a step function
    given the same actions: as JAX arrays if ``peer_on_jax``, else as ``acts``' torch tensors),
    timed in turn ``repeats`` times; medians."""
    import jax

    jacts = [jax.device_put(a.cpu().numpy(), env.jax_device) for a in acts]

    def bare(a):
        out = env._step_fn(env.state, env.keys, env.t, a)
        env.state, env.keys, env.t = out[:3]
        return out

    measured = {"peer": [], "adapter": [], "bare": []}
    for _ in range(repeats):
        measured["peer"].append(
            rate(peer, jacts, n, steps, device, ready=jax.block_until_ready)
            if peer_on_jax
            else rate(peer, acts, n, steps, device)
        )
        measured["adapter"].append(rate(env.step, acts, n, steps, device))
        measured["bare"].append(rate(bare, jacts, n, steps, device, ready=jax.block_until_ready))
    peer_rate = statistics.median(measured["peer"])
    out = []
    for key, row in (("adapter", "jax adapter"), ("bare", "jax step alone")):
        a = statistics.median(measured[key])
        out.append(
            {
                "row": row,
                "num_envs": n,
                "device": device,
                "steps_per_s": a,
                "peer": peer_name,
                "peer_steps_per_s": peer_rate,
                "ratio": a / peer_rate,
            }
        )
    return out


def rows_at(n: int, steps: int, repeats: int, device: str) -> list[dict]:
    """The jax Pendulum through the adapter against the torch Pendulum."""
    from podracer_hpc.envs import make_env

    g = torch.Generator().manual_seed(0)
    acts = [(4 * torch.rand(n, 1, generator=g) - 2).to(device) for _ in range(16)]
    torch_env = make_env("pendulum", n, device=device)
    jax_env = make_env("jax", n, device=device, factory="podracer_hpc.envs.jax_pendulum:make")
    torch_env.reset(0)
    jax_env.reset(0)
    return adapter_rows(jax_env, acts, torch_env.step, False, "torch Pendulum", n, steps, repeats, device)


def playground_rows_at(n: int, steps: int, repeats: int, device: str, name: str, impl: str) -> list[dict]:
    """The rows of ``--playground name``: the adapter and its step alone against Playground's jit(vmap(step))."""
    from podracer_hpc.envs import make_env

    kwargs = {"env_name": name, "config_overrides": {"impl": impl}}
    env = make_env("jax", n, device=device, factory="mujoco_playground:registry.load", kwargs=kwargs)
    import jax

    g = torch.Generator().manual_seed(0)
    acts = [(2 * torch.rand(n, env.act_dim, generator=g) - 1).to(device) for _ in range(16)]
    own_step = jax.jit(jax.vmap(env.env.step))
    own = {"state": env.state}

    def playground(a):
        own["state"] = own_step(own["state"], a)
        return own["state"].obs

    return adapter_rows(
        env, acts, playground, True, f"Playground {name} jit(vmap(step)), impl {impl}", n, steps, repeats, device
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-envs", type=int, nargs="+", default=[4096])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: XLA's CPU client on one thread too)")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--playground",
        default="",
        metavar="ENV_NAME",
        help="a MuJoCo Playground env (e.g. CartpoleBalance) against Playground's own jit(vmap(step))",
    )
    p.add_argument("--impl", default="jax", help="with --playground: MJX's implementation (jax or warp)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)  # before jax is imported: the adapter reads it then
    if args.playground:
        rows = [
            r
            for n in args.num_envs
            for r in playground_rows_at(n, args.steps, args.repeats, args.device, args.playground, args.impl)
        ]
    else:
        rows = [r for n in args.num_envs for r in rows_at(n, args.steps, args.repeats, args.device)]
    import jax

    peer = "Playground steps/s" if args.playground else "torch steps/s"
    print(f"{'row':16} {'device':7} {'envs':>8} {'steps/s':>13} {peer:>18} {'ratio':>6}")
    for r in rows:
        print(
            f"{r['row']:16} {r['device']:7} {r['num_envs']:>8} {r['steps_per_s']:>13,.0f} "
            f"{r['peer_steps_per_s']:>18,.0f} {r['ratio']:>6.2f}"
        )
    print(
        json.dumps(
            {
                "bench": "jax_env",
                "playground": args.playground or None,
                "threads": args.threads,
                "cpus": os.cpu_count(),
                "load_1min": os.getloadavg()[0],
                "jax": jax.__version__,
                "torch": torch.__version__,
                "xla_flags": os.environ.get("XLA_FLAGS", ""),
                "steps": args.steps,
                "repeats": args.repeats,
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
