"""Benchmarks run side by side with a peer in the same process (ratios, not absolute timings).

Each returns ``{"table": str, "result": dict}``; the CLI prints the table, then the result as
one JSON line. These machines are shared and noisy: compare the ratio, not the raw numbers.
"""

from __future__ import annotations

import platform
import time
from typing import Any, Callable

import torch

from podracer_hpc.config import load_config
from podracer_hpc.envs import make_env

GYM_IDS = {"pendulum": "Pendulum-v1", "cartpole": "CartPole-v1"}


def _rate(step: Callable[[], None], per_call: int, seconds: float) -> float:
    """Calls per second x ``per_call``, after a warm-up, over about ``seconds``."""
    for _ in range(3):
        step()
    n, t0 = 0, time.perf_counter()
    while True:
        step()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n * per_call / dt


def _random_actions(env: Any, k: int, device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(0)
    if env.discrete:
        return [torch.randint(0, env.num_actions, (env.num_envs,), generator=g).to(device) for _ in range(k)]
    lo, hi = env.action_low, env.action_high
    return [(lo + (hi - lo) * torch.rand(env.num_envs, env.act_dim, generator=g)).to(device) for _ in range(k)]


def _gym_actions(env: Any, num_envs: int) -> list[Any]:
    """64 batches of uniform random actions for a gymnasium vector env (seeded)."""
    import gymnasium as gym
    import numpy as np

    rng = np.random.default_rng(0)
    if isinstance(env.single_action_space, gym.spaces.Discrete):
        return [rng.integers(0, env.single_action_space.n, num_envs) for _ in range(64)]
    sp = env.single_action_space
    return [rng.uniform(sp.low, sp.high, (num_envs, *sp.shape)).astype(np.float32) for _ in range(64)]


def _gym_stepper(env: Any, num_envs: int) -> Callable[[], None]:
    acts, i = _gym_actions(env, num_envs), [0]

    def step() -> None:
        env.step(acts[i[0] % 64])
        i[0] += 1

    return step


def gym_sync_rate(task: str, num_envs: int, seconds: float) -> float:
    """Env steps/s of gymnasium's SyncVectorEnv(num_envs) of the same task, random actions."""
    import gymnasium as gym

    env = gym.vector.SyncVectorEnv([lambda: gym.make(GYM_IDS[task]) for _ in range(num_envs)])
    env.reset(seed=0)
    r = _rate(_gym_stepper(env, num_envs), num_envs, seconds)
    env.close()
    return r


def gym_vector_env(task: str, num_envs: int) -> Any | None:
    """gymnasium's own batched env of the task (``make_vec(..., "vector_entry_point")``: numpy
    over all envs at once, the fastest peer it has; CartPole has one, Pendulum not), reset; or None."""
    import gymnasium as gym

    if task not in GYM_IDS or gym.spec(GYM_IDS[task]).vector_entry_point is None:
        return None
    env = gym.make_vec(GYM_IDS[task], num_envs=num_envs, vectorization_mode="vector_entry_point")
    env.reset(seed=0)
    return env


def _paired_rates(
    ours: Callable[[], None],
    peer: Callable[[], None],
    per_call: int,
    seconds: float,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Calls/s x ``per_call`` of ``ours`` and ``peer``, measured in alternating blocks of about
    20 ms each over about ``seconds`` each, so that load from other work on a shared machine hits
    both alike: ``{"ours", "peer"}`` by the wall clock, ``{"ours_cpu", "peer_cpu"}`` by the
    process's CPU time (what a quiet machine would give, for one-threaded work under load).
    ``sync`` ends each block of ``ours`` (a GPU's queued work is ours, not the peer's)."""
    for f in (ours, peer):
        for _ in range(3):
            f()
    block = 1
    t0 = time.perf_counter()
    ours()
    while time.perf_counter() - t0 < 0.02 and block < 4096:
        block, t0 = block * 2, time.perf_counter()
        for _ in range(block):
            ours()
    wall, cpu, calls = [0.0, 0.0], [0.0, 0.0], [0, 0]
    while min(wall) < seconds:
        for k, f in enumerate((ours, peer)):
            t, c = time.perf_counter(), time.process_time()
            for _ in range(block):
                f()
            if k == 0:
                sync()
            wall[k] += time.perf_counter() - t
            cpu[k] += time.process_time() - c
            calls[k] += block
    rate = [calls[k] * per_call / max(wall[k], 1e-9) for k in (0, 1)]
    cpu_rate = [calls[k] * per_call / max(cpu[k], 1e-9) for k in (0, 1)]
    return {"ours": rate[0], "peer": rate[1], "ours_cpu": cpu_rate[0], "peer_cpu": cpu_rate[1]}


def bench_env(
    task: str = "pendulum",
    num_envs: list[int] | None = None,
    device: str = "cpu",
    seconds: float = 2.0,
    gym_envs: int = 64,
    compile_mode: str | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Env steps/s of the batched torch env over ``num_envs``, next to the fastest gymnasium peer.

    The peer: gymnasium's own vector env of the task at the same ``num_envs`` where it has one
    (CartPole), measured in alternating blocks with ours (``_paired_rates``); else (and also,
    as the historical reference) SyncVectorEnv(``gym_envs``). ``compile_mode`` (e.g.
    "reduce-overhead", which adds CUDA graphs on a GPU) also measures the torch.compile'd step
    beside the eager one. ``threads`` sets torch's CPU threads first (gymnasium's numpy: one).
    """
    if threads:
        torch.set_num_threads(threads)
    num_envs = num_envs or [1, 64, 4096, 65536]
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    gym_rate = gym_sync_rate(task, gym_envs, seconds) if gym_envs and task in GYM_IDS else None
    rows, vec_rows = [], []
    variants = ["eager"] + (["compiled"] if compile_mode else [])
    for n in num_envs:
        vec = gym_vector_env(task, n)
        vec_rate = None
        for variant in variants:
            env = make_env(task, n, dev, seed=0)
            if variant == "compiled":
                env.compile(mode=compile_mode)
            env.reset()
            acts = _random_actions(env, 16, dev)
            i = [0]

            def step() -> None:
                env.step(acts[i[0] % 16])
                i[0] += 1
                if i[0] % 64 == 0:
                    sync()

            if vec is not None:
                pair = _paired_rates(step, _gym_stepper(vec, n), n, seconds, sync)
                rate, peer = pair["ours"], pair["peer"]
                vec_rate = peer if vec_rate is None else vec_rate  # the eager pair's
            else:
                rate = _rate(step, n, seconds)
            sync()
            rows.append(
                {
                    "num_envs": n,
                    "variant": variant,
                    "steps_per_s": rate,
                    "vs_gym": rate / gym_rate if gym_rate else None,
                    "vector_steps_per_s": peer if vec is not None else None,
                    "vs_vector": rate / peer if vec is not None else None,
                    "vs_vector_cpu_time": pair["ours_cpu"] / pair["peer_cpu"] if vec is not None else None,
                }
            )
        if vec is not None:
            vec.close()
            vec_rows.append((n, vec_rate))
    lines = [
        f"{task} env steps/s on {dev} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads)",
        f"{'backend':<28}{'num_envs':>10}{'steps/s':>16}{'x Sync':>9}{'x vector':>10}{'(CPU time)':>11}",
    ]

    def ratio(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}" if v < 10 else f"{v:.0f}"

    if gym_rate:
        lines.append(f"{'gymnasium SyncVectorEnv':<28}{gym_envs:>10}{gym_rate:>16,.0f}{1.0:>9.1f}{'-':>10}")
    for n, r in vec_rows:
        lines.append(
            f"{'gymnasium vector env':<28}{n:>10}{r:>16,.0f}{ratio(r / gym_rate if gym_rate else None):>9}"
            f"{'(1.00)':>10}"
        )
    for r in rows:
        lines.append(
            f"{'podracer torch ' + r['variant']:<28}{r['num_envs']:>10}{r['steps_per_s']:>16,.0f}"
            f"{ratio(r['vs_gym']):>9}{ratio(r['vs_vector']):>10}{ratio(r['vs_vector_cpu_time']):>11}"
        )
    best = max(rows, key=lambda r: (r["num_envs"], r["steps_per_s"]))
    peer = "gymnasium vector env" if best["vs_vector"] is not None else "gymnasium SyncVectorEnv"
    result = {
        "bench": "env",
        "task": task,
        "device": str(dev),
        "threads": torch.get_num_threads(),
        "gym_sync_envs": gym_envs,
        "gym_steps_per_s": gym_rate,
        "rows": rows,
        "max_envs": best["num_envs"],
        "max_envs_steps_per_s": best["steps_per_s"],
        "ratio_vs_gym": best["vs_gym"],
        "peer": peer,
        "ratio_vs_peer": best["vs_vector"] if best["vs_vector"] is not None else best["vs_gym"],
        "ratio_vs_peer_cpu_time": best["vs_vector_cpu_time"],
    }
    return {"table": "\n".join(lines), "result": result}


def _train_rate(pod: Any, seconds: float) -> tuple[float, float]:
    """(env steps/s, seconds per update) of ``pod.train_iteration`` after one warm-up update."""
    pod.train_iteration()
    s0, t0, n = pod.env_steps, time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds or n < 2:
        pod.train_iteration()
        n += 1
    dt = time.perf_counter() - t0
    return (pod.env_steps - s0) / dt, dt / n


def bench_train(
    config: str | None = None,
    overrides: list[str] | None = None,
    seconds: float = 10.0,
    peer_seconds: float | None = None,
) -> dict[str, Any]:
    """End-to-end PPO env steps/s (rollout + learning) of a pod, next to the same learner fed by
    gymnasium's SyncVectorEnv(64) on the host (the host-round-trip design the pod avoids)."""
    from podracer_hpc.cluster.device import resolve_device, set_cpu_threads
    from podracer_hpc.pod import Pod

    cfg = load_config(config or _default_job(), list(overrides or []))
    dev = resolve_device(cfg.device)
    if dev.type == "cpu":
        set_cpu_threads(cfg.threads)
    pod = Pod(cfg, device=dev)
    rate, per_update = _train_rate(pod, seconds)
    rows = [("podracer pod (batched torch env)", cfg.env.num_envs, rate, per_update)]
    peer_rate = None
    if cfg.env.name in GYM_IDS:
        from podracer_hpc.envs.gym_adapter import GymVecEnv

        peer_cfg = load_config(
            config or _default_job(),
            list(overrides or [])
            + ["env.num_envs=64", f"agent.num_minibatches={max(1, cfg.agent.num_minibatches // 8)}"],
        )
        peer = Pod(peer_cfg, device=dev)
        peer.env = GymVecEnv(GYM_IDS[cfg.env.name], 64, dev, seed=cfg.seed)
        peer.obs = peer.env.reset()
        peer_rate, peer_update = _train_rate(peer, peer_seconds or max(2.0, seconds / 3))
        rows.append(("same PPO, gymnasium SyncVectorEnv", 64, peer_rate, peer_update))
    lines = [
        f"PPO training throughput, {cfg.env.name}, {dev}, {torch.get_num_threads()} threads "
        f"(rollout {cfg.agent.rollout_steps} x envs, {cfg.agent.update_epochs} epochs, "
        f"{cfg.agent.num_minibatches} minibatches, hidden {cfg.agent.hidden_sizes})",
        f"{'system':<36}{'num_envs':>10}{'env steps/s':>14}{'s/update':>10}",
    ]
    for name, n, r, u in rows:
        lines.append(f"{name:<36}{n:>10}{r:>14,.0f}{u:>10.3f}")
    result = {
        "bench": "train",
        "task": cfg.env.name,
        "device": str(dev),
        "num_envs": cfg.env.num_envs,
        "steps_per_s": rate,
        "peer": "gymnasium SyncVectorEnv(64) + same PPO",
        "peer_steps_per_s": peer_rate,
        "ratio_vs_peer": rate / peer_rate if peer_rate else None,
    }
    return {"table": "\n".join(lines), "result": result}


def _default_job() -> str | None:
    from podracer_hpc.files.shipped import find

    p = find("jobs/pendulum.yaml")
    return str(p) if p is not None else None
