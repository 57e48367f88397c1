"""Market data: the long-format loader, its alignment policy, bad files, the synthetic market."""

from __future__ import annotations

import gzip
import sys

import numpy as np
import pytest
import torch

from podracer_hpc.trading import DataError, from_arrays, load_market, synthetic_history, synthetic_market
from podracer_hpc.trading.fields import parse_time

HEADER = "date,ticker,open,high,low,close,volume\n"


# torch on one thread: the 2 shared cores make OpenMP threads wait on each other (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write(tmp_path, rows, name="bars.csv", header=HEADER):
    p = tmp_path / name
    p.write_text(header + "".join(r + "\n" for r in rows))
    return p


def bar(date, tic, c, v=1000):
    return f"{date},{tic},{c},{c + 1},{c - 1},{c},{v}"


def days(n, start="2020-01-06"):
    return [str(d) for d in np.busday_offset(np.datetime64(start, "D"), np.arange(n), roll="forward")]


# --------------------------------------------------------------------------------------
# Reading and aligning
# --------------------------------------------------------------------------------------
def test_round_trip_of_the_synthetic_market_through_csv(tmp_path):
    md = synthetic_market(4, 50, seed=3)
    p = tmp_path / "m.csv"
    md.to_csv(p)
    back = load_market(p)
    assert back.tickers == md.tickers
    assert np.array_equal(back.dates, md.dates)
    for f in ("open", "high", "low", "close", "volume"):
        assert torch.equal(getattr(back, f), getattr(md, f)), f
    assert back.valid.all() and back.notes == []
    # gzip, column order, case and aliases do not matter
    rows = p.read_text().splitlines()
    body = ["{1},{0},{6},{2},{3},{4},{5}".format(*r.split(",")) for r in rows[1:]]
    gz = tmp_path / "m.csv.gz"
    with gzip.open(gz, "wt") as f:
        f.write("TIC,Date,Volume,Open,High,Low,Close,extra\n" + "".join(b + ",x\n" for b in body))
    back2 = load_market(gz)
    assert torch.equal(back2.close, md.close) and back2.tickers == md.tickers


def test_missing_bars_are_forward_filled_flat_and_marked(tmp_path):
    d = days(6)
    rows = [bar(x, "AAA", 10 + i) for i, x in enumerate(d)]
    rows += [bar(x, "BBB", 20 + i) for i, x in enumerate(d) if i not in (2, 3)]
    md = load_market(write(tmp_path, rows), min_coverage=0.5)
    assert md.tickers == ["AAA", "BBB"] and md.num_days == 6
    b = md.tickers.index("BBB")
    assert md.close[:, b].tolist() == [20, 21, 21, 21, 24, 25]
    assert md.open[2, b] == md.high[2, b] == md.low[2, b] == 21 and md.volume[2, b] == 0
    assert md.valid[:, b].tolist() == [True, True, False, False, True, True]
    assert any("forward-filled 2" in n for n in md.notes)


def test_unequal_histories_trim_to_the_common_span_or_drop_sparse_tickers(tmp_path):
    d = days(20)
    rows = [bar(x, "OLD", 10) for x in d]
    rows += [bar(x, "NEW", 30) for x in d[3:]]  # listed later: 85% coverage
    rows += [bar(x, "IPO", 50) for x in d[15:]]  # 25% coverage
    md = load_market(write(tmp_path, rows), min_coverage=0.8)
    assert md.tickers == ["NEW", "OLD"]
    assert str(md.dates[0])[:10] == d[3] and md.num_days == 17  # no back-fill before NEW's first bar
    assert any("IPO" in n and "dropped tickers" in n for n in md.notes)
    assert any("common span" in n for n in md.notes)
    # asking for a sparse ticker is an error, not a silent drop
    with pytest.raises(DataError, match="IPO"):
        load_market(write(tmp_path, rows), tickers=["OLD", "IPO"], min_coverage=0.8)
    with pytest.raises(DataError, match="not in the file: ZZZ"):
        load_market(write(tmp_path, rows), tickers=["ZZZ"])
    sub = load_market(write(tmp_path, rows), tickers=["OLD", "NEW"], start=d[5], end=d[10])
    assert sub.tickers == ["OLD", "NEW"] and sub.num_days == 6


def test_stray_times_are_dropped(tmp_path):
    d = days(10)
    rows = [bar(x, t, 10) for x in d for t in ("A", "B", "C")]
    rows.append(bar("2020-01-11", "A", 11))  # a Saturday print of one ticker
    md = load_market(write(tmp_path, rows))
    assert md.num_days == 10 and "2020-01-11" not in md.date_strings()
    assert any("fewer than 50%" in n for n in md.notes)


def test_minute_bars_with_zones_and_yyyymmdd(tmp_path):
    rows = [
        bar("2021-03-01T14:30:00Z", "A", 10),
        bar("2021-03-01 09:31:00-05:00", "A", 11),
        bar("2021-03-01T14:30:00+00:00", "B", 5),
        bar("2021-03-01 14:31", "B", 6),
    ]
    md = load_market(write(tmp_path, rows))
    assert md.date_strings() == ["2021-03-01 14:30:00", "2021-03-01 14:31:00"]
    assert md.close.tolist() == [[10, 5], [11, 6]]
    assert parse_time("20200102") == parse_time("2020-01-02")


