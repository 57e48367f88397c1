"""Market data: bars from CSV, Parquet or HDF5 files, long or wide, aligned into ``(time, stocks)`` tensors.

**Long format**, one row per bar (the common one):

    date|timestamp|datetime|time, ticker|tic|symbol, open, high, low, close, volume

**Wide format**, one row per time: a time column and one column of closing prices per ticker
(``date, AAPL, MSFT, ...``; what most price downloads and data packages ship). A file is wide
when it has a time column, no ticker column and none of the columns open/high/low/close/volume.
A wide file holds closes only, so its bars are flat: ``open = high = low = close``, volume 0 (the
range-based indicators then see no intrabar range: ``dx`` works from close-to-close moves, and
``cci``'s typical price is the close). An empty cell (or ``nan``) is a missing bar.

Column names are case-insensitive; other columns of a long file are ignored. Times are ISO 8601
(``2020-05-01``, ``2020-05-01 09:30``, ``2020-05-01T09:30:00Z``) or ``YYYYMMDD``; a time with a UTC
offset is converted to UTC and stored without a zone. A bad file is rejected with a
:class:`DataError` naming the file and the line (CSV) or row (Parquet/HDF5): missing column,
unparsable number or time, non-finite or non-positive price, negative volume, ``low > high``,
a duplicate (time, ticker) bar.

**Reading** is vectorized: CSV by pyarrow's multi-threaded reader (times and tickers
dictionary-encoded, so each distinct time string is parsed once), Parquet by pyarrow, HDF5 through
:mod:`podracer_hpc.files.h5arrays` (one 1-D dataset per column, at the root or under the group ``key``).
When pyarrow refuses a CSV file, the line-by-line reader of the standard library reads it again
and names the first bad line (or reads it, if only pyarrow minded: ``1_000`` is a number to Python).
A path ``pkg:PACKAGE/path/in/package`` names a data file shipped inside an installed package (see
:func:`resolve_data_path`). The readers are trading/readers.py, names and times trading/fields.py.

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
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import os
from typing import Any, Sequence

import numpy as np
import torch

from podracer_hpc.trading.fields import (
    FIELDS,
    DataError,
    is_daily,
    parse_time,
    resolve_data_path,
    to_datetime64,
)
from podracer_hpc.trading.readers import Rows, read_rows


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
            self,
            tickers=list(tickers),
            notes=list(self.notes),
            meta=dict(self.meta),
            **{f: getattr(self, f)[:, idx].clone() for f in (*FIELDS, "valid")},
        )

    def slice(self, lo: int, hi: int) -> "MarketData":
        """Rows ``lo..hi-1`` of the calendar."""
        return dataclasses.replace(
            self,
            dates=self.dates[lo:hi].copy(),
            notes=list(self.notes),
            meta=dict(self.meta),
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
# Alignment
# --------------------------------------------------------------------------------------
def align(
    rows: Rows,
    tickers: Sequence[str] | None = None,
    start: str | None = None,
    end: str | None = None,
    min_coverage: float = 0.9,
    min_date_coverage: float = 0.5,
) -> MarketData:
    """Apply the module's alignment policy to validated rows (vectorized: no loop over rows or tickers)."""
    src = rows.source
    notes: list[str] = []
    if len(rows) == 0:
        raise DataError(f"{src}: no bars")
    tvals = rows.time_values
    keep_t = np.ones(len(tvals), dtype=bool)
    if start:
        keep_t &= tvals >= to_datetime64(start).astype(np.int64)
    if end:
        e = to_datetime64(end).astype(np.int64) + (86399 if len(str(end).strip()) <= 10 else 0)
        keep_t &= tvals <= e
    all_names = rows.tick_names
    if tickers:
        index = {n: i for i, n in enumerate(all_names)}
        missing = [t for t in tickers if t not in index]
        if missing:
            names_sorted = sorted(all_names)
            raise DataError(
                f"{src}: tickers not in the file: {', '.join(missing)} (it has {', '.join(names_sorted[:20])}"
                f"{', ...' if len(names_sorted) > 20 else ''})"
            )
        new_code = np.full(len(all_names), -1, dtype=np.int64)
        new_code[[index[t] for t in tickers]] = np.arange(len(tickers))
    else:
        new_code = np.arange(len(all_names), dtype=np.int64)
    keep = keep_t[rows.time_codes] & (new_code[rows.tick_codes] >= 0)
    idx = None if keep.all() else np.flatnonzero(keep)

    def sel(a: np.ndarray) -> np.ndarray:
        return a if idx is None else a[idx]

    def where(i: int) -> str:
        return rows.where(i if idx is None else int(idx[i]))

    tcodes, kcodes = sel(rows.time_codes), new_code[sel(rows.tick_codes)]
    if len(tcodes) == 0:
        raise DataError(f"{src}: no bars between {start or 'the start'} and {end or 'the end'}")
    if tickers:
        names = list(tickers)
    else:  # the tickers with a bar in [start, end], in name order (the reader's names are sorted)
        used = np.bincount(kcodes, minlength=len(all_names)) > 0
        names = [n for n, u in zip(all_names, used) if u]
        renum = np.cumsum(used) - 1
        kcodes = renum[kcodes]
    used_t = np.bincount(tcodes, minlength=len(tvals)) > 0
    cal = np.unique(tvals[used_t])
    tidx = np.searchsorted(cal, tvals)[tcodes]  # two spellings of one time share its calendar row
    T, S = len(cal), len(names)
    key = tidx * S + kcodes
    counts = np.bincount(key, minlength=T * S)
    if (counts > 1).any():  # the same (time, ticker) twice: report the first such pair, in (time, ticker) order
        k0 = int(np.argmax(counts > 1))
        a, b = np.flatnonzero(key == k0)[:2]
        raise DataError(
            f"{src}: {where(b)}: a second bar for {names[k0 % S]} at {np.datetime64(int(cal[k0 // S]), 's')} "
            f"(the first is at {where(a)})"
        )
    present = (counts > 0).reshape(T, S)
    del counts
    grids = []
    for v in rows.values:
        g = np.full(T * S, np.nan)
        g[key] = sel(v)
        grids.append(g.reshape(T, S))
    del key, tidx, tcodes, kcodes

    # 2. stray times
    listed = np.maximum.accumulate(present, axis=0) & np.maximum.accumulate(present[::-1], axis=0)[::-1]
    stray = present.sum(1) < min_date_coverage * listed.sum(1)
    del listed
    if stray.any():
        notes.append(
            f"dropped {int(stray.sum())} of {T} times with bars for fewer than "
            f"{min_date_coverage:.0%} of the tickers listed then (first {np.datetime64(int(cal[stray][0]), 's')})"
        )
        cal, present = cal[~stray], present[~stray]
        grids = [g[~stray] for g in grids]
    if len(cal) == 0:
        raise DataError(f"{src}: no time has bars for {min_date_coverage:.0%} of the tickers")
    # 3. sparse tickers
    cover = present.mean(0)
    sparse = (cover < min_coverage) | (cover == 0)
    if sparse.all():
        raise DataError(
            f"{src}: every ticker has bars on fewer than {min_coverage:.0%} of the times "
            f"(best: {names[int(np.argmax(cover))]} with {cover.max():.0%}); lower min_coverage"
        )
    if sparse.any():
        if tickers:
            bad = [f"{names[i]} ({cover[i]:.0%})" for i in np.nonzero(sparse)[0]]
            raise DataError(
                f"{src}: requested tickers with bars on fewer than {min_coverage:.0%} of the times: "
                f"{', '.join(bad)}; drop them or lower min_coverage"
            )
        notes.append(
            "dropped tickers with bars on fewer than {:.0%} of the times: {}".format(
                min_coverage, ", ".join(f"{names[i]} ({cover[i]:.0%})" for i in np.nonzero(sparse)[0])
            )
        )
        keep_s = ~sparse
        names = [n for n, k in zip(names, keep_s) if k]
        present = present[:, keep_s]
        grids = [g[:, keep_s] for g in grids]
        S = len(names)
    # 4. common span
    T = len(cal)
    first = present.argmax(0)
    last = T - 1 - present[::-1].argmax(0)
    lo, hi = int(first.max()), int(last.min())
    if lo > hi:
        raise DataError(
            f"{src}: the tickers' histories do not overlap ({names[int(first.argmax())]} starts at "
            f"{np.datetime64(int(cal[lo]), 's')}, {names[int(last.argmin())]} ends at "
            f"{np.datetime64(int(cal[hi]), 's')})"
        )
    if lo > 0 or hi < T - 1:
        notes.append(
            f"trimmed to the common span {np.datetime64(int(cal[lo]), 's')} .. "
            f"{np.datetime64(int(cal[hi]), 's')} ({lo} leading, {T - 1 - hi} trailing times dropped)"
        )
    # 5. forward fill (from any earlier bar of the ticker, even before lo)
    ffi = np.where(present, np.arange(T)[:, None], -1)
    np.maximum.accumulate(ffi, axis=0, out=ffi)
    ffi = ffi[lo : hi + 1].clip(min=0)  # rows before a first bar lie before lo
    close_ff = np.take_along_axis(grids[3], ffi, axis=0)
    del ffi
    miss = ~present[lo : hi + 1]
    fields = []
    for j, g in enumerate(grids):
        g = g[lo : hi + 1]
        fields.append(np.where(miss, 0.0 if j == 4 else close_ff, g))
    del grids, close_ff
    present, cal = present[lo : hi + 1], cal[lo : hi + 1]
    nfill = miss.sum(0)
    if nfill.any():
        worst = int(np.argmax(nfill))
        notes.append(
            f"forward-filled {int(nfill.sum())} missing bars in {int((nfill > 0).sum())} tickers "
            f"(most: {names[worst]}, {int(nfill[worst])})"
        )
    if len(cal) < 2:
        raise DataError(f"{src}: fewer than 2 aligned times remain after the alignment ({'; '.join(notes)})")
    return MarketData(
        dates=cal.astype("datetime64[s]"),
        tickers=list(names),
        **{f: torch.from_numpy(np.ascontiguousarray(x)) for f, x in zip(FIELDS, fields)},
        valid=torch.from_numpy(np.ascontiguousarray(present)),
        notes=notes,
        meta={"source": src},
    )


