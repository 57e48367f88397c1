"""Does a trained tournament's best policy have an edge on markets it never saw, and only where there is one?

    python bench/trading_edge.py             # a 2-pod tournament (mpiexec -n 2), 32 held-out seeds of each kind:
                                             # 4.5 min on 2 shared CPU cores, 5.6 on one (bench/RESULTS.md)
    python bench/trading_edge.py --short     # a smoke run: 300k steps, 4 seeds (under a minute; too short to learn)
    python bench/trading_edge.py --ranks 1   # one pod, no mpiexec

1. Training data: ``synthetic_history`` of 40 independent synthetic markets (seeds 1000..1039, 6
   years each) with momentum in every stock (``predictable_fraction`` 1: an AR(1) idiosyncratic
   return, +0.25), joined end to end (``<out>/data/train.csv``). One market alone is not enough:
   a policy trained on a single path learns that path (which stock went up, when) and shows no edge
   on another seed; with 40 markets it has to learn the structure.
2. ``mpiexec -n R podracer train jobs/trading_edge.yaml`` (an ElegantRL tournament) on it.
3. The leaderboard's best entry (``podracer backtest`` accepts it) is backtested on held-out markets
   of other seeds (1..K, written as CSV, passed as ``--data``): K with the same structure and K
   without (``structure="none"``; same seed, so the same regimes and shocks without the AR(1)
   part). Per market: the policy's Sharpe ratio, equal-weight buy and hold's, minimum variance's
   and the difference policy - equal weight.
4. Verdict, over the K seeds: the mean difference with a 95% t band (mean +- t * sd / sqrt(K)).
   Structured: an edge if the band lies above 0. Unstructured: no edge if the band reaches 0
   or lies below it (a momentum trader on a market without momentum pays costs for nothing);
   an edge there would mean look-ahead or overfitting.

Beside the policy, a reference rule with no learning in it (``--no-rule`` to skip): a least-squares
fit of the next day's return on the 8 scale-free indicators of the observation, over the training
history only, traded as sign(prediction) per stock. It shows what the observation allows, and
checks the benchmark itself (it must find an edge on the structured markets and none on the others).

Prints progress to stderr, a table, the verdicts, and last one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from analysis.aggregate import t95  # noqa: E402
from podracer_hpc.trading.synthetic import synthetic_history, synthetic_market  # noqa: E402

JOB = REPO / "jobs" / "trading_edge.yaml"
TRAIN_SEEDS = range(1000, 1040)


def say(msg: str) -> None:
    print(f"[trading_edge {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def band(x: list[float]) -> dict[str, float]:
    """Mean, standard error and the 95% t interval of the mean."""
    a = np.asarray(x, dtype=np.float64)
    n = len(a)
    se = float(a.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    t = t95(n - 1) if n > 1 else 1.96
    m = float(a.mean())
    return {"n": n, "mean": m, "se": se, "lo": m - t * se, "hi": m + t * se}


def job_settings(overrides: list[str]) -> dict:
    from podracer_hpc.config import load_config, to_dict

    return to_dict(load_config(JOB, overrides))


def write_data(out: Path, stocks: int, days: int, seeds: list[int], train_markets: int) -> tuple[Path, dict]:
    d = out / "data"
    d.mkdir(parents=True, exist_ok=True)
    train = d / "train.csv"
    kw = {"predictable_fraction": 1.0}
    if not train.exists():
        say(f"writing the training history: {train_markets} markets x {days} days x {stocks} stocks -> {train}")
        synthetic_history(list(TRAIN_SEEDS)[:train_markets], stocks, days, "momentum", **kw).to_csv(train)
    tests = {}
    for structure in ("momentum", "none"):
        for s in seeds:
            p = d / f"{structure}_seed{s}.csv"
            if not p.exists():
                synthetic_market(stocks, days, s, structure, **kw).to_csv(p)
            tests[(structure, s)] = p
    return train, tests


def train(out: Path, train_csv: Path, ranks: int, overrides: list[str], timeout: float) -> dict:
    run_dir = out / "run"
    cmd = [
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        str(JOB),
        "--run-dir",
        str(run_dir),
        "--set",
        f"env.trading.data={train_csv}",
        *(x for o in overrides for x in ("--set", o)),
    ]
    if ranks > 1:
        from podracer_hpc.launch import find_mpiexec

        cmd = [find_mpiexec(), "-n", str(ranks), *cmd]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PODRACER_COMM", None)
    say("training: " + " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=None, text=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise SystemExit(f"trading_edge: training did not finish in {timeout:.0f} s")
    if proc.returncode != 0:
        raise SystemExit(f"trading_edge: training failed (exit code {proc.returncode})")
    summary = json.loads(stdout.strip().splitlines()[-1])
    summary["train_wall_s"] = time.perf_counter() - t0
    return summary


def best_entry(run_dir: Path) -> tuple[Path, dict]:
    from podracer_hpc.files.rundir import RunDir
    from podracer_hpc.pool.leaderboard import Leaderboard

    entries = Leaderboard(RunDir(run_dir).leaderboard()).list()
    if not entries:
        raise SystemExit(f"trading_edge: {run_dir}/leaderboard holds no entry")
    e = entries[0]
    return Leaderboard(RunDir(run_dir).leaderboard()).tensors_path(e.id), {
        "id": e.id,
        "score": e.score,
        "env_steps": e.env_steps,
        "pod": e.pod,
        "round": e.round,
    }


def run_backtest(policy: Path, csv: Path) -> dict:
    """``podracer backtest POLICY --data CSV --plot ''`` in this process; its JSON line."""
    from podracer_hpc.tools.backtest import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([str(policy), "--data", str(csv), "--plot", ""])
    if code != 0:
        raise SystemExit(f"trading_edge: podracer backtest {policy} --data {csv} failed ({code})")
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def fit_rule(train_csv: Path, stocks: int, days: int) -> np.ndarray:
    """Least squares of the next day's log return on the observation's 8 scale-free indicators
    (the market features without log close), pooled over stocks, on the training history only."""
    from podracer_hpc.trading.data import load_market
    from podracer_hpc.trading.env import market_features

    md = load_market(train_csv)
    obs, _ = market_features(md, 0)
    S = stocks
    x = obs[:, S : 9 * S].reshape(-1, 8, S).transpose(1, 2).numpy()  # [T, S, 8]
    c = md.close.numpy()
    y = np.log(c[1:] / c[:-1])  # y[t] = return from t to t+1
    keep = np.ones(md.num_days - 1, dtype=bool)
    keep[:60] = False  # indicator warm-up
    for j in range(days, md.num_days, days):  # the joins of the training history: skip them and a warm-up
        keep[j - 1 : j + 60] = False
    X = x[:-1][keep].reshape(-1, 8)
    Y = y[keep].reshape(-1)
    A = np.column_stack([X, np.ones(len(X))])
    return np.linalg.lstsq(A, Y, rcond=None)[0]


def rule_backtest(coef: np.ndarray, csv: Path, cfg: dict) -> dict:
    """The reference rule, sign(predicted return) per stock, backtested with the job's trading settings."""
    from podracer_hpc.tools.backtest import backtest
    from podracer_hpc.trading.data import load_market

    md = load_market(csv)
    S = md.num_stocks
    w = torch.from_numpy(coef[:8])

    def policy(o: torch.Tensor) -> torch.Tensor:
        f = o[:, 1 + 2 * S : 1 + 10 * S].double().reshape(o.shape[0], 8, S).transpose(1, 2)  # [N, S, 8] indicators
        return torch.sign(f @ w + coef[8]).float()

    tr = cfg["env"]["trading"]
    r = backtest(
        policy,
        md,
        cost=tr["cost"],
        initial_cash=tr["initial_cash"],
        max_shares=tr["max_shares"],
        turbulence_threshold=tr["turbulence_threshold"],
        turbulence_window=tr["turbulence_window"],
        warmup_bars=tr["warmup_bars"],
    )
    return {k: r[k] for k in ("agent", "equal_weight", "min_variance", "start", "end", "bars")}