# --------------------------------------------------------------------------------------
# Bad files: rejected with the file and the line
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rows,match",
    [
        ([bar("2020-01-06", "A", 10), "2020-01-07,A,10,11,9,abc,5"], r"line 3: close 'abc' is not a number"),
        ([bar("2020-01-06", "A", 10), bar("yesterday", "A", 10)], r"line 3: time 'yesterday' is not a date"),
        ([bar("2020-01-06", "A", 10), bar("2020-01-07", "A", -1)], r"line 3: .* must be > 0"),
        ([bar("2020-01-06", "A", 10), "2020-01-07,A,10,9,11,10,5"], r"line 3: low 11.0 is above high 9.0"),
        ([bar("2020-01-06", "A", 10), "2020-01-07,A,10,11,9,10,-5"], r"line 3: volume must be >= 0"),
        ([bar("2020-01-06", "A", 10), "2020-01-07,A,10,11,9,nan,5"], r"line 3: close is nan"),
        ([bar("2020-01-06", "A", 10), "2020-01-07,A,10,11"], r"line 3: 4 fields, the header has 7"),
        ([bar("2020-01-06", "A", 10), bar("2020-01-07", "", 10)], r"line 3: empty ticker"),
        (
            [bar("2020-01-06", "A", 10), bar("2020-01-07", "A", 10), bar("2020-01-06", "A", 12)],
            r"line 4: a second bar for A at 2020-01-06.*line 2",
        ),
    ],
)
def test_bad_rows_are_rejected_with_file_and_line(tmp_path, rows, match):
    p = write(tmp_path, rows)
    with pytest.raises(DataError, match=match) as ei:
        load_market(p)
    assert str(p) in str(ei.value)


def test_bad_files(tmp_path):
    with pytest.raises(DataError, match="no close column"):
        load_market(write(tmp_path, [], header="date,ticker,open,high,low,volume\n"))
    with pytest.raises(DataError, match="empty"):
        load_market(write(tmp_path, [], header=""))
    with pytest.raises(DataError, match="no such market data file"):
        load_market(tmp_path / "nope.csv")
    (tmp_path / "x.xlsx").write_text("x")
    with pytest.raises(DataError, match="unknown file type"):
        load_market(tmp_path / "x.xlsx")
    (tmp_path / "bin.csv.gz").write_bytes(b"\x00\x01 not gzip")
    with pytest.raises(DataError, match="not a readable CSV"):
        load_market(tmp_path / "bin.csv.gz")
    with pytest.raises(DataError, match="histories do not overlap"):
        load_market(
            write(tmp_path, [bar(x, "A", 5) for x in days(4)] + [bar(x, "B", 5) for x in days(4, "2021-01-04")]),
            min_coverage=0.1,
            min_date_coverage=0.1,
        )


def test_hdf5_columns(tmp_path):
    h5py = pytest.importorskip("h5py")
    md = synthetic_market(3, 30, seed=1)
    T, S = md.num_days, md.num_stocks
    p = tmp_path / "m.h5"
    with h5py.File(p, "w") as f:
        g = f.create_group("bars")
        g["date"] = np.repeat(np.array(md.date_strings(), dtype="S10"), S)
        g["ticker"] = np.tile(np.array(md.tickers, dtype="S6"), T)
        for k in ("open", "high", "low", "close", "volume"):
            g[k] = getattr(md, k).numpy().reshape(-1)
    back = load_market(p, key="bars")
    assert torch.equal(back.close, md.close) and back.tickers == md.tickers
    with h5py.File(p, "a") as f:
        f["bars/close"][4] = -3.0
    with pytest.raises(DataError, match=r"row 5: close must be > 0"):
        load_market(p, key="bars")


def test_parquet_needs_pyarrow_or_round_trips(tmp_path, monkeypatch):
    p = tmp_path / "m.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        p.write_bytes(b"PAR1")
        with pytest.raises(DataError, match=r"pip install .podracer-hpc\[trading\]."):
            load_market(p)
        return
    md = synthetic_market(2, 20, seed=2)
    T, S = md.num_days, md.num_stocks
    cols = {"date": np.repeat(md.dates, S), "tic": np.tile(md.tickers, T)}
    cols.update({k: getattr(md, k).numpy().reshape(-1) for k in ("open", "high", "low", "close", "volume")})
    pq.write_table(pa.table(cols), p)
    assert torch.equal(load_market(p).close, md.close)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"pip install .podracer-hpc\[trading\]."):
        load_market(p)


def test_from_arrays_and_select_and_fingerprint():
    md = from_arrays([[1.0, 2.0], [1.5, 2.5], [2.0, 2.0]], tickers=["X", "Y"])
    assert md.num_days == 3 and md.num_stocks == 2 and md.valid.all()
    y = md.select(["Y"])
    assert y.close[:, 0].tolist() == [2.0, 2.5, 2.0]
    assert (
        md.fingerprint() != y.fingerprint()
        and md.fingerprint() == from_arrays(md.close, tickers=["X", "Y"]).fingerprint()
    )
    with pytest.raises(DataError, match="not in the data"):
        md.select(["Z"])


