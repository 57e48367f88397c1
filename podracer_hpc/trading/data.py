"""Market data: long-format bars (CSV, Parquet, HDF5) aligned into ``(time, stocks)`` tensors.

Input: one row per bar, the common long format

    date|timestamp|datetime, ticker|tic|symbol, open, high, low, close, volume

(column names are case-insensitive; other columns are ignored). Times are ISO 8601
(``2020-05-01``, ``2020-05-01 09:30``, ``2020-05-01T09:30:00Z``) or ``YYYYMMDD``; a time with a
UTC offset is converted to UTC and stored without a zone. A bad file is rejected with a
:class:`DataError` naming the file and the line (CSV) or row (Parquet/HDF5): missing column,
unparsable number or time, non-finite or non-positive price, negative volume, ``low > high``,
a duplicate (time, ticker) bar.

Alignment policy (applied in this order, every step reported in ``MarketData.notes``):

1. Rows outside ``[start, end]`` are dropped; with ``tickers`` only those are kept (an unknown
   ticker is an error).
2. The calendar is the union of all bar times. A time at which fewer than
   ``min_date_coverage`` (default 0.5) of the tickers listed then (between their first and
   last bar) have a bar is dropped as a stray bar (a holiday print, a bad tick).
3. A ticker with bars on fewer than ``min_coverage`` (default 0.9) of the calendar's times is
   dropped (a late listing, a delisting, a sparse history).
4. The calendar is trimmed to the span where every kept ticker has started and not yet ended
   (the latest first bar to the earliest last bar): nothing is ever back-filled.
5. Inside that span a missing bar is forward-filled from the ticker's previous bar as a flat
   bar (open = high = low = close = the previous close, volume = 0) and marked ``valid=False``.

Parquet needs ``pyarrow`` and HDF5 needs ``h5py``; each is imported only when such a file is
read, and a missing one is reported with what to install. An HDF5 file holds one 1-D dataset
per column (the column names above) at its root or under the group ``key``.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

FIELDS = ("open", "high", "low", "close", "volume")
TIME_ALIASES = ("date", "timestamp", "datetime", "time")
TICKER_ALIASES = ("ticker", "tic", "symbol")
_EPOCH = datetime(1970, 1, 1)


class DataError(ValueError):
    """A market data file is malformed or the alignment leaves nothing; the message says where."""


# --------------------------------------------------------------------------------------
# The aligned market
# --------------------------------------------------------------------------------------
@dataclasses.dataclass
class MarketData:
    """Bars of ``S`` stocks on a common calendar of ``T`` times (all tensors ``[T, S]``, float64, CPU)."""

    dates: np.ndarray  # datetime64[s], [T], increasing
    tickers: list[str]
    open: torch.Tensor
    high: torch.Tensor
    low: torch.Tensor
    close: torch.Tensor
    volume: torch.Tensor
    valid: torch.Tensor  # bool [T, S]: a real bar (False: forward-filled)
    notes: list[str] = dataclasses.field(default_factory=list)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def num_days(self) -> int:
        return int(self.close.shape[0])

    @property
    def num_stocks(self) -> int:
        return int(self.close.shape[1])

    def index_at_or_after(self, when: str | np.datetime64) -> int:
        """Index of the first time >= ``when`` (``num_days`` if none)."""
        return int(np.searchsorted(self.dates, to_datetime64(when), side="left"))

    def index_at_or_before(self, when: str | np.datetime64) -> int:
        """Index of the last time <= ``when`` (-1 if none). A bare date means that whole day."""
        t = to_datetime64(when)
        if isinstance(when, str) and len(when.strip()) <= 10:  # a date: include its intraday bars
            t = t + np.timedelta64(86399, "s")
        return int(np.searchsorted(self.dates, t, side="right")) - 1

    def date_strings(self) -> list[str]:
        """Times as text: dates only when every time is midnight (daily bars)."""
        if is_daily(self.dates):
            return [str(d) for d in self.dates.astype("datetime64[D]")]
        return [str(d).replace("T", " ") for d in self.dates]

    def fingerprint(self) -> int:
        """A 63-bit digest of the calendar, tickers and prices (identifies the data in a checkpoint)."""
        h = hashlib.sha256()
        h.update(self.dates.astype("datetime64[s]").astype(np.int64).tobytes())
        h.update("\0".join(self.tickers).encode())
        for x in (self.open, self.high, self.low, self.close, self.volume):
            h.update(x.to(torch.float64).contiguous().numpy().tobytes())
        return int.from_bytes(h.digest()[:8], "little") & ((1 << 63) - 1)

    def select(self, tickers: Sequence[str]) -> "MarketData":
        """The same calendar with only ``tickers`` (in that order)."""
        missing = [t for t in tickers if t not in self.tickers]
        if missing:
            raise DataError(f"tickers not in the data: {', '.join(missing)} (it has {', '.join(self.tickers)})")
        idx = torch.tensor([self.tickers.index(t) for t in tickers], dtype=torch.int64)
        return dataclasses.replace(
            self, tickers=list(tickers), notes=list(self.notes), meta=dict(self.meta),
            **{f: getattr(self, f)[:, idx].clone() for f in (*FIELDS, "valid")},
        )

    def slice(self, lo: int, hi: int) -> "MarketData":
        """Rows ``lo..hi-1`` of the calendar."""
        return dataclasses.replace(
            self, dates=self.dates[lo:hi].copy(), notes=list(self.notes), meta=dict(self.meta),
            **{f: getattr(self, f)[lo:hi].clone() for f in (*FIELDS, "valid")},
        )

    def to_csv(self, path: str | os.PathLike, only_valid: bool = True) -> None:
        """Write the long format (one row per real bar; forward-filled bars too with only_valid=False)."""
        dates = self.date_strings()
        cols = [getattr(self, f).numpy() for f in FIELDS]
        valid = self.valid.numpy()
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["date", "ticker", *FIELDS])
            for t in range(self.num_days):
                for s, tic in enumerate(self.tickers):
                    if only_valid and not valid[t, s]:
                        continue
                    w.writerow([dates[t], tic, *(repr(float(c[t, s])) for c in cols)])


# --------------------------------------------------------------------------------------
# Times
# --------------------------------------------------------------------------------------
def _parse_time_cached(cache: dict[str, int], text: str, where: str, hint: str = "") -> int:
    """:func:`parse_time` memoized per file (each time repeats once per ticker); a bad time raises
    DataError naming ``where``."""
    t = cache.get(text)
    if t is None:
        try:
            t = cache[text] = parse_time(text)
        except ValueError:
            raise DataError(f"{where}: time {text!r} is not a date{hint}") from None
    return t


def parse_time(text: str) -> int:
    """Seconds since 1970-01-01 (UTC for zoned times) of an ISO 8601 or YYYYMMDD time."""
    s = text.strip()
    if len(s) == 8 and s.isdigit():
        s = f"{s[:4]}-{s[4:6]}-{s[6:]}"
    dt = datetime.fromisoformat(s)  # raises ValueError on garbage
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return int((dt - _EPOCH).total_seconds())


def to_datetime64(when: str | np.datetime64 | datetime) -> np.datetime64:
    if isinstance(when, np.datetime64):
        return when.astype("datetime64[s]")
    if isinstance(when, datetime):
        return np.datetime64(parse_time(when.isoformat()), "s")
    try:
        return np.datetime64(parse_time(str(when)), "s")
    except ValueError:
        raise DataError(f"not a date or time: {when!r} (use e.g. 2020-05-01 or 2020-05-01 09:30)") from None


def is_daily(dates: np.ndarray) -> bool:
    secs = dates.astype("datetime64[s]").astype(np.int64)
    return bool(len(secs)) and bool((secs % 86400 == 0).all())


# --------------------------------------------------------------------------------------
# Reading the long format
# --------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Rows:
    """Columns of a long-format file: times [M] int64 seconds, tickers [M] str, values [M, 5]."""

    times: np.ndarray
    tickers: np.ndarray
    values: np.ndarray
    lines: np.ndarray  # [M] int64: the line (CSV) or row (Parquet, HDF5) of each bar, for messages
    unit: str  # "line" or "row"
    source: str

    def where(self, i: int) -> str:
        return f"{self.unit} {int(self.lines[i])}"


def _find_columns(header: Sequence[str], source: str, where: str) -> tuple[int, int, list[int]]:
    names = [str(h).strip().lower() for h in header]

    def find(aliases: Iterable[str], what: str) -> int:
        for a in aliases:
            if a in names:
                return names.index(a)
        raise DataError(
            f"{source}: {where}: no {what} column (expected one of {', '.join(aliases)}); "
            f"the header is {', '.join(map(str, header))}"
        )

    ti = find(TIME_ALIASES, "time")
    ki = find(TICKER_ALIASES, "ticker")
    fi = [find((f,), f) for f in FIELDS]
    return ti, ki, fi


def _check_bar(v: Sequence[float], source: str, where: str) -> None:
    o, h, lo, c, vol = v
    for name, x in zip(FIELDS, v):
        if not math.isfinite(x):
            raise DataError(f"{source}: {where}: {name} is {x}, not a finite number")
    for name, x in zip(FIELDS[:4], (o, h, lo, c)):
        if x <= 0:
            raise DataError(f"{source}: {where}: {name} must be > 0, got {x}")
    if vol < 0:
        raise DataError(f"{source}: {where}: volume must be >= 0, got {vol}")
    if lo > h:
        raise DataError(f"{source}: {where}: low {lo} is above high {h}")


def _read_csv(path: Path) -> _Rows:
    source = str(path)
    opener = gzip.open if path.suffix == ".gz" else open
    times: list[int] = []
    tickers: list[str] = []
    values: list[list[float]] = []
    lines: list[int] = []
    cache: dict[str, int] = {}
    try:
        with opener(path, "rt", newline="") as f:  # type: ignore[operator]
            reader = csv.reader(f)
            header = None
            for row in reader:
                if row and any(c.strip() for c in row):
                    header = row
                    break
            if header is None:
                raise DataError(f"{source}: the file is empty (expected a header line)")
            ti, ki, fi = _find_columns(header, source, f"line {reader.line_num}")
            width = len(header)
            for row in reader:
                line = reader.line_num
                if not row or not any(c.strip() for c in row):
                    continue
                if len(row) != width:
                    raise DataError(f"{source}: line {line}: {len(row)} fields, the header has {width}")
                ts = row[ti]
                t = _parse_time_cached(cache, ts, f"{source}: line {line}", " (e.g. 2020-05-01 09:30)")
                tic = row[ki].strip()
                if not tic:
                    raise DataError(f"{source}: line {line}: empty ticker")
                try:
                    v = [float(row[i]) for i in fi]
                except ValueError:
                    bad = next(FIELDS[j] for j, i in enumerate(fi) if not _is_float(row[i]))
                    raise DataError(f"{source}: line {line}: {bad} {row[fi[FIELDS.index(bad)]]!r} is not a number") from None
                _check_bar(v, source, f"line {line}")
                times.append(t)
                tickers.append(tic)
                values.append(v)
                lines.append(line)
    except (UnicodeDecodeError, csv.Error, gzip.BadGzipFile, EOFError) as e:
        raise DataError(f"{source}: not a readable CSV file ({e})") from None
    return _Rows(np.asarray(times, dtype=np.int64), np.asarray(tickers, dtype=object),
                 np.asarray(values, dtype=np.float64).reshape(-1, 5), np.asarray(lines, dtype=np.int64), "line", source)


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _columns_to_rows(cols: dict[str, Any], source: str, unit: str) -> _Rows:
    """Validate columns read from Parquet or HDF5 (times as datetime64, numbers or text)."""
    ti, ki, fi = _find_columns(list(cols), source, "columns")
    names = list(cols)
    raw_t = np.asarray(cols[names[ti]])
    n = len(raw_t)

    def where(i: int) -> str:
        return f"{unit} {i + 1}"

    if np.issubdtype(raw_t.dtype, np.datetime64):
        times = raw_t.astype("datetime64[s]").astype(np.int64)
        bad = np.isnat(raw_t)
        if bad.any():
            raise DataError(f"{source}: {where(int(np.argmax(bad)))}: missing time")
    else:
        times = np.empty(n, dtype=np.int64)
        cache: dict[str, int] = {}
        for i, x in enumerate(raw_t):
            s = x.decode() if isinstance(x, bytes) else str(x)
            times[i] = _parse_time_cached(cache, s, f"{source}: {where(i)}")
    tick = np.array([x.decode() if isinstance(x, bytes) else str(x) for x in cols[names[ki]]], dtype=object)
    values = np.empty((n, 5), dtype=np.float64)
    for j, i in enumerate(fi):
        try:
            values[:, j] = np.asarray(cols[names[i]], dtype=np.float64)
        except (TypeError, ValueError):
            col = list(cols[names[i]])
            k = next(k for k, x in enumerate(col) if not _is_float(x.decode() if isinstance(x, bytes) else str(x)))
            raise DataError(f"{source}: {where(k)}: {FIELDS[j]} {col[k]!r} is not a number") from None
    # vectorized validity checks, then the first offending row is reported
    o, h, lo, c, vol = values.T
    bad = (~np.isfinite(values).all(1)) | (values[:, :4] <= 0).any(1) | (vol < 0) | (lo > h) | (tick == "")
    if bad.any():
        k = int(np.argmax(bad))
        if tick[k] == "":
            raise DataError(f"{source}: {where(k)}: empty ticker")
        _check_bar(values[k].tolist(), source, where(k))
    return _Rows(times, tick, values, np.arange(1, n + 1, dtype=np.int64), unit, source)


def _read_parquet(path: Path) -> _Rows:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            f"{path}: reading Parquet needs pyarrow, which is not installed "
            "(pip install pyarrow), or convert the file to CSV"
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises its own error types
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    return _columns_to_rows(cols, str(path), "row")


def _read_hdf5(path: Path, key: str = "") -> _Rows:
    try:
        import h5py
    except ImportError:
        raise DataError(f"{path}: reading HDF5 needs h5py (pip install h5py), or convert the file to CSV") from None
    try:
        with h5py.File(path, "r") as f:
            grp = f[key] if key else f
            cols = {name: grp[name][()] for name in grp if isinstance(grp[name], h5py.Dataset)}
    except (OSError, KeyError) as e:
        raise DataError(f"{path}: not a readable HDF5 market file ({e}); expected one 1-D dataset per column") from None
    for name, v in cols.items():
        if np.ndim(v) != 1:
            raise DataError(f"{path}: dataset {name!r} has shape {np.shape(v)}, expected one value per row")
    return _columns_to_rows(cols, str(path), "row")


def read_rows(path: str | os.PathLike, key: str = "") -> _Rows:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such market data file")
    name = p.name.lower()
    if name.endswith((".parquet", ".pq")):
        return _read_parquet(p)
    if name.endswith((".h5", ".hdf5", ".hdf")):
        return _read_hdf5(p, key)
    if name.endswith((".csv", ".csv.gz", ".txt")):
        return _read_csv(p)
    raise DataError(f"{p}: unknown file type; use .csv, .csv.gz, .parquet or .h5/.hdf5")


# --------------------------------------------------------------------------------------
# Alignment
# --------------------------------------------------------------------------------------
def align(rows: _Rows, tickers: Sequence[str] | None = None, start: str | None = None, end: str | None = None,
          min_coverage: float = 0.9, min_date_coverage: float = 0.5) -> MarketData:
    """Apply the module's alignment policy to validated rows."""
    src = rows.source
    notes: list[str] = []
    times, tick, values = rows.times, rows.tickers, rows.values
    if len(times) == 0:
        raise DataError(f"{src}: no bars")
    keep = np.ones(len(times), dtype=bool)
    if start:
        keep &= times >= to_datetime64(start).astype(np.int64)
    if end:
        e = to_datetime64(end).astype(np.int64) + (86399 if len(str(end).strip()) <= 10 else 0)
        keep &= times <= e
    names = sorted(set(tick.tolist()))
    if tickers:
        missing = [t for t in tickers if t not in names]
        if missing:
            raise DataError(f"{src}: tickers not in the file: {', '.join(missing)} (it has {', '.join(names[:20])}"
                            f"{', ...' if len(names) > 20 else ''})")
        keep &= np.isin(tick, list(tickers))
        names = list(tickers)
    times, tick, values = times[keep], tick[keep], values[keep]
    lines = rows.lines[keep]

    def where(i: int) -> str:
        return f"{rows.unit} {int(lines[i])}"

    if len(times) == 0:
        raise DataError(f"{src}: no bars between {start or 'the start'} and {end or 'the end'}")
    names = [n for n in names if n in set(tick.tolist())] if not tickers else names
    col = {n: i for i, n in enumerate(names)}
    sidx = np.array([col[t] for t in tick], dtype=np.int64)
    cal, tidx = np.unique(times, return_inverse=True)
    # duplicates: the same (time, ticker) twice
    key = tidx * len(names) + sidx
    order = np.argsort(key, kind="stable")
    dup = np.nonzero(key[order][1:] == key[order][:-1])[0]
    if len(dup):
        a, b = order[dup[0]], order[dup[0] + 1]
        raise DataError(f"{src}: {where(b)}: a second bar for {tick[b]} at {np.datetime64(int(times[b]), 's')} "
                        f"(the first is at {where(a)})")
    T, S = len(cal), len(names)
    present = np.zeros((T, S), dtype=bool)
    present[tidx, sidx] = True
    vals = np.full((T, S, 5), np.nan)
    vals[tidx, sidx] = values

    # 2. stray times
    listed = (np.maximum.accumulate(present, axis=0) & np.maximum.accumulate(present[::-1], axis=0)[::-1])
    stray = present.sum(1) < min_date_coverage * listed.sum(1)
    if stray.any():
        notes.append(f"dropped {int(stray.sum())} of {T} times with bars for fewer than "
                     f"{min_date_coverage:.0%} of the tickers listed then (first {np.datetime64(int(cal[stray][0]), 's')})")
        cal, present, vals = cal[~stray], present[~stray], vals[~stray]
    if len(cal) == 0:
        raise DataError(f"{src}: no time has bars for {min_date_coverage:.0%} of the tickers")
    # 3. sparse tickers
    cover = present.mean(0)
    sparse = (cover < min_coverage) | (cover == 0)
    if sparse.all():
        raise DataError(f"{src}: every ticker has bars on fewer than {min_coverage:.0%} of the times "
                        f"(best: {names[int(np.argmax(cover))]} with {cover.max():.0%}); lower min_coverage")
    if sparse.any():
        if tickers:
            bad = [f"{names[i]} ({cover[i]:.0%})" for i in np.nonzero(sparse)[0]]
            raise DataError(f"{src}: requested tickers with bars on fewer than {min_coverage:.0%} of the times: "
                            f"{', '.join(bad)}; drop them or lower min_coverage")
        notes.append("dropped tickers with bars on fewer than {:.0%} of the times: {}".format(
            min_coverage, ", ".join(f"{names[i]} ({cover[i]:.0%})" for i in np.nonzero(sparse)[0])))
        keep_s = ~sparse
        names = [n for n, k in zip(names, keep_s) if k]
        present, vals = present[:, keep_s], vals[:, keep_s]
        S = len(names)
    # 4. common span
    T = len(cal)
    has = present.any(1)
    first = present.argmax(0)
    last = T - 1 - present[::-1].argmax(0)
    lo, hi = int(first.max()), int(last.min())
    if lo > hi:
        raise DataError(f"{src}: the tickers' histories do not overlap ({names[int(first.argmax())]} starts at "
                        f"{np.datetime64(int(cal[lo]), 's')}, {names[int(last.argmin())]} ends at "
                        f"{np.datetime64(int(cal[hi]), 's')})")
    if lo > 0 or hi < T - 1:
        notes.append(f"trimmed to the common span {np.datetime64(int(cal[lo]), 's')} .. "
                     f"{np.datetime64(int(cal[hi]), 's')} ({lo} leading, {T - 1 - hi} trailing times dropped)")
    del has
    # 5. forward fill (from any earlier bar of the ticker, even before lo)
    idx = np.where(present, np.arange(T)[:, None], -1)
    idx = np.maximum.accumulate(idx, axis=0).clip(min=0)  # rows before a first bar lie before lo
    cols = np.arange(S)[None, :]
    close_ff = vals[idx, cols, 3]
    filled = vals.copy()
    miss = ~present
    for j in range(4):
        filled[..., j] = np.where(miss, close_ff, vals[..., j])
    filled[..., 4] = np.where(miss, 0.0, vals[..., 4])
    filled, present, cal = filled[lo:hi + 1], present[lo:hi + 1], cal[lo:hi + 1]
    nfill = (~present).sum(0)
    if nfill.any():
        worst = int(np.argmax(nfill))
        notes.append(f"forward-filled {int(nfill.sum())} missing bars in {int((nfill > 0).sum())} tickers "
                     f"(most: {names[worst]}, {int(nfill[worst])})")
    if len(cal) < 2:
        raise DataError(f"{src}: fewer than 2 aligned times remain after the alignment ({'; '.join(notes)})")
    t = torch.from_numpy(np.ascontiguousarray(filled))
    return MarketData(
        dates=cal.astype("datetime64[s]"), tickers=list(names),
        **{f: t[..., j].contiguous() for j, f in enumerate(FIELDS)},
        valid=torch.from_numpy(present.copy()), notes=notes, meta={"source": src},
    )


