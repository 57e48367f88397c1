"""The decisions of one collective round at 256-4,096 pods, per rank (every rank computes them).

    python bench/decide_scale.py                 # 256, 1,024, 4,096 pods, PBT and ElegantRL
    python bench/decide_scale.py --pods 256 1024

PBT draws each target's source by rejection, then from the list (hparams.draw_eligible: uniform
over the eligible sources either way); the peer in the same run is the same decide() with the
source drawn from the full list of eligible sources (``tries=0``: every one of the N/4 targets
checks every one of the N/4 sources, which is what it did before), so the ratio is this change
alone. Reports: 20 episodes each on common start states, fitness spread so that the top quantile
beats the bottom. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from podracer_hpc.config import TournamentConfig  # noqa: E402
from podracer_hpc.pool import hparams  # noqa: E402
from podracer_hpc.pool import rules as tournament
from podracer_hpc.pool.rules import PodReport, decide  # noqa: E402


def reports(n: int, episodes: int = 20, seed: int = 0) -> list[PodReport]:
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n):
        skill = -1000.0 + 800.0 * r / max(n - 1, 1)
        rets = tuple(float(x) for x in skill + 30.0 * rng.standard_normal(episodes))
        out.append(
            PodReport(r, float(np.mean(rets)), 100_000, {"learning_rate": 1e-3, "entropy_coef": 0.0}, returns=rets)
        )
    return out


def timed(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, nargs="+", default=[256, 1024, 4096])
    args = ap.parse_args()
    rows, out = [], {}
    for mode in ("pbt", "elegantrl"):
        cfg = TournamentConfig(mode=mode)
        for n in args.pods:
            reps = reports(n)
            new = timed(lambda: decide(reps, [], 3, 0, cfg), 3 if n <= 1024 else 1)
            old = float("nan")
            if mode == "pbt":
                full = functools.partial(hparams.draw_eligible, tries=0)
                orig = tournament.draw_eligible
                tournament.draw_eligible = full
                try:
                    old = timed(lambda: decide(reps, [], 3, 0, cfg), 1)
                finally:
                    tournament.draw_eligible = orig
            rows.append((mode, n, old, new))
            out[f"{mode}_{n}"] = {"full_list_s": None if old != old else round(old, 4), "drawn_s": round(new, 4)}
    print(f"{'rule':<10} {'pods':>6} {'full list (s)':>14} {'draw, then check (s)':>21} {'ratio':>7}")
    for mode, n, old, new in rows:
        ratio = f"{old / new:7.1f}" if old == old else "      -"
        oldt = f"{old:14.3f}" if old == old else f"{'-':>14}"
        print(f"{mode:<10} {n:>6} {oldt} {new:>21.4f} {ratio}")
    print(json.dumps({"bench": "decide_scale", "per_rank_and_round": out}))


if __name__ == "__main__":
    main()
