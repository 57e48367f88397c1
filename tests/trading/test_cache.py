"""The data path at scale: wide and long files, the prepared-market cache (reuse, rebuild, one
preparation for many processes), the env and the backtest reading it, `podracer data`, and the
real daily prices that skfolio ships in its wheel."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time

import numpy as np
import pytest
import torch

from podracer_hpc.trading import cache as cache_mod
from podracer_hpc.trading import load_market, synthetic_market
from podracer_hpc.trading.cache import cache_path, cache_status, open_market
from podracer_hpc.trading.env import StockTradingEnv, get_market, prepare_market
from podracer_hpc.trading.fields import FIELDS, DataError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SP500 = "pkg:skfolio/datasets/data/sp500_dataset.csv.gz"


def flat_market(num_stocks=4, days=80, seed=1):
    """A market whose bars are flat (open = high = low = close, volume 0): what a wide file can hold."""
    md = synthetic_market(num_stocks, days, seed=seed)
    c = md.close.numpy()
    return md, c


def write_long_and_wide(tmp_path, md, c, drop=()):
    """The same closes as a long CSV and a wide CSV (and Parquet of each); ``drop``: (t, s) cells left out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ds, tk = md.date_strings(), md.tickers
    T, S = c.shape
    missing = set(drop)
    long_rows, wide_rows = ["date,ticker,open,high,low,close,volume"], ["date," + ",".join(tk)]
    for t in range(T):
        cells = []
        for s in range(S):
            x = repr(float(c[t, s]))
            if (t, s) in missing:
                cells.append("")
                continue
            cells.append(x)
            long_rows.append(f"{ds[t]},{tk[s]},{x},{x},{x},{x},0")
        wide_rows.append(f"{ds[t]}," + ",".join(cells))
    (tmp_path / "long.csv").write_text("\n".join(long_rows) + "\n")
    (tmp_path / "wide.csv").write_text("\n".join(wide_rows) + "\n")
    wide = {"Date": md.dates.astype("datetime64[s]")}
    for s in range(S):
        col = c[:, s].copy()
        col[[t for t, s2 in missing if s2 == s]] = np.nan
        wide[tk[s]] = col
    pq.write_table(pa.table(wide), tmp_path / "wide.parquet")
    keep = [(t, s) for t in range(T) for s in range(S) if (t, s) not in missing]
    vals = np.array([c[t, s] for t, s in keep])
    pq.write_table(
        pa.table(
            {
                "timestamp": np.array([md.dates[t] for t, _ in keep]).astype("datetime64[s]"),
                "symbol": [tk[s] for _, s in keep],
                "open": vals,
                "high": vals,
                "low": vals,
                "close": vals,
                "volume": np.zeros(len(vals)),
            }
        ),
        tmp_path / "long.parquet",
    )
    return [tmp_path / n for n in ("long.csv", "wide.csv", "wide.parquet", "long.parquet")]