# --------------------------------------------------------------------------------------
# The synthetic market
# --------------------------------------------------------------------------------------
def test_synthetic_market_is_seeded():
    a, b, c = synthetic_market(5, 200, seed=4), synthetic_market(5, 200, seed=4), synthetic_market(5, 200, seed=5)
    assert torch.equal(a.close, b.close) and not torch.equal(a.close, c.close)
    assert (a.high >= torch.maximum(a.open, a.close)).all() and (a.low <= torch.minimum(a.open, a.close)).all()
    assert (a.close > 0).all() and (a.volume >= 0).all()
    assert np.is_busday(a.dates.astype("datetime64[D]")).all()


def lag1_autocorr_of_residuals(md):
    c = md.close.numpy()
    r = c[1:] / c[:-1] - 1
    res = r - r.mean(1, keepdims=True)  # remove the common factor
    return np.array([np.corrcoef(res[1:, s], res[:-1, s])[0, 1] for s in range(r.shape[1])])


@pytest.mark.parametrize("structure,sign", [("momentum", 1), ("mean_reversion", -1)])
def test_synthetic_market_structure(structure, sign):
    md = synthetic_market(20, 1500, seed=1, structure=structure)
    chosen = [md.tickers.index(t) for t in md.meta["predictable"]]
    assert len(chosen) == 6
    ac = lag1_autocorr_of_residuals(md)
    others = np.delete(ac, chosen)
    assert sign * ac[chosen].mean() > 0.12 and abs(others.mean()) < 0.05
    # heavy tails, correlated assets, several regimes
    c = md.close.numpy()
    r = c[1:] / c[:-1] - 1
    z = (r - r.mean(0)) / r.std(0)
    assert (z**4).mean() > 5  # a Gaussian has 3
    corr = np.corrcoef(r.T)
    assert corr[~np.eye(20, dtype=bool)].mean() > 0.2
    assert len(set(md.meta["regime"].tolist())) == 3
    none = synthetic_market(20, 1500, seed=1, structure="none")
    assert none.meta["predictable"] == {} and abs(lag1_autocorr_of_residuals(none).mean()) < 0.05
    with pytest.raises(ValueError, match="structure"):
        synthetic_market(structure="trend")


def test_synthetic_history_joins_independent_markets():
    seeds = [11, 12, 13]
    h = synthetic_history(
        seeds,
        num_stocks=4,
        days_per_market=300,
        structure="momentum",
        predictable_fraction=1.0,
        price_band=(20.0, 60.0),
    )
    assert h.num_days == 900 and h.tickers == synthetic_market(4, 300, seed=11).tickers
    assert h.meta["segments"] == [0, 300, 600] and h.meta["seeds"] == seeds
    assert np.is_busday(h.dates.astype("datetime64[D]")).all() and (np.diff(h.dates) > np.timedelta64(0)).all()
    c = h.close.numpy()
    for k, sd in enumerate(seeds):
        m = synthetic_market(4, 300, seed=sd, structure="momentum", predictable_fraction=1.0)
        seg = slice(300 * k, 300 * (k + 1))
        # each market's own returns and candles (prices scaled per stock), volumes unchanged
        scale = c[300 * k] / m.close.numpy()[0]
        for f in ("open", "high", "low", "close"):
            np.testing.assert_allclose(getattr(h, f).numpy()[seg], getattr(m, f).numpy() * scale, rtol=1e-12)
        assert torch.equal(h.volume[seg], m.volume)
        if k:  # the join: the last close, brought into the band, is the next market's first close
            np.testing.assert_allclose(c[300 * k], np.clip(c[300 * k - 1], 20.0, 60.0), rtol=1e-12)
    assert all(len(v) == 3 and all(p == 0.25 for p in v) for v in h.meta["predictable"].values())
    assert torch.equal(synthetic_history(seeds, 4, 300).close, synthetic_history(seeds, 4, 300).close)
    with pytest.raises(ValueError, match="seed"):
        synthetic_history([])


# --------------------------------------------------------------------------------------
# Dates on the command line
# --------------------------------------------------------------------------------------
def test_dates_typed_on_the_command_line_are_accepted(capsys):
    """YAML reads ``2012-12-31`` as a date; a setting that expects a string gets its ISO text."""
    from podracer_hpc.config import load_config

    cfg = load_config(
        "jobs/trading_quickstart.yaml", ["env.trading.end=2012-12-31", "env.trading.start=2010-03-01 09:30:00"]
    )
    assert cfg.env.trading.end == "2012-12-31" and cfg.env.trading.start == "2010-03-01T09:30:00"
    assert parse_time(cfg.env.trading.start) == parse_time("2010-03-01 09:30")
    from podracer_hpc.cli import main

    assert main(["config", "jobs/trading_quickstart.yaml", "--set", "env.trading.end=2012-12-31"]) == 0
    assert "end: '2012-12-31'" in capsys.readouterr().out
