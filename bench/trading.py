"""stock_trading env steps/s: the batched torch env beside a FinRL-style per-account env.

    python bench/trading.py                         # 30 stocks, 256 / 4,096 / 16,384 envs, 1 and all threads
    python bench/trading.py --num-envs 4096 --threads 1 --seconds 5
    python bench/trading.py --device cuda --num-envs 4096 65536 --compile reduce-overhead   # on a GPU machine

Random actions in [-1, 1] (pre-drawn), the default synthetic market (1,512 days), episodes of
252 steps with random starts, so restarts happen on most steps (the real training case). The
peer is the classic design the batched env replaces: one account per Python object, a loop
over stocks for the sells and the buys (numpy), stepped one account after the other. Prints a
table, then one JSON line. The target is >= 1,000,000 env steps/s with 4,096 envs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from podracer_hpc.trading.env import StockTradingEnv, get_market  # noqa: E402

TARGET = 1_000_000


def rate(step, per_call: int, seconds: float, sync=lambda: None, warmup: int = 3) -> tuple[float, float]:
    """(steps per wall second, steps per CPU second of this process) after a warm-up."""
    for _ in range(warmup):
        step()
    sync()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        step()
        n += 1
        if n % 16 == 0:
            sync()
            dt = time.perf_counter() - t0
            if dt >= seconds:
                return n * per_call / dt, n * per_call / max(1e-9, time.process_time() - c0)


class LoopAccount:
    """FinRL-style: one account, numpy arrays, a Python loop over stocks (sells first, then buys)."""

    def __init__(self, close: np.ndarray, feats: np.ndarray, start: int, cash=1e6, cost=1e-3, hmax=100):
        self.close, self.feats, self.day, self.cash = close, feats, start, cash
        self.hold = np.zeros(close.shape[1])
        self.cost, self.hmax, self.start = cost, hmax, start

    def step(self, action: np.ndarray):
        p = self.close[self.day]
        v0 = self.cash + self.hold @ p
        orders = (np.clip(action, -1, 1) * self.hmax).astype(int)
        for s in np.argsort(orders):
            if orders[s] < 0:
                n = min(-orders[s], self.hold[s])
                self.cash += n * p[s] * (1 - self.cost)
                self.hold[s] -= n
        for s in np.argsort(orders)[::-1]:
            if orders[s] > 0:
                n = min(orders[s], self.cash // (p[s] * (1 + self.cost)))
                self.cash -= n * p[s] * (1 + self.cost)
                self.hold[s] += n
        self.day += 1
        p1 = self.close[self.day]
        reward = (self.cash + self.hold @ p1 - v0) * 1e-4
        obs = np.concatenate([[self.cash], p1, self.hold, self.feats[self.day]])
        done = self.day >= len(self.close) - 1 or self.day - self.start >= 252
        if done:
            self.__init__(self.close, self.feats, self.start, cost=self.cost, hmax=self.hmax)
        return obs, reward, done


def peer_rate(seconds: float, accounts: int = 16) -> float:
    m = get_market()
    close, feats = m.close.cpu().numpy(), m.market_obs.cpu().numpy()
    rng = np.random.default_rng(0)
    accs = [LoopAccount(close, feats, int(s)) for s in rng.integers(60, len(close) - 300, accounts)]
    acts = rng.uniform(-1, 1, (16, accounts, close.shape[1]))
    i = [0]

    def step():
        a = acts[i[0] % 16]
        for k, acc in enumerate(accs):
            acc.step(a[k])
        i[0] += 1

    return rate(step, accounts, seconds)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-envs", type=int, nargs="+", default=[256, 4096, 16384])
    ap.add_argument("--stocks", type=int, default=30)
    ap.add_argument(
        "--threads", type=int, nargs="+", default=None, help="torch CPU threads to try (default: 1 and all cores)"
    )
    ap.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--compile",
        default=None,
        metavar="MODE",
        help="also measure the torch.compile'd step (default | reduce-overhead: CUDA graphs on a GPU)",
    )
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    threads = args.threads or sorted({1, os.cpu_count() or 1})
    if dev.type == "cuda":
        threads = threads[:1]
    rows = []
    for th in threads:
        torch.set_num_threads(th)
        for n in args.num_envs:
            for variant in ["eager"] + (["compiled"] if args.compile else []):
                env = StockTradingEnv(n, dev, seed=0, synthetic_stocks=args.stocks)
                if variant == "compiled":
                    env.compile(mode=args.compile)
                env.reset()
                g = torch.Generator().manual_seed(0)
                acts = [(torch.rand(n, args.stocks, generator=g) * 2 - 1).to(dev) for _ in range(16)]
                i = [0]

                def step():
                    env.step(acts[i[0] % 16])
                    i[0] += 1

                # the compiled step records its graphs (CUDA graphs) in the first calls: warm up longer
                r, rc = rate(step, n, args.seconds, sync, warmup=3 if variant == "eager" else 20)
                rows.append({"num_envs": n, "threads": th, "variant": variant, "steps_per_s": r, "steps_per_cpu_s": rc})
    torch.set_num_threads(threads[0])
    peer = None if args.no_peer else peer_rate(args.seconds)
    lines = [
        f"stock_trading env steps/s, {args.stocks} stocks, on {dev} "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        f"{'backend':<36}{'threads':>8}{'num_envs':>10}{'steps/s':>14}{'steps/cpu-s':>14}{'x peer':>8}",
    ]
    if peer:
        lines.append(f"{'per-account numpy, loop over stocks':<36}{1:>8}{16:>10}{peer:>14,.0f}{'':>14}{1.0:>8.1f}")
    for r in rows:
        ratio = f"{r['steps_per_s'] / peer:.0f}" if peer else "-"
        lines.append(
            f"{'podracer torch (batched, ' + r['variant'] + ')':<36}{r['threads']:>8}{r['num_envs']:>10}"
            f"{r['steps_per_s']:>14,.0f}"
            f"{r['steps_per_cpu_s']:>14,.0f}{ratio:>8}"
        )
    at = [r for r in rows if r["num_envs"] == 4096]
    best4096 = max((r["steps_per_s"] for r in at), default=None)
    cpu1 = max((r["steps_per_cpu_s"] for r in at if r["threads"] == 1), default=None)
    lines.append(
        f"target: >= {TARGET:,} env steps/s with 4,096 envs: "
        + ("not measured" if best4096 is None else f"{best4096:,.0f} ({'met' if best4096 >= TARGET else 'NOT met'})")
        + ("" if cpu1 is None else f"; one core, per CPU second: {cpu1:,.0f}")
        + f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print("\n".join(lines))
    print(
        json.dumps(
            {
                "bench": "trading_env",
                "device": str(dev),
                "stocks": args.stocks,
                "rows": rows,
                "peer": "per-account numpy, loop over stocks",
                "peer_steps_per_s": peer,
                "steps_per_s_4096": best4096,
                "steps_per_cpu_s_4096_1thread": cpu1,
                "target": TARGET,
                "load_average": os.getloadavg()[0],
                "meets_target": None if best4096 is None else bool(best4096 >= TARGET),
                "ratio_vs_peer": (best4096 / peer) if (peer and best4096) else None,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
