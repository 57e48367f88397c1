"""Walk-forward evaluation on real daily prices: train on the past, trade the next year, repeat.

    python bench/trading_walkforward.py                               # test years 2015..2022, 10 training years each
    python bench/trading_walkforward.py --years 2021 2022 --steps 200000   # a smaller run
    python bench/trading_walkforward.py --short                       # a smoke run (too short to learn)

Data: ``jobs/trading_real.yaml``'s, the adjusted closes of 20 S&P 500 stocks that skfolio ships in
its wheel (``pip install 'podracer-hpc[real-data]'``), prepared once (``podracer data prepare``)
and shared by every run through the market cache.

For each test year Y (consecutive windows):

1. ``podracer train jobs/trading_real.yaml`` on the ``--train-years`` years before Y
   (``env.trading.start`` .. ``env.trading.end`` = Y-1-12-31), ``--steps`` env steps, one pod;
2. ``podracer backtest`` of its **final** checkpoint on Y (``--start Y-01-01 --end Y-12-31``):
   the agent, equal-weight buy and hold and minimum variance (weights from the 252 days before Y).

No test year is seen in training or selection: the job's settings were fixed before any run (they
are the synthetic edge benchmark's), the checkpoint is the last one (no choice among checkpoints),
and each window's training ends the day before its test year. The indicators at the first test day
use only bars up to it (they are causal; the cache is the whole history, computed once).

Reported: per window the Sharpe ratios and cumulative returns of the three strategies; over the
windows the mean Sharpe difference agent - equal weight and agent - minimum variance with a 95% t
band (mean +- t sd / sqrt(K)). Prints progress to stderr, a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "jobs" / "trading_real.yaml"
# two-sided 95% quantiles of Student's t by degrees of freedom 1..30 (1.96 beyond)
_T975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def band(xs: list[float]) -> tuple[float, float, float]:
    """(mean, low, high) of a 95% t band; the band is (nan, nan) with fewer than 2 values."""
    k = len(xs)
    m = sum(xs) / k
    if k < 2:
        return m, math.nan, math.nan
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (k - 1))
    h = (_T975[k - 2] if k - 1 <= len(_T975) else 1.96) * sd / math.sqrt(k)
    return m, m - h, m + h


def podracer(*args: str, timeout: float = 7200) -> dict:
    """Run ``podracer ARGS`` (this interpreter), return its last JSON line; stop with its error otherwise."""
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if r.returncode != 0:
        raise SystemExit(f"podracer {' '.join(args)} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--years", type=int, nargs="+", default=list(range(2015, 2023)), help="test years (consecutive)")
    ap.add_argument("--train-years", type=int, default=10, help="years of training before each test year")
    ap.add_argument("--steps", type=int, default=1_000_000, help="env steps of each training run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/trading_walkforward", help="run directories go here")
    ap.add_argument("--short", action="store_true", help="smoke run: 2 windows, 20k steps")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides of the job")
    args = ap.parse_args(argv)
    if args.short:
        args.years, args.steps = args.years[-2:], 20_000
    if importlib.util.find_spec("skfolio") is None:
        print(
            "trading_walkforward: the real data comes with skfolio: pip install 'podracer-hpc[real-data]'",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out)
    t_start = time.perf_counter()
    say("podracer data prepare jobs/trading_real.yaml")
    prep = podracer("data", "prepare", str(JOB))
    windows = []
    for y in args.years:
        run = out / f"test{y}"
        start, end = f"{y - args.train_years}-01-01", f"{y - 1}-12-31"
        say(f"window {y}: train {start} .. {end}, {args.steps:,} env steps")
        t0 = time.perf_counter()
        sets = [
            f"env.trading.start={start}",
            f"env.trading.end={end}",
            f"total_env_steps={args.steps}",
            f"seed={args.seed}",
            f"eval.interval_env_steps={max(args.steps // 4, 1)}",
            *args.set,
        ]
        summary = podracer(
            "train", str(JOB), "--run-dir", str(run), "--quiet", *[a for s in sets for a in ("--set", s)]
        )
        train_s = time.perf_counter() - t0
        say(f"window {y}: backtest {y}-01-01 .. {y}-12-31")
        bt = podracer(
            "backtest",
            str(run / "checkpoints" / "rank0.safetensors"),
            "--start",
            f"{y}-01-01",
            "--end",
            f"{y}-12-31",
            "--plot",
            str(run / "backtest.png"),
        )
        w = {
            "year": y,
            "train": [start, end],
            "train_s": round(train_s, 1),
            "env_steps": summary.get("env_steps"),
            "train_eval": summary.get("final_return"),
            "bars": bt["bars"],
        }
        for k in ("agent", "equal_weight", "min_variance"):
            w[k] = {m: bt[k][m] for m in ("sharpe_ratio", "cumulative_return", "max_drawdown")}
        windows.append(w)

    def sharpe(w: dict, k: str) -> float:
        v = w[k]["sharpe_ratio"]
        if v is None:  # no variance: an account that stayed in cash has the Sharpe ratio of cash, 0
            return 0.0 if w[k]["cumulative_return"] == 0 else math.nan
        return float(v)

    d_ew = [sharpe(w, "agent") - sharpe(w, "equal_weight") for w in windows]
    d_mv = [sharpe(w, "agent") - sharpe(w, "min_variance") for w in windows]
    ew, mv = band(d_ew), band(d_mv)
    print(
        f"walk-forward on {prep['tickers']} real stocks ({prep['first']} .. {prep['last']}), "
        f"{args.train_years} training years per window, {args.steps:,} env steps each, final checkpoints"
    )
    head = f"{'test year':<10}{'bars':>6}{'agent SR':>10}{'EW SR':>8}{'MV SR':>8}"
    head += f"{'agent cum':>11}{'EW cum':>9}{'MV cum':>9}"
    print(head + f"{'agent-EW':>10}{'agent-MV':>10}")

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:+.1f}%"

    for w, a, b in zip(windows, d_ew, d_mv):
        print(
            f"{w['year']:<10}{w['bars']:>6}{sharpe(w, 'agent'):>10.2f}{sharpe(w, 'equal_weight'):>8.2f}"
            f"{sharpe(w, 'min_variance'):>8.2f}{pct(w['agent']['cumulative_return']):>11}"
            f"{pct(w['equal_weight']['cumulative_return']):>9}{pct(w['min_variance']['cumulative_return']):>9}"
            f"{a:>+10.2f}{b:>+10.2f}"
        )
    for name, (m, lo, hi) in (("agent - equal weight", ew), ("agent - minimum variance", mv)):
        verdict = "above 0: an edge" if lo > 0 else "below 0: worse" if hi < 0 else "covers 0: no edge shown"
        print(f"Sharpe {name}: mean {m:+.2f}, 95% band [{lo:+.2f}, {hi:+.2f}] over {len(windows)} windows ({verdict})")
    print(
        json.dumps(
            {
                "windows": windows,
                "sharpe_diff_equal_weight": {"mean": ew[0], "low": ew[1], "high": ew[2]},
                "sharpe_diff_min_variance": {"mean": mv[0], "low": mv[1], "high": mv[2]},
                "steps": args.steps,
                "train_years": args.train_years,
                "seed": args.seed,
                "wall_s": round(time.perf_counter() - t_start, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