def verdicts(diffs: dict[str, list[float]]) -> dict:
    s, u = band(diffs["momentum"]), band(diffs["none"])
    paired = band([a - b for a, b in zip(diffs["momentum"], diffs["none"])])
    return {
        "structured": {**s, "edge": bool(s["lo"] > 0)},
        "unstructured": {**u, "no_edge": bool(u["lo"] <= 0), "below_zero": bool(u["hi"] < 0)},
        "paired": paired,
        "passed": bool(s["lo"] > 0 and u["lo"] <= 0),
    }


def describe(name: str, v: dict) -> list[str]:
    s, u = v["structured"], v["unstructured"]
    fmt = lambda b: f"{b['mean']:+.3f}, 95% band [{b['lo']:+.3f}, {b['hi']:+.3f}] over {b['n']} seeds"  # noqa: E731
    lines = [
        f"{name}, Sharpe(policy) - Sharpe(equal weight):",
        f"  structured (momentum):  {fmt(s)}  -> "
        + ("EDGE: beats equal weight beyond noise" if s["edge"] else "no edge beyond noise"),
        f"  unstructured (none):    {fmt(u)}  -> "
        + (
            ("no edge (below equal weight: costs of trading on noise)" if u["below_zero"] else "no edge (within noise)")
            if u["no_edge"]
            else "EDGE on a market without structure: look-ahead or overfitting?"
        ),
        f"  structure's share (paired by seed): {fmt(v['paired'])}",
        f"  verdict: {'PASS' if v['passed'] else 'FAIL'} (edge where there is structure, none where there is not)",
    ]
    return lines