def load_market(path: str | os.PathLike, tickers: Sequence[str] | None = None, start: str | None = None,
                end: str | None = None, min_coverage: float = 0.9, min_date_coverage: float = 0.5,
                key: str = "") -> MarketData:
    """Read a long-format file and align it (see the module docstring for the policy)."""
    return align(read_rows(path, key), tickers or None, start, end, min_coverage, min_date_coverage)


def from_arrays(close: Any, *, open: Any = None, high: Any = None, low: Any = None, volume: Any = None,
                dates: Any = None, tickers: Sequence[str] | None = None) -> MarketData:
    """A complete market from ``[T, S]`` arrays (copied; high/low/open default to close, volume to 0)."""
    c = torch.tensor(np.asarray(close, dtype=np.float64))
    if c.ndim != 2:
        raise DataError(f"close must be [time, stocks], got shape {tuple(c.shape)}")
    T, S = c.shape

    def get(x: Any, default: torch.Tensor) -> torch.Tensor:
        return default.clone() if x is None else torch.tensor(np.asarray(x, dtype=np.float64)).reshape(T, S)

    if dates is None:
        dates = np.datetime64("2000-01-03") + np.arange(T)
    return MarketData(
        dates=np.asarray(dates).astype("datetime64[s]"),
        tickers=list(tickers) if tickers else [f"S{i:03d}" for i in range(S)],
        open=get(open, c), high=get(high, c), low=get(low, c), close=c.clone(),
        volume=get(volume, torch.zeros(T, S, dtype=torch.float64)),
        valid=torch.ones(T, S, dtype=torch.bool),
    )


__all__ = ["DataError", "MarketData", "load_market", "align", "read_rows", "from_arrays", "parse_time",
           "to_datetime64", "is_daily", "FIELDS"]
