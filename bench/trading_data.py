"""The trading data path at the paper's scale: preparation, a pod's load, a backtest, old vs new.

    python bench/trading_data.py                  # the full run (about 10-15 minutes here, ~12 GB of disk in /tmp)
    python bench/trading_data.py --days 50        # a smaller minute-bar file (a smoke run)
    python bench/trading_data.py --no-csv         # Parquet only (skip the 3.5 GB CSV of the same bars)

What it measures, each in a fresh process (wall seconds and peak RSS):

1. **Preparation** (``podracer data prepare``) of a generated minute-bar file of NASDAQ-100 size:
   100 tickers x 390 bars x 1,100 days (42.9M bars; 0.05% of the bars missing at random), in
   Parquet and in CSV, with the paper job's ``turbulence_window`` 390. Target: <= 120 s.
2. **A pod's load** of that market from the cache (``get_market``, then ``StockTradingEnv`` with
   4,096 envs and a few steps), cold (first process after the preparation) and again. Target: <= 5 s.
3. **The 10-year daily backtest** of one checkpoint (100 tickers x 2,520 days, trained for a few
   updates here): ``podracer backtest`` end to end, from the cache and with a cold cache.
   Target: <= 10 s.
4. **Old vs new in the same run**, as ratios: the code before this change (the pure-Python CSV
   reader, whole-array indicators, a pseudo-inverse per bar; read from git) against the new path,
   on the daily file and on a 10-day minute file.
5. **CSV readers** on 3.9M bars: pyarrow (ours: read + validate), pandas' C reader and pandas with
   pyarrow's engine (read only; pandas is not a dependency: skipped if it is not installed).

Prints a table, then one JSON line. The machine is shared: the load average is printed beside.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
OLD_COMMIT = "5deb550^"  # the code before the prepared-market cache (for the old-vs-new rows)
TARGETS = {"prepare_s": 120.0, "load_s": 5.0, "backtest_s": 10.0}


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------
def minute_bars(tickers: int, days: int, bars_per_day: int = 390, seed: int = 0, missing: float = 5e-4):
    """A long-format minute-bar table (pyarrow) of a random market: correlated log-normal walks."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    T = days * bars_per_day
    day0 = np.busday_offset(np.datetime64("2016-01-04", "D"), np.arange(days), roll="forward")
    times = (
        day0.astype("datetime64[s]")[:, None]
        + np.timedelta64(14 * 3600 + 30 * 60, "s")
        + np.arange(bars_per_day)[None, :] * np.timedelta64(60, "s")
    ).reshape(-1)
    market = rng.standard_normal(T).astype(np.float32)[:, None]
    ret = 4e-4 * (0.6 * market + 0.8 * rng.standard_normal((T, tickers), dtype=np.float32))
    close = np.round(rng.uniform(20, 400, tickers) * np.exp(np.cumsum(ret, 0, dtype=np.float64)), 4)
    del ret, market
    opn = np.round(np.vstack([close[:1], close[:-1]]), 4)
    wig = np.abs(rng.standard_normal((T, tickers), dtype=np.float32)) * np.float32(2e-4)
    high = np.round(np.maximum(opn, close) * (1 + wig), 4)
    low = np.round(np.minimum(opn, close) * (1 - wig), 4)
    del wig
    vol = rng.integers(100, 10_000, (T, tickers)).astype(np.float64)
    keep = rng.random((T, tickers)) >= missing
    keep[0] = keep[-1] = True  # every ticker listed from the first to the last bar
    idx = np.flatnonzero(keep.reshape(-1))
    del keep
    names = [f"T{i:03d}" for i in range(tickers)]
    cols = {
        "timestamp": pa.array(times[idx // tickers], pa.timestamp("s")),
        "ticker": pa.DictionaryArray.from_arrays(pa.array((idx % tickers).astype(np.int32)), pa.array(names)),
    }
    for name, a in (("open", opn), ("high", high), ("low", low), ("close", close), ("volume", vol)):
        cols[name] = pa.array(a.reshape(-1)[idx])
    return pa.table(cols)


def daily_bars(tickers: int, days: int, seed: int = 1):
    """A long-format daily table: 10 years of business days."""
    import pyarrow as pa

    t = minute_bars(tickers, days, bars_per_day=1, seed=seed, missing=0.0)
    dates = (t.column("timestamp").cast(pa.int64()).to_numpy() // 86400 * 86400).astype("datetime64[s]")
    return t.set_column(0, "date", pa.array(dates.astype("datetime64[D]")))


def write(table, path: Path) -> float:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    else:
        pacsv.write_csv(table, path, pacsv.WriteOptions(quoting_style="none"))
    return time.perf_counter() - t0


# --------------------------------------------------------------------------------------
# Running things in fresh processes
# --------------------------------------------------------------------------------------
def _hwm_gb(pid: int) -> float:
    """The peak resident memory of a running process (VmHWM: its own, from its exec on; getrusage's
    ru_maxrss would also count what the parent held before the fork)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 0.0


def run(cmd: list[str], env: dict | None = None, timeout: float = 3600) -> dict:
    """Run a command; wall seconds, CPU seconds, peak RSS (GB) of the process, exit code, stdout, stderr."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO, env={**os.environ, **(env or {})})
        deadline = t0 + timeout
        hwm = 0.0
        while True:
            hwm = max(hwm, _hwm_gb(p.pid))  # read before reaping: the high-water mark only grows
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {
            "rc": p.returncode,
            "wall_s": wall,
            "rss_gb": hwm,
            "cpu_s": ru.ru_utime + ru.ru_stime,
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def last_json(r: dict) -> dict:
    if r["rc"] != 0:
        raise SystemExit(f"failed (exit {r['rc']}):\n{r['stderr'][-3000:]}")
    return json.loads(r["stdout"].strip().splitlines()[-1])


POD_LOAD = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    torch.set_num_threads(1)
    from podracer_hpc.trading.env import StockTradingEnv, get_market
    t1 = time.perf_counter()
    m = get_market(sys.argv[1], (), "cpu", torch.float32, int(sys.argv[2]))
    t2 = time.perf_counter()
    env = StockTradingEnv(4096, data=m, seed=0)
    obs = env.reset()
    a = torch.zeros(4096, env.act_dim)
    for _ in range(10):
        obs, *_ = env.step(a)
    t3 = time.perf_counter()
    touched = float(m.market_obs.sum()) + float(m.close.sum())  # every page of the cache read once
    t4 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "env_s": t3 - t2, "touch_all_s": t4 - t3,
                      "load_s": t3 - t1, "T": m.num_days, "S": m.num_stocks, "finite": touched == touched}))
""")

OLD_PREP = textwrap.dedent("""
    # the code before the cache: pure-Python reader + whole-array indicators + a pseudo-inverse per bar
    import importlib.util, json, sys, time, types
    import torch
    torch.set_num_threads(1)
    pkg = types.ModuleType("oldtrading"); pkg.__path__ = [sys.argv[1]]; sys.modules["oldtrading"] = pkg
    def load(name):
        spec = importlib.util.spec_from_file_location("oldtrading." + name, f"{sys.argv[1]}/{name}.py")
        mod = importlib.util.module_from_spec(spec); sys.modules[spec.name] = mod; spec.loader.exec_module(mod)
        return mod
    data, ind = load("data"), load("indicators")
    t0 = time.perf_counter()
    md = data.load_market(sys.argv[2])
    t1 = time.perf_counter()
    c, h, lo = md.close, md.high, md.low
    f = ind.compute_indicators(h, lo, c)
    turb = ind.turbulence(c, int(sys.argv[3]))
    S = c.shape[1]
    obs = torch.cat([torch.log(c), f["macd"] / c, f["rsi"] / 100.0, f["cci"] / 100.0, f["dx"] / 100.0,
                     f["boll_ub"] / c - 1.0, f["boll_lb"] / c - 1.0, f["sma30"] / c - 1.0, f["sma60"] / c - 1.0,
                     torch.log1p(turb / S)[:, None]], 1).float()
    fp = md.fingerprint()
    t2 = time.perf_counter()
    torch.save({"obs": obs, "turb": turb}, sys.argv[4])
    print(json.dumps({"read_s": t1 - t0, "features_s": t2 - t1, "total_s": t2 - t0, "fingerprint": fp}))
""")

NEW_PREP = textwrap.dedent("""
    import json, sys, time
    import torch
    torch.set_num_threads(1)
    import pyarrow.csv, pyarrow.compute  # imported before the clock starts, as the old code's csv module
    from podracer_hpc.trading.cache import prepare
    from podracer_hpc.trading.data import load_market
    t0 = time.perf_counter()
    md = load_market(sys.argv[1])
    t1 = time.perf_counter()
    md2, obs, turb = prepare(sys.argv[1], turbulence_window=int(sys.argv[2]))
    fp = md2.fingerprint()
    t2 = time.perf_counter()
    old = torch.load(sys.argv[3])
    err = float((obs.double() - old["obs"].double()).abs().max())
    terr = float(((turb - old["turb"]).abs() / old["turb"].abs().clamp(min=1e-12)).max())
    print(json.dumps({"read_s": t1 - t0, "prepare_s": t2 - t1, "fingerprint": fp, "max_abs_obs_diff": err,
                      "max_rel_turbulence_diff": terr}))
""")

READERS = textwrap.dedent("""
    import json, sys, time
    which, path = sys.argv[1], sys.argv[2]
    if which in ("pyarrow", "python"):  # imports first: only the read is timed
        import pyarrow.csv, pyarrow.compute
        from pathlib import Path
        from podracer_hpc.trading.data import _read_csv_python, read_rows
    else:
        import pandas as pd
    t0 = time.perf_counter()
    if which == "pyarrow":
        n = len(read_rows(path))
    elif which == "python":
        n = len(_read_csv_python(Path(path)))
    else:
        kw = {"engine": "pyarrow"} if which == "pandas-pyarrow" else {"dtype": {"ticker": "category"}}
        n = len(pd.read_csv(path, **kw))
    print(json.dumps({"rows": n, "s": time.perf_counter() - t0}))
""")


def load_avg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def old_code(dst: Path, repo: Path) -> bool:
    """The trading data.py and indicators.py from before the cache, into ``dst`` (False: no git)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("data", "indicators"):
        r = subprocess.run(
            ["git", "show", f"{OLD_COMMIT}:podracer_hpc/trading/{name}.py"], cwd=repo, capture_output=True, text=True
        )
        if r.returncode != 0:
            return False
        (dst / f"{name}.py").write_text(r.stdout)
    return True


TRAIN_JOB = """
seed: 0
total_env_steps: 8192
env:
  name: stock_trading
  num_envs: 64
  max_episode_steps: 252
  trading:
    data: {data}
    end: "2024-12-31"
agent:
  rollout_steps: 32
  num_minibatches: 4
  hidden_sizes: [64, 64]
eval:
  interval_env_steps: 8192
  episodes: 2
tournament:
  mode: none
"""


# --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tickers", type=int, default=100)
    ap.add_argument("--days", type=int, default=1100, help="trading days of minute bars (390 a day)")
    ap.add_argument("--window", type=int, default=390, help="turbulence window of the preparation (the paper job's)")
    ap.add_argument("--no-csv", action="store_true", help="Parquet only")
    ap.add_argument("--dir", default="", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--git", default=str(REPO), help="the git checkout to read the old code from")
    args = ap.parse_args(argv)

    work = Path(args.dir or tempfile.mkdtemp(prefix="trading_data_"))
    work.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": str(REPO), "PODRACER_MARKET_CACHE": str(work / "cache")}
    rows: list[tuple[str, str, str]] = []
    res: dict = {
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs",
        "load_avg_start": load_avg(),
        "tickers": args.tickers,
        "days": args.days,
        "window": args.window,
    }

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg} (load {load_avg()})", file=sys.stderr, flush=True)

    try:
        # 1. the minute-bar file and its preparation
        say("generating the minute bars")
        t0 = time.perf_counter()
        table = minute_bars(args.tickers, args.days)
        res["bars"] = table.num_rows
        res["generate_s"] = time.perf_counter() - t0
        files = [work / "minute.parquet"] + ([] if args.no_csv else [work / "minute.csv"])
        for f in files:
            res[f"write_{f.suffix[1:]}_s"] = write(table, f)
            res[f"{f.suffix[1:]}_mb"] = f.stat().st_size / 1e6
        del table
        for f in files:
            fmt = f.suffix[1:]
            say(f"podracer data prepare ({fmt})")
            r = run(
                [PY, "-m", "podracer_hpc.cli", "data", "prepare", str(f), "--set", f"turbulence_window={args.window}"],
                env,
            )
            out = last_json(r)
            res[f"prepare_{fmt}"] = {
                "wall_s": r["wall_s"],
                "cpu_s": r["cpu_s"],
                "rss_gb": r["rss_gb"],
                "cache_mb": out["size_mb"],
                "times": out["times"],
                "tickers": out["tickers"],
                "steps": [ln for ln in r["stderr"].splitlines() if ln.startswith("[podracer data]")],
            }
            rows.append(
                (
                    f"prepare {res['bars'] / 1e6:.1f}M bars from {fmt} ({res[f'{fmt}_mb']:,.0f} MB)",
                    f"{r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, peak {r['rss_gb']:.1f} GB",
                    f"<= {TARGETS['prepare_s']:.0f} s: {'yes' if r['wall_s'] <= TARGETS['prepare_s'] else 'NO'}",
                )
            )
            res[f"load_avg_after_prepare_{fmt}"] = load_avg()
        # the same without the turbulence index (turbulence_window 0): what the index costs
        say("podracer data prepare (parquet, no turbulence index)")
        r = run([PY, "-m", "podracer_hpc.cli", "data", "prepare", str(files[0]), "--set", "turbulence_window=0"], env)
        last_json(r)
        res["prepare_parquet_no_turbulence"] = {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "rss_gb": r["rss_gb"]}
        rows.append(
            (
                "  the same from parquet, turbulence_window 0 (no index)",
                f"{r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, peak {r['rss_gb']:.1f} GB",
                "",
            )
        )
        # 2. a pod's load from the cache
        for k in range(3):
            say(f"a pod's load, #{k + 1}")
            r = run([PY, "-c", POD_LOAD, str(files[0]), str(args.window)], env)
            out = last_json(r)
            res.setdefault("pod_load", []).append({**out, "wall_s": r["wall_s"], "rss_gb": r["rss_gb"]})
            rows.append(
                (
                    f"a pod's load from the cache (#{k + 1}: open + env of 4,096 + 10 steps)",
                    f"{out['load_s']:.2f} s (open {out['open_s']:.2f}, env {out['env_s']:.2f}; reading every "
                    f"byte once {out['touch_all_s']:.2f}; process {r['wall_s']:.1f} s, {r['rss_gb']:.1f} GB)",
                    f"<= {TARGETS['load_s']:.0f} s: {'yes' if out['load_s'] <= TARGETS['load_s'] else 'NO'}",
                )
            )
        for f in files:  # the big files are done with
            f.unlink()
        shutil.rmtree(work / "cache", ignore_errors=True)

        # 3. the 10-year daily backtest of one checkpoint
        say("daily bars, a checkpoint")
        daily = work / "daily.csv"
        write(daily_bars(args.tickers, 2520), daily)
        job = work / "daily.yaml"
        job.write_text(TRAIN_JOB.format(data=daily))
        r = run([PY, "-m", "podracer_hpc.cli", "train", str(job), "--run-dir", str(work / "run"), "--quiet"], env)
        last_json(r)
        res["train_s"] = r["wall_s"]
        ckpt = work / "run" / "checkpoints" / "rank0.safetensors"
        bt = [PY, "-m", "podracer_hpc.cli", "backtest", str(ckpt), "--start", "2016-01-04", "--plot", ""]
        for label, cold in (
            ("warm cache (the pods' own)", False),
            ("cold cache (prepares first)", True),
            ("warm cache, again", False),
        ):
            if cold:
                shutil.rmtree(work / "cache", ignore_errors=True)
            say(f"podracer backtest, {label}")
            r = run(bt, env)
            out = last_json(r)
            res.setdefault("backtest", []).append(
                {"label": label, "wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "bars": out["bars"], "rss_gb": r["rss_gb"]}
            )
            rows.append(
                (
                    f"10-year daily backtest, {args.tickers} stocks, {out['bars']:,} bars: {label}",
                    f"{r['wall_s']:.1f} s end to end ({r['cpu_s']:.1f} s CPU; process start included), "
                    f"{r['rss_gb']:.1f} GB",
                    f"<= {TARGETS['backtest_s']:.0f} s: {'yes' if r['wall_s'] <= TARGETS['backtest_s'] else 'NO'}",
                )
            )

        # 4. old vs new
        old = work / "old"
        if old_code(old, Path(args.git)):
            small = work / "minute10.csv"
            write(minute_bars(args.tickers, 10, seed=2), small)
            for label, f, w in (("daily, 10 years", daily, 252), ("minute, 10 days", small, args.window)):
                say(f"old vs new: {label}")
                ro = run([PY, "-c", OLD_PREP, str(old), str(f), str(w), str(work / "old.pt")], env)
                o = last_json(ro)
                rn = run([PY, "-c", NEW_PREP, str(f), str(w), str(work / "old.pt")], env)
                n = last_json(rn)
                same = o["fingerprint"] == n["fingerprint"]
                res.setdefault("old_vs_new", []).append({"label": label, "old": o, "new": n, "same_market": same})
                rows.append(
                    (
                        f"old vs new, {label}: read + align",
                        f"{o['read_s']:.2f} s -> {n['read_s']:.2f} s",
                        f"{o['read_s'] / n['read_s']:.0f}x",
                    )
                )
                rows.append(
                    (
                        f"old vs new, {label}: read + align + features (w={w})",
                        f"{o['total_s']:.1f} s -> {n['prepare_s']:.1f} s (same market: {same}; features differ "
                        f"by <= {n['max_abs_obs_diff']:.1e}, turbulence by <= {n['max_rel_turbulence_diff']:.1e} rel.)",
                        f"{o['total_s'] / n['prepare_s']:.0f}x",
                    )
                )
        else:
            rows.append(("old vs new", "skipped: no git history here", ""))

        # 5. CSV readers
        mid = work / "minute100.csv"
        write(minute_bars(args.tickers, 100, seed=3), mid)
        have_pandas = importlib.util.find_spec("pandas") is not None
        for which in ("pyarrow", "pandas", "pandas-pyarrow"):
            if which.startswith("pandas") and not have_pandas:
                rows.append((f"CSV reader: {which}", "skipped: pandas not installed", ""))
                continue
            say(f"reader {which}")
            r = run([PY, "-c", READERS, which, str(mid)], env)
            out = last_json(r)
            res.setdefault("readers", []).append({"reader": which, **out, "rss_gb": r["rss_gb"], "wall_s": r["wall_s"]})
            what = "read + validate (ours)" if which == "pyarrow" else "read only"
            rows.append(
                (
                    f"CSV reader on {out['rows'] / 1e6:.1f}M bars: {which} ({what})",
                    f"{out['s']:.1f} s ({out['rows'] / out['s'] / 1e6:.2f}M bars/s), peak {r['rss_gb']:.2f} GB",
                    "",
                )
            )
    finally:
        res["load_avg_end"] = load_avg()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)

    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(
        f"trading data path: {args.tickers} tickers x 390 x {args.days} days ({res.get('bars', 0):,} bars), "
        f"{res['machine']}, load average {res['load_avg_start']} .. {res['load_avg_end']}"
    )
    print(f"{'what':<{w0}}  {'measured':<{w1}}  target / ratio")
    for a, b, c in rows:
        print(f"{a:<{w0}}  {b:<{w1}}  {c}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