def same_market(a, b):
    assert a.tickers == b.tickers
    assert np.array_equal(a.dates, b.dates)
    for f in (*FIELDS, "valid"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert a.notes == b.notes


# --------------------------------------------------------------------------------------
# Long and wide
# --------------------------------------------------------------------------------------
def test_wide_and_long_files_give_the_same_market(tmp_path):
    md, c = flat_market()
    files = write_long_and_wide(tmp_path, md, c, drop=[(5, 1), (6, 1), (0, 3), (1, 3)])
    markets = [load_market(p) for p in files]
    for m in markets[1:]:
        same_market(markets[0], m)
    m = markets[0]
    assert m.num_days == 78 and m.tickers == md.tickers  # trimmed to where SYN003 is listed
    b = m.tickers.index("SYN001")
    assert m.valid[:, b].sum() == 76 and torch.equal(m.high, m.close) and (m.volume == 0).all()
    assert any("forward-filled 2" in n for n in m.notes)
    # and the same prepared features through the cache
    obs = [open_market(p, progress=lambda _m: None).market_obs for p in files]
    for o in obs[1:]:
        assert torch.equal(obs[0], o)


def test_hdf5_long_and_wide(tmp_path):
    h5py = pytest.importorskip("h5py")
    md, c = flat_market(3, 40)
    long_csv, wide_csv = write_long_and_wide(tmp_path, md, c, drop=[(7, 2)])[:2]
    with h5py.File(tmp_path / "w.h5", "w") as f:
        f["Date"] = np.array(md.date_strings(), dtype="S10")
        for s, t in enumerate(md.tickers):
            col = c[:, s].copy()
            col[7] = np.nan if s == 2 else col[7]
            f[t] = col
        f.create_group("about")  # a group beside the columns is not a column
    same_market(load_market(tmp_path / "w.h5"), load_market(wide_csv))
    with h5py.File(tmp_path / "l.h5", "w") as f:
        g = f.create_group("bars")
        keep = [(t, s) for t in range(40) for s in range(3) if (t, s) != (7, 2)]
        g["date"] = np.array([md.date_strings()[t] for t, _ in keep], dtype="S10")
        g["ticker"] = np.array([md.tickers[s] for _, s in keep], dtype="S6")
        for k in ("open", "high", "low", "close"):
            g[k] = np.array([c[t, s] for t, s in keep])
        g["volume"] = np.zeros(len(keep))
        g.create_group("notes")
    same_market(load_market(tmp_path / "l.h5", key="bars"), load_market(long_csv))


@pytest.mark.parametrize(
    "text,match",
    [
        ("date,A,B\n2020-01-06,1,2\n2020-01-07,1,-3\n", r"line 3: B must be > 0, got -3.0 \(leave the cell empty"),
        ("date,A,B\n2020-01-06,1,2\n2020-01-07,1,x\n", r"line 3: B 'x' is not a number"),
        ("date,A,B\n2020-01-06,1,2\n\n2020-01-07,1,inf\n", r"line 4: B is inf, not a finite number"),
        (
            "date,A,B\n2020-01-06,1,2\n2020-01-07,1,2\n2020-01-07,1,2\n",
            r"line 4: a second bar for A .*first is at line 3",
        ),
        ("date,A,A\n2020-01-06,1,2\n", r"ticker A has two columns"),
        ("date,open,B\n2020-01-06,1,2\n", r"no ticker column"),
        ("date\n2020-01-06\n", r"only a time column"),
        ("date,A,B\n2020-13-06,1,2\n", r"line 2: time '2020-13-06' is not a date"),
    ],
)
def test_bad_wide_files_name_the_line(tmp_path, text, match):
    p = tmp_path / "w.csv"
    p.write_text(text)
    with pytest.raises(DataError, match=match) as e:
        load_market(p)
    assert str(p) in str(e.value)


def test_fast_reader_keeps_the_line_numbers_and_the_python_rules(tmp_path):
    head = "date,ticker,open,high,low,close,volume\n"
    p = tmp_path / "b.csv"
    # blank lines and an all-blank row are skipped; the bad row is named by its line
    p.write_text("\n" + head + "2020-01-06,A,1,1,1,1,0\n\n,,,,,,\n2020-01-07,A,1,2,1,1,-1\n")
    with pytest.raises(DataError, match=r"line 6: volume must be >= 0"):
        load_market(p)
    # what Python reads as a number (and pyarrow does not) is read, by the line reader
    p.write_text(head + "2020-01-06,A,1_0,11,9,10,0\n2020-01-07, A ,10,11,9,10,0\n")
    md = load_market(p)
    assert md.open[:, 0].tolist() == [10.0, 10.0] and md.tickers == ["A"]
    # an error far down a file that pyarrow refuses: found by the offending text
    rows = [f"2020-{1 + i // 28:02d}-{1 + i % 28:02d},A,1,1,1,1,0" for i in range(300)]
    rows[250] = "2020-09-07,A,1,1,1,abc,0"
    p.write_text(head + "\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"line 252: close 'abc' is not a number"):
        load_market(p)


# --------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------
def test_cache_equals_the_direct_computation(tmp_path):
    md = synthetic_market(5, 400, seed=2)
    p = tmp_path / "m.csv"
    md.to_csv(p)
    m = open_market(p, turbulence_window=40, progress=lambda _m: None)
    direct = prepare_market(load_market(p), "cpu", torch.float32, 40)
    same_market(m.data, direct.data)
    assert torch.equal(m.market_obs, direct.market_obs)
    assert torch.equal(m.turbulence, direct.turbulence) and (m.turbulence[41:] > 0).all()
    assert m.fingerprint == direct.fingerprint == md.fingerprint()
    assert m.path == cache_path(p, turbulence_window=40) and m.path.parent == tmp_path
    # read back: memory-mapped, and writing to the map never reaches the file
    again = open_market(p, turbulence_window=40)
    assert not again.prepared_here and torch.equal(again.market_obs, m.market_obs)
    again.market_obs[0, 0] = 123.0
    assert open_market(p, turbulence_window=40).market_obs[0, 0] != 123.0


def test_cache_is_reused_and_rebuilt_when_the_data_or_options_change(tmp_path, monkeypatch):
    md = synthetic_market(4, 300, seed=3)
    p = tmp_path / "m.csv"
    md.to_csv(p)
    quiet = {"progress": lambda _m: None}
    first = open_market(p, **quiet)
    assert first.prepared_here
    inode = os.stat(first.path).st_ino
    assert not open_market(p, **quiet).prepared_here  # reused
    # touched, same contents: the hash says it is the same data
    os.utime(p, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert not open_market(p, **quiet).prepared_here and os.stat(first.path).st_ino == inode
    # other options: another cache file, the first one stays
    other = open_market(p, stocks=["SYN002", "SYN000"], **quiet)
    assert other.prepared_here and other.path != first.path and other.data.tickers == ["SYN002", "SYN000"]
    assert open_market(p, turbulence_window=20, **quiet).prepared_here
    assert not open_market(p, **quiet).prepared_here
    # the data changes: rebuilt in place, with the new prices
    text = p.read_text().splitlines()
    last = text[-1].split(",")
    last[5] = repr(float(last[5]) * 1.5)
    last[3] = repr(max(float(last[3]), float(last[5])))  # keep high >= close
    p.write_text("\n".join(text[:-1] + [",".join(last)]) + "\n")
    assert cache_status(p)[1].startswith("the data file changed")
    rebuilt = open_market(p, **quiet)
    assert rebuilt.prepared_here and rebuilt.path == first.path
    assert rebuilt.data.close[-1, -1] == pytest.approx(float(last[5]))
    assert rebuilt.fingerprint != first.fingerprint
    # new code: rebuilt
    monkeypatch.setattr(cache_mod, "code_version", lambda: "something-else")
    assert "other code" in cache_status(p)[1]
    assert open_market(p, **quiet).prepared_here


def _open_in_child(path, barrier, out):
    torch.set_num_threads(1)
    barrier.wait()
    m = open_market(path, turbulence_window=30, progress=lambda _m: None)
    obs = m.market_obs.numpy()
    out.put((m.prepared_here, str(m.path), obs.tobytes(), m.fingerprint, m.data.tickers))


def test_eight_processes_opening_a_missing_cache_prepare_it_once(tmp_path):
    synthetic_market(6, 1500, seed=4).to_csv(tmp_path / "m.csv")  # preparation takes a moment
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["podracer_hpc.trading.cache"])
    barrier, out = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_open_in_child, args=(str(tmp_path / "m.csv"), barrier, out)) for _ in range(8)]
    for pr in procs:
        pr.start()
    results = [out.get(timeout=240) for _ in procs]
    for pr in procs:
        pr.join(timeout=60)
        assert pr.exitcode == 0
    assert sum(r[0] for r in results) == 1, [r[0] for r in results]
    assert len({r[1] for r in results}) == 1 and len({r[2] for r in results}) == 1
    assert len({r[3] for r in results}) == 1 and len({tuple(r[4]) for r in results}) == 1
    direct = prepare_market(load_market(tmp_path / "m.csv"), "cpu", torch.float32, 30)
    assert np.frombuffer(results[0][2], dtype=np.float32).tobytes() == direct.market_obs.numpy().tobytes()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_unwritable_cache_dir_prepares_in_memory(tmp_path):
    synthetic_market(3, 100, seed=5).to_csv(tmp_path / "m.csv")
    (tmp_path / "file").write_text("x")
    said = []
    m = open_market(tmp_path / "m.csv", cache_dir=tmp_path / "file" / "sub", progress=said.append)
    assert m.path is None and m.prepared_here and m.data.num_days == 100
    assert any("cannot write the market cache" in s for s in said)