def load_market(
    path: str | os.PathLike,
    tickers: Sequence[str] | None = None,
    start: str | None = None,
    end: str | None = None,
    min_coverage: float = 0.9,
    min_date_coverage: float = 0.5,
    key: str = "",
) -> MarketData:
    """Read a long- or wide-format file and align it (see the module docstring for the policy).

    This parses the file every time; a pod or a backtest opens the prepared-market cache instead
    (:func:`podracer_hpc.trading.cache.open_market`), which calls this once per data file."""
    return align(read_rows(path, key), tickers or None, start, end, min_coverage, min_date_coverage)


def from_arrays(
    close: Any,
    *,
    open: Any = None,
    high: Any = None,
    low: Any = None,
    volume: Any = None,
    dates: Any = None,
    tickers: Sequence[str] | None = None,
) -> MarketData:
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
        open=get(open, c),
        high=get(high, c),
        low=get(low, c),
        close=c.clone(),
        volume=get(volume, torch.zeros(T, S, dtype=torch.float64)),
        valid=torch.ones(T, S, dtype=torch.bool),
    )


__all__ = [
    "DataError",
    "MarketData",
    "load_market",
    "align",
    "read_rows",
    "from_arrays",
    "parse_time",
    "resolve_data_path",
    "to_datetime64",
    "is_daily",
    "FIELDS",
]