RLLIB_JOB = REPO / "jobs" / "rllib" / "trading_edge.yaml"
RLLIB_PY = REPO / ".venv-rllib" / "bin" / "python"


def train_rllib(out: Path, train_csv: Path, cfg: dict, timeout: float) -> tuple[Path, dict]:
    """RLlib's PPO (baselines/rllib, in .venv-rllib) on the same env settings, episode length and
    env-step budget as one pod; returns (its exported policy, its summary)."""
    if not RLLIB_PY.exists():
        raise SystemExit(f"trading_edge: --rllib needs {RLLIB_PY} (baselines/rllib/README.md says how to make it)")
    trading = dict(cfg["env"]["trading"], data=str(train_csv))
    run_dir = out / "rllib"
    cmd = [
        str(RLLIB_PY),
        "-m",
        "baselines.rllib.train",
        str(RLLIB_JOB),
        "--run-dir",
        str(run_dir),
        "--set",
        f"trading={json.dumps(trading)}",
        "--set",
        f"max_episode_steps={cfg['env']['max_episode_steps']}",
        "--set",
        f"total_env_steps={cfg['total_env_steps']}",
        "--set",
        f"seed={cfg['seed']}",
    ]
    say("training RLlib: " + " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"trading_edge: RLlib training failed (exit code {proc.returncode})")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    summary["train_wall_s"] = time.perf_counter() - t0
    return run_dir / "checkpoints" / "policy.pt", summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--short", action="store_true", help="smoke run: 300k env steps per pod, 4 seeds, 8 training markets"
    )
    ap.add_argument("--ranks", type=int, default=2, help="pods (MPI ranks); 1 runs without mpiexec")
    ap.add_argument("--seeds", type=int, default=None, help="held-out seeds of each kind (default 32, short 4)")
    ap.add_argument("--steps", type=int, default=None, help="env steps per pod (default: the job's)")
    ap.add_argument("--markets", type=int, default=None, help="markets in the training history (default 40, short 8)")
    ap.add_argument("--out", default=str(REPO / "runs" / "trading_edge"), help="data, run directory, results")
    ap.add_argument("--fresh", action="store_true", help="delete an earlier run in --out first (else it resumes)")
    ap.add_argument("--no-rule", action="store_true", help="skip the reference rule")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more job overrides")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds the training may take")
    ap.add_argument(
        "--rllib",
        action="store_true",
        help="also train RLlib's PPO (.venv-rllib) on the same market for one pod's env steps, "
        "and backtest it beside the tournament's policy",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    out = Path(args.out)
    if args.fresh and out.exists():
        import shutil

        shutil.rmtree(out)
    k = args.seeds or (4 if args.short else 32)
    markets = args.markets or (8 if args.short else 40)
    overrides = ["threads=1", "log.progress_interval_s=20"]
    if args.short:
        overrides += [
            "total_env_steps=300000",
            "eval.interval_env_steps=100000",
            "tournament.interval_env_steps=100000",
        ]
    if args.steps:
        overrides.append(f"total_env_steps={args.steps}")
    overrides += args.set
    cfg = job_settings(overrides)
    stocks, days = cfg["env"]["trading"]["synthetic_stocks"], cfg["env"]["trading"]["synthetic_days"]
    seeds = list(range(1, k + 1))

    train_csv, tests = write_data(out, stocks, days, seeds, markets)
    summary = train(out, train_csv, args.ranks, overrides, args.timeout)
    say(f"trained: {summary['env_steps']:,} env steps over {summary['pods']} pod(s) in {summary['train_wall_s']:.0f} s")
    policy, entry = best_entry(out / "run")
    say(
        f"best policy: leaderboard entry {entry['id']} (score {entry['score']:.2f}, pod {entry['pod']}, "
        f"round {entry['round']}, {entry['env_steps']:,} env steps)"
    )

    rl_policy, rl_summary = train_rllib(out, train_csv, cfg, args.timeout) if args.rllib else (None, None)
    if rl_summary:
        say(f"RLlib trained: {rl_summary['env_steps']:,} env steps in {rl_summary['train_wall_s']:.0f} s")
    coef = None if args.no_rule else fit_rule(train_csv, stocks, days)
    rows = []
    for (structure, s), csv in tests.items():
        r = run_backtest(policy, csv)
        row = {
            "structure": structure,
            "seed": s,
            "bars": r["bars"],
            "policy": r["agent"]["sharpe_ratio"],
            "equal_weight": r["equal_weight"]["sharpe_ratio"],
            "min_variance": r["min_variance"]["sharpe_ratio"],
            "policy_return": r["agent"]["cumulative_return"],
            "equal_weight_return": r["equal_weight"]["cumulative_return"],
        }
        row["diff"] = row["policy"] - row["equal_weight"]
        if rl_policy is not None:
            row["rllib"] = run_backtest(rl_policy, csv)["agent"]["sharpe_ratio"]
            row["rllib_diff"] = row["rllib"] - row["equal_weight"]
        if coef is not None:
            rr = rule_backtest(coef, csv, cfg)
            row["rule"] = rr["agent"]["sharpe_ratio"]
            row["rule_diff"] = row["rule"] - row["equal_weight"]
        rows.append(row)
        say(
            f"backtest {structure:<8} seed {s:>2}: policy {row['policy']:+.3f}, equal weight {row['equal_weight']:+.3f}"
            + ("" if rl_policy is None else f", RLlib {row['rllib']:+.3f}")
            + ("" if coef is None else f", rule {row['rule']:+.3f}")
        )

    pol = verdicts({st: [r["diff"] for r in rows if r["structure"] == st] for st in ("momentum", "none")})
    rllib = (
        None
        if rl_policy is None
        else verdicts({st: [r["rllib_diff"] for r in rows if r["structure"] == st] for st in ("momentum", "none")})
    )
    rule = (
        None
        if coef is None
        else verdicts({st: [r["rule_diff"] for r in rows if r["structure"] == st] for st in ("momentum", "none")})
    )

    print(
        f"Held-out synthetic markets: {stocks} stocks x {days} days, Sharpe ratios of the backtest "
        f"(daily bars, risk-free 0, cost {cfg['env']['trading']['cost']:g}), best policy = {entry['id']}"
    )
    head = f"{'market':<10}{'seed':>5}{'policy':>9}{'eq.wt':>9}{'min.var':>9}{'diff':>9}"
    if rl_policy is not None:
        head += f"{'rllib':>9}{'rl.diff':>9}"
    if coef is not None:
        head += f"{'rule':>9}{'r.diff':>9}"
    print(head)
    for r in rows:
        line = (
            f"{r['structure']:<10}{r['seed']:>5}{r['policy']:>9.3f}{r['equal_weight']:>9.3f}"
            f"{r['min_variance']:>9.3f}{r['diff']:>+9.3f}"
        )
        if rl_policy is not None:
            line += f"{r['rllib']:>9.3f}{r['rllib_diff']:>+9.3f}"
        if coef is not None:
            line += f"{r['rule']:>9.3f}{r['rule_diff']:>+9.3f}"
        print(line)
    print("\n".join(describe("tournament's best policy", pol)))
    if rllib is not None:
        print("\n".join(describe(f"RLlib PPO ({rl_summary['env_steps']:,} env steps, one learner)", rllib)))
    if rule is not None:
        print("\n".join(describe("reference rule (least squares on the training history, no RL)", rule)))
    wall = time.perf_counter() - t_start
    print(
        f"wall time {wall:.0f} s (training {summary['train_wall_s']:.0f} s); load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores"
    )
    print(
        json.dumps(
            {
                "bench": "trading_edge",
                "short": bool(args.short),
                "ranks": args.ranks,
                "stocks": stocks,
                "days": days,
                "train_markets": markets,
                "seeds": seeds,
                "train": summary,
                "best_entry": entry,
                "rows": rows,
                "policy": pol,
                "rule": rule,
                "rllib": rllib,
                "rllib_train": rl_summary,
                "passed": pol["passed"],
                "wall_s": wall,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