def test_env_and_backtest_read_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache_mod.CACHE_ENV, str(tmp_path / "cache"))
    md = synthetic_market(3, 300, seed=6)
    p = tmp_path / "m.csv"
    md.to_csv(p)
    env = StockTradingEnv(8, data=str(p), turbulence_window=30)
    files = os.listdir(tmp_path / "cache")
    assert any(f.startswith("m.csv.market-") and f.endswith(".h5") for f in files)
    assert env.market.data.meta["cache"].startswith(str(tmp_path / "cache"))
    fresh = prepare_market(load_market(p), "cpu", torch.float32, 30)
    assert torch.equal(env.market.market_obs, fresh.market_obs) and int(env.data_id) == fresh.fingerprint
    from podracer_hpc.tools.backtest import backtest

    r = backtest(lambda obs: torch.zeros(obs.shape[0], 3), str(p), turbulence_window=30, plot=None)
    assert r["bars"] == 300 - 60 - 1 and r["agent"]["cumulative_return"] == 0.0
    assert get_market(str(p), (), "cpu", torch.float32, 30).market_obs.data_ptr() == env.market.market_obs.data_ptr()


def test_podracer_data_prepare_and_info(tmp_path, cli, capsys):
    from podracer_hpc.cli import main

    synthetic_market(3, 200, seed=7).to_csv(tmp_path / "m.csv")
    r = cli("data", "prepare", str(tmp_path / "m.csv"), "--set", "turbulence_window=30", "--set", "stocks=[SYN001]")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["prepared"] and out["tickers"] == 1 and out["times"] == 200
    assert "preparing" in r.stderr and "aligned: 200 times x 1 tickers" in r.stderr
    capsys.readouterr()
    assert (
        main(
            [
                "data",
                "info",
                str(tmp_path / "m.csv"),
                "--set",
                "env.trading.turbulence_window=30",
                "--set",
                "env.trading.stocks=[SYN001]",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["fresh"]
    assert main(["data", "info", str(tmp_path / "m.csv")]) == 0 and "missing" in capsys.readouterr().out
    for bad, why in (
        (str(tmp_path / "nope.csv"), "no such market data file"),
        ("jobs/pendulum.yaml", "not stock_trading"),
        ("jobs/trading_quickstart.yaml", "synthetic market"),
    ):
        assert main(["data", "prepare", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("podracer data: error:") and why in err, err


# --------------------------------------------------------------------------------------
# Real data, offline: skfolio's wheel ships the daily closes of 20 S&P 500 stocks
# --------------------------------------------------------------------------------------
def test_real_daily_prices_from_a_wheel_load_through_the_same_path():
    pytest.importorskip("skfolio", reason="the real-data extra: pip install 'podracer-hpc[real-data]'")
    md = load_market(SP500)
    assert md.num_stocks == 20 and md.num_days == 8313 and md.valid.all() and md.notes == []
    assert md.date_strings()[0] == "1990-01-02" and md.date_strings()[-1] == "2022-12-28"
    assert "AAPL" in md.tickers and "XOM" in md.tickers
    assert torch.equal(md.open, md.close) and (md.volume == 0).all()  # a wide file: closes only
    aapl = md.close[:, md.tickers.index("AAPL")]
    assert aapl[-1] > 100 * aapl[0]  # 0.264 -> 125.7 (split-adjusted)
    sub = load_market(SP500, tickers=["MSFT", "JNJ"], start="2015-01-01", end="2015-12-31")
    assert sub.tickers == ["MSFT", "JNJ"] and sub.num_days == 252


def test_real_data_job(tmp_path, monkeypatch):
    """jobs/trading_real.yaml: its data resolves inside skfolio's wheel, its cache goes to the user's
    cache dir (never into the installed package), and its env trades 2008-2017."""
    pytest.importorskip("skfolio", reason="the real-data extra: pip install 'podracer-hpc[real-data]'")
    from podracer_hpc.config import load_config
    from podracer_hpc.trading.fields import resolve_data_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(cache_mod.CACHE_ENV, raising=False)
    t = load_config("jobs/trading_real.yaml").env.trading
    assert t.data == SP500 and resolve_data_path(t.data).is_file()
    assert cache_path(t.data).parent == tmp_path / "podracer-hpc" / "markets"
    env = StockTradingEnv(4, data=t.data, start=t.start, end=t.end, max_shares=t.max_shares)
    ds = env.market.data.date_strings()
    assert (ds[env.lo], ds[env.hi]) == ("2008-01-02", "2017-12-29") and env.num_stocks == 20
    assert env.market.data.meta["cache"].startswith(str(tmp_path))


def test_missing_package_is_a_clear_error():
    with pytest.raises(DataError, match="not installed here"):
        load_market("pkg:no_such_package_xyz/data.csv")
    with pytest.raises(DataError, match="expected pkg:PACKAGE/path"):
        load_market("pkg:skfolio")


def test_a_market_file_is_resolved_once_and_its_cache_opened_once(tmp_path, monkeypatch):
    """A ``pkg:`` data path is looked up once per env build and once per backtest (it was 3
    and 5 times), and a backtest on the pods' cache checks and opens that cache once (it was twice:
    cache_status, then get_market)."""
    import importlib.util
    import sys

    from podracer_hpc.tools.backtest import backtest
    from podracer_hpc.trading import env as env_mod

    pkg = tmp_path / "site" / "podracer_fake_market"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    synthetic_market(3, 300, seed=7).to_csv(pkg / "m.csv")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv(cache_mod.CACHE_ENV, str(tmp_path / "cache"))
    lookups, reads, find_spec, read = [], [], importlib.util.find_spec, cache_mod._read
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **k: (lookups.append(name), find_spec(name, *a, **k))[1]
    )
    monkeypatch.setattr(cache_mod, "_read", lambda *a, **k: (reads.append(a[0]), read(*a, **k))[1])
    monkeypatch.setattr(env_mod, "_CACHE", {})
    spec = "pkg:podracer_fake_market/m.csv"

    env = StockTradingEnv(4, data=spec, turbulence_window=30)  # prepares the cache
    assert lookups.count("podracer_fake_market") == 1
    lookups.clear(), reads.clear(), env_mod._CACHE.clear()
    StockTradingEnv(4, data=spec, turbulence_window=30)  # opens it
    assert lookups.count("podracer_fake_market") == 1 and len(reads) == 1
    lookups.clear(), reads.clear(), env_mod._CACHE.clear()

    class Policy:
        tickers = env.market.data.tickers  # a checkpoint's policy knows its stocks: the pods' cache fits
        obs_dim = env.obs_dim

        def __call__(self, obs):
            return torch.zeros(obs.shape[0], 3)

    r = backtest(Policy(), spec, turbulence_window=30, plot=None)
    assert r["bars"] == 300 - 60 - 1
    assert lookups.count("podracer_fake_market") == 1 and len(reads) == 1
    assert "podracer_fake_market" not in sys.modules  # located, never imported
