"""Reading market data files into validated rows: CSV (pyarrow, the standard library's reader to
name a bad line), Parquet, HDF5 (named arrays); long or wide layouts (trading/data.py's doc)."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from podracer_hpc.trading.fields import (
    FIELDS,
    TICKER_ALIASES,
    TIME_ALIASES,
    DataError,
    MarketSource,
    market_source,
    parse_time,
    parse_time_cached,
)


# --------------------------------------------------------------------------------------
# Reading: columns -> validated rows
# --------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Layout:
    """Which columns of a header hold what: long (time, ticker, OHLCV) or wide (time, one close per ticker)."""

    wide: bool
    time: int
    ticker: int  # -1 when wide
    fields: list[int]  # long: the columns of FIELDS
    tickers: list[int]  # wide: the ticker columns
    names: list[str]  # the header, stripped


def _layout(header: Sequence[Any], source: str, where: str) -> _Layout:
    names = [str(h).strip().lstrip("\ufeff") for h in header]
    low = [n.lower() for n in names]

    def find(aliases: Iterable[str], what: str) -> int:
        for a in aliases:
            if a in low:
                return low.index(a)
        raise DataError(
            f"{source}: {where}: no {what} column (expected one of {', '.join(aliases)}); "
            f"the header is {', '.join(map(str, header))}"
        )

    ti = find(TIME_ALIASES, "time")
    if any(a in low for a in (*TICKER_ALIASES, *FIELDS)):  # long; a missing column is an error
        ki = find(TICKER_ALIASES, "ticker")
        return _Layout(False, ti, ki, [find((f,), f) for f in FIELDS], [], names)
    cols = [i for i in range(len(names)) if i != ti]
    if not cols:
        raise DataError(
            f"{source}: {where}: only a time column; a wide file has one column of closes per ticker "
            f"after it, a long file has ticker, open, high, low, close, volume"
        )
    for i in cols:
        if not names[i]:
            raise DataError(
                f"{source}: {where}: column {i + 1} has no name (in a wide file every column after "
                "the time is a ticker's closes)"
            )
    seen: dict[str, int] = {}
    for i in cols:
        if names[i] in seen:
            raise DataError(f"{source}: {where}: ticker {names[i]} has two columns ({seen[names[i]] + 1} and {i + 1})")
        seen[names[i]] = i
    return _Layout(True, ti, -1, [], cols, names)


@dataclasses.dataclass
class Rows:
    """Validated bars of one file: bar ``i`` is at time ``time_values[time_codes[i]]`` (seconds), of
    ticker ``tick_names[tick_codes[i]]``, with ``values[j][i]`` for ``FIELDS[j]``."""

    time_codes: np.ndarray  # [M] int64
    time_values: np.ndarray  # [U] int64 seconds since 1970 (UTC)
    tick_codes: np.ndarray  # [M] int64
    tick_names: list[str]  # distinct
    values: list[np.ndarray]  # 5 x [M] float64
    source: str
    unit: str  # "line" or "row"
    line_of: Callable[[int], int]  # bar -> its line (CSV) or row (Parquet/HDF5), for messages
    wide: bool = False

    def __len__(self) -> int:
        return len(self.time_codes)

    def where(self, i: int) -> str:
        return f"{self.unit} {self.line_of(int(i))}"

    @property
    def times(self) -> np.ndarray:
        return self.time_values[self.time_codes]

    @property
    def tickers(self) -> np.ndarray:
        return np.asarray(self.tick_names, dtype=object)[self.tick_codes]


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _encode(col: Any) -> tuple[np.ndarray, list[Any]]:
    """(codes [M] int64, distinct values) of a column (pyarrow or numpy); a null has code -1."""
    if not isinstance(col, np.ndarray):  # pyarrow (Chunked)Array: hash-based, no sort of M values
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(col, pa.Array):
            col = pa.chunked_array([col])
        if not pa.types.is_dictionary(col.type):
            col = pc.dictionary_encode(col)
        col = col.unify_dictionaries()
        if col.num_chunks == 0:
            return np.zeros(0, dtype=np.int64), []
        uniq = col.chunk(0).dictionary.to_pylist()
        codes = np.concatenate(
            [pc.fill_null(c.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64) for c in col.chunks]
        )
        return codes, uniq
    uniq, codes = np.unique(col, return_inverse=True)
    return codes.astype(np.int64).reshape(-1), list(uniq)


def _float_column(col: Any, name: str, source: str, where: Callable[[int], str]) -> np.ndarray:
    """A numeric column as float64 (a null is NaN here; the caller decides what a null means)."""
    if isinstance(col, np.ndarray):
        try:
            return np.asarray(col, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            vals = list(col)
    else:
        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            vals = col.to_pylist()
    k = next(k for k, x in enumerate(vals) if not _is_float(_text(x)))
    raise DataError(f"{source}: {where(k)}: {name} {vals[k]!r} is not a number") from None


def _is_null(col: Any) -> np.ndarray:
    if isinstance(col, np.ndarray):
        return np.zeros(len(col), dtype=bool) if col.dtype.kind != "O" else np.array([x is None for x in col])
    import pyarrow.compute as pc

    return pc.is_null(col).to_numpy(zero_copy_only=False)


def _time_column(col: Any, source: str, where: Callable[[int], str], hint: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes [M] int64, seconds [U] int64) of a time column: timestamps as they are (UTC), text
    parsed once per distinct value."""
    if not isinstance(col, np.ndarray):
        import pyarrow as pa
        import pyarrow.compute as pc

        typ = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        if pa.types.is_timestamp(typ) or pa.types.is_date(typ):
            col = pc.cast(pc.cast(col, pa.timestamp("s", getattr(typ, "tz", None))), pa.int64())
            codes, uniq = _encode(col)
            if (codes < 0).any():
                raise DataError(f"{source}: {where(int(np.argmax(codes < 0)))}: missing time")
            return codes, np.asarray(uniq, dtype=np.int64)
    elif np.issubdtype(col.dtype, np.datetime64):
        bad = np.isnat(col)
        if bad.any():
            raise DataError(f"{source}: {where(int(np.argmax(bad)))}: missing time")
        codes, uniq = _encode(col.astype("datetime64[s]").astype(np.int64))
        return codes, np.asarray(uniq, dtype=np.int64)
    codes, uniq = _encode(col)
    secs = np.zeros(len(uniq) + 1, dtype=np.int64)  # the last entry stands for a null (code -1)
    ok = np.zeros(len(uniq) + 1, dtype=bool)
    fast = _iso_times(uniq)
    if fast is not None:  # plain ISO 8601 times: pyarrow parses them all at once (same values as parse_time)
        secs[:-1], ok[:-1] = fast, True
    else:
        for j, x in enumerate(uniq):
            if x is not None:
                try:
                    secs[j], ok[j] = parse_time(_text(x)), True
                except ValueError:
                    pass
    bad = ~ok[codes]
    if bad.any():
        k = int(np.argmax(bad))
        text = "" if codes[k] < 0 else _text(uniq[codes[k]])
        raise DataError(f"{source}: {where(k)}: time {text!r} is not a date{hint}")
    return codes, secs[:-1]


def _iso_times(texts: list[Any]) -> np.ndarray | None:
    """Seconds of times without a zone (``2020-05-01``, ``2020-05-01 09:30[:00]``, ``...T09:30``), by
    pyarrow's ISO 8601 parser; None when any is something else (zoned, ``YYYYMMDD``, not a time):
    then :func:`parse_time` reads them one by one."""
    if not texts or not all(isinstance(x, str) for x in texts):
        return None
    try:
        import pyarrow as pa
        import pyarrow.compute as pc

        return pc.cast(pc.cast(pa.array(texts, pa.string()), pa.timestamp("s")), pa.int64()).to_numpy()
    except Exception:  # ArrowInvalid and friends, or no pyarrow
        return None


def _ticker_column(col: Any, source: str, where: Callable[[int], str]) -> tuple[np.ndarray, list[str]]:
    """(codes [M] int64, distinct names) of a ticker column; names are stripped, an empty one is an error."""
    codes, uniq = _encode(col)
    names = [_text(x).strip() if x is not None else "" for x in uniq]
    distinct = sorted(set(names) - {""})
    index = {n: i for i, n in enumerate(distinct)}
    codes = np.array([index.get(n, -1) for n in names] + [-1], dtype=np.int64)[codes]  # a null (-1) -> -1
    if (codes < 0).any():
        raise DataError(f"{source}: {where(int(np.argmax(codes < 0)))}: empty ticker")
    return codes, distinct


def _columns_to_rows(
    cols: dict[str, Any], lay: _Layout, source: str, unit: str, line_of: Callable[[int], int], hint: str = ""
) -> Rows:
    """Validate the columns of a long or wide file (pyarrow or numpy columns, in ``lay.names`` order)."""
    names = list(cols)

    def where(i: int) -> str:
        return f"{unit} {line_of(int(i))}"

    def col(i: int) -> Any:
        return cols[names[i]]

    n = len(col(lay.time))
    if lay.wide:
        tcodes, tvals = _time_column(col(lay.time), source, where, hint)
        tickers = [lay.names[i] for i in lay.tickers]
        V = np.empty((n, len(tickers)), dtype=np.float64)
        for j, i in enumerate(lay.tickers):
            V[:, j] = _float_column(col(i), tickers[j], source, where)
        bad = np.isinf(V) | (V <= 0)
        if bad.any():
            r, s = np.unravel_index(int(np.argmax(bad)), V.shape)
            x = V[r, s]
            why = (
                f"is {x}, not a finite number"
                if np.isinf(x)
                else f"must be > 0, got {x} (leave the cell empty for a missing bar)"
            )
            raise DataError(f"{source}: {where(r)}: {tickers[s]} {why}")
        rr, cc = np.nonzero(~np.isnan(V))  # bar by bar, time-major
        close = V[rr, cc]
        order = sorted(range(len(tickers)), key=lambda j: tickers[j])
        rank = np.empty(len(tickers), dtype=np.int64)
        rank[order] = np.arange(len(tickers))
        rows_of = rr

        def bar_line(i: int) -> int:
            return line_of(int(rows_of[i]))

        return Rows(
            tcodes[rr],
            tvals,
            rank[cc],
            [tickers[j] for j in order],
            [close, close, close, close, np.zeros_like(close)],
            source,
            unit,
            bar_line,
            wide=True,
        )
    # long
    used = (lay.time, lay.ticker, *lay.fields)
    nulls = [_is_null(col(i)) for i in used]
    blank = np.logical_and.reduce(nulls)  # an all-blank row is skipped, as the line reader does
    if n and blank.any():
        kept = np.flatnonzero(~blank)
        cols = {names[i]: _take(col(i), kept) for i in used}
        names = list(cols)
        lay = _Layout(False, 0, 1, [2, 3, 4, 5, 6], [], [lay.names[i] for i in used])
        nulls = [nl[kept] for nl in nulls]
        file_line = line_of

        def line_of(i: int) -> int:
            return file_line(int(kept[i]))

    tcodes, tvals = _time_column(col(lay.time), source, where, hint)
    kcodes, tick_names = _ticker_column(col(lay.ticker), source, where)
    values = [_float_column(col(i), f, source, where) for f, i in zip(FIELDS, lay.fields)]
    # vectorized validity checks, then the first offending bar is reported
    o, h, lo, c, vol = values
    missing = np.logical_or.reduce(nulls[2:])
    bad = missing | ~np.isfinite(o) | ~np.isfinite(h) | ~np.isfinite(lo) | ~np.isfinite(c) | ~np.isfinite(vol)
    bad |= (o <= 0) | (h <= 0) | (lo <= 0) | (c <= 0) | (vol < 0) | (lo > h)
    if bad.any():
        k = int(np.argmax(bad))
        for f, nl in zip(FIELDS, nulls[2:]):
            if nl[k]:
                raise DataError(f"{source}: {where(k)}: {f} '' is not a number")
        _check_bar([float(v[k]) for v in values], source, where(k))
    return Rows(tcodes, tvals, kcodes, tick_names, values, source, unit, line_of)


def _take(col: Any, idx: np.ndarray) -> Any:
    if isinstance(col, np.ndarray):
        return col[idx]
    return col.take(idx)


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


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


# --------------------------------------------------------------------------------------
# CSV
# --------------------------------------------------------------------------------------
_CSV_HINT = " (e.g. 2020-05-01 09:30)"
_WIDE_MISSING = ("", "nan", "NaN", "NAN")


def _open_text(path: Path) -> Any:
    return gzip.open(path, "rt", newline="") if path.suffix == ".gz" else open(path, "r", newline="")


def _csv_header(path: Path) -> tuple[list[str], int]:
    """The first non-blank row of a CSV file and its line number."""
    source = str(path)
    try:
        with _open_text(path) as f:
            reader = csv.reader(f)
            for row in reader:
                if row and any(c.strip() for c in row):
                    return row, reader.line_num
    except (UnicodeDecodeError, csv.Error, gzip.BadGzipFile, EOFError, OSError) as e:
        raise DataError(f"{source}: not a readable CSV file ({e})") from None
    raise DataError(f"{source}: the file is empty (expected a header line)")


def _csv_line_of(path: Path, header_line: int) -> Callable[[int], int]:
    """Row -> line of a CSV file, as pyarrow counts rows (every non-empty line after the header is
    one); computed by a scan of the file, only when a message needs it."""

    def line_of(i: int) -> int:
        opener = gzip.open if path.suffix == ".gz" else open
        seen = -1
        with opener(path, "rb") as f:  # type: ignore[operator]
            for n, line in enumerate(f, 1):
                if n <= header_line or not line.strip(b"\r\n"):
                    continue
                seen += 1
                if seen == i:
                    return n
        return header_line + 1 + i

    return line_of


def _read_csv(path: Path) -> Rows:
    """A CSV file by pyarrow's reader (vectorized, multi-threaded); the line-by-line reader names
    the first bad line when pyarrow refuses it."""
    source = str(path)
    header, header_line = _csv_header(path)
    lay = _layout(header, source, f"line {header_line}")
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        return _read_csv_python(path)
    raw = [h.lstrip("\ufeff") if i == 0 else h for i, h in enumerate(header)]
    if len(set(raw)) != len(raw):
        return _read_csv_python(path)
    text = pa.dictionary(pa.int32(), pa.string())
    types = {raw[lay.time]: text}
    use = [lay.time]
    if lay.wide:
        use += lay.tickers
        types.update({raw[i]: pa.float64() for i in lay.tickers})
    else:
        use += [lay.ticker, *lay.fields]
        types[raw[lay.ticker]] = text
        types.update({raw[i]: pa.float64() for i in lay.fields})
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(use_threads=True, block_size=1 << 24),
            convert_options=pacsv.ConvertOptions(
                include_columns=[raw[i] for i in use],
                column_types=types,
                null_values=list(_WIDE_MISSING) if lay.wide else [""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
            ),
        )
    except (pa.ArrowException, OSError, UnicodeDecodeError, EOFError) as e:
        return _read_csv_python(path, _needle(str(e)))
    cols = {raw[i]: table.column(raw[i]) for i in sorted(use)}
    lay2 = _layout([raw[i] for i in sorted(use)], source, f"line {header_line}")
    return _columns_to_rows(cols, lay2, source, "line", _csv_line_of(path, header_line), _CSV_HINT)


def _needle(message: str) -> str | None:
    """The offending text in a pyarrow CSV error, if it quotes one (a value or a whole row)."""
    for mark, end in (("invalid value '", "'"), ("columns, got ", None)):
        i = message.find(mark)
        if i >= 0:
            rest = message[i + len(mark) :]
            if end is None:
                rest = rest.split(": ", 1)[1] if ": " in rest else ""
                return rest.strip() or None
            return rest[: rest.find(end)] or None
    return None


def _check_row(
    row: list[str], line: int, lay: _Layout, width: int, source: str, cache: dict[str, int]
) -> list[tuple[int, str, list[float]]]:
    """The bars of one CSV row (long: one; wide: one per non-empty cell), checked as the reader does."""
    if len(row) != width:
        raise DataError(f"{source}: line {line}: {len(row)} fields, the header has {width}")
    t = parse_time_cached(cache, row[lay.time], f"{source}: line {line}", _CSV_HINT)
    if lay.wide:
        out = []
        for i in lay.tickers:
            cell = row[i].strip()
            if cell in _WIDE_MISSING:
                continue
            try:
                x = float(cell)
            except ValueError:
                raise DataError(f"{source}: line {line}: {lay.names[i]} {row[i]!r} is not a number") from None
            if not math.isfinite(x):
                raise DataError(f"{source}: line {line}: {lay.names[i]} is {x}, not a finite number")
            if x <= 0:
                raise DataError(
                    f"{source}: line {line}: {lay.names[i]} must be > 0, got {x} "
                    "(leave the cell empty for a missing bar)"
                )
            out.append((t, lay.names[i], [x, x, x, x, 0.0]))
        return out
    tic = row[lay.ticker].strip()
    if not tic:
        raise DataError(f"{source}: line {line}: empty ticker")
    try:
        v = [float(row[i]) for i in lay.fields]
    except ValueError:
        bad = next(FIELDS[j] for j, i in enumerate(lay.fields) if not _is_float(row[i]))
        raise DataError(
            f"{source}: line {line}: {bad} {row[lay.fields[FIELDS.index(bad)]]!r} is not a number"
        ) from None
    _check_bar(v, source, f"line {line}")
    return [(t, tic, v)]


def _read_csv_python(path: Path, needle: str | None = None) -> Rows:
    """The standard library's line-by-line reader (about 80k rows per CPU second): exact line
    numbers in every message. With ``needle`` (the text pyarrow choked on), the lines holding it
    are checked first, so that an error deep in a large file is found without parsing all of it."""
    source = str(path)
    header, header_line = _csv_header(path)
    lay = _layout(header, source, f"line {header_line}")
    width = len(header)
    cache: dict[str, int] = {}
    try:
        if needle:
            with _open_text(path) as f:
                for n, text in enumerate(f, 1):
                    if n > header_line and needle in text:
                        row = next(csv.reader([text]), [])
                        if row and any(c.strip() for c in row):
                            _check_row(row, n, lay, width, source, cache)
        times: list[int] = []
        tickers: list[str] = []
        values: list[list[float]] = []
        lines: list[int] = []
        with _open_text(path) as f:
            reader = csv.reader(f)
            for row in reader:
                if reader.line_num <= header_line or not row or not any(c.strip() for c in row):
                    continue
                line = reader.line_num
                for t, tic, v in _check_row(row, line, lay, width, source, cache):
                    times.append(t)
                    tickers.append(tic)
                    values.append(v)
                    lines.append(line)
    except (UnicodeDecodeError, csv.Error, gzip.BadGzipFile, EOFError) as e:
        raise DataError(f"{source}: not a readable CSV file ({e})") from None
    tcodes, tvals = _encode(np.asarray(times, dtype=np.int64))
    names = sorted(set(tickers))
    col = {n: i for i, n in enumerate(names)}
    vals = np.asarray(values, dtype=np.float64).reshape(-1, 5)
    line_arr = np.asarray(lines, dtype=np.int64)
    return Rows(
        tcodes,
        np.asarray(tvals, dtype=np.int64),
        np.array([col[t] for t in tickers], dtype=np.int64),
        names,
        [vals[:, j].copy() for j in range(5)],
        source,
        "line",
        lambda i: int(line_arr[i]),
        wide=lay.wide,
    )


# --------------------------------------------------------------------------------------
# Parquet, HDF5
# --------------------------------------------------------------------------------------
def _read_parquet(path: Path) -> Rows:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            f"{path}: reading Parquet needs pyarrow, which is not installed "
            "(pip install 'podracer-hpc[trading]'), or convert the file to CSV"
        ) from None
    try:
        schema = pq.read_schema(path)
        lay = _layout(schema.names, str(path), "columns")
        use = [lay.time, *(lay.tickers if lay.wide else [lay.ticker, *lay.fields])]
        table = pq.read_table(path, columns=[schema.names[i] for i in sorted(use)])
    except DataError:
        raise
    except Exception as e:  # pyarrow raises its own error types
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    cols = {name: table.column(name) for name in table.column_names}
    lay = _layout(list(cols), str(path), "columns")
    return _columns_to_rows(cols, lay, str(path), "row", lambda i: i + 1)


def _read_hdf5(path: Path, key: str = "") -> Rows:
    from podracer_hpc.files.h5arrays import ArrayFileError, read_arrays

    try:
        cols, _ = read_arrays(path, group=key)
    except ArrayFileError as e:
        raise DataError(f"{e}; expected one 1-D dataset per column") from None
    for name, v in cols.items():
        if np.ndim(v) != 1:
            raise DataError(f"{path}: dataset {name!r} has shape {np.shape(v)}, expected one value per row")
    lay = _layout(list(cols), str(path), "columns")
    return _columns_to_rows(cols, lay, str(path), "row", lambda i: i + 1)


def read_rows(path: str | os.PathLike | MarketSource, key: str = "") -> Rows:
    """The validated bars of a file (long or wide; CSV, Parquet or HDF5), not yet aligned."""
    p = market_source(path).path
    name = p.name.lower()
    if name.endswith((".parquet", ".pq")):
        return _read_parquet(p)
    if name.endswith((".h5", ".hdf5", ".hdf")):
        return _read_hdf5(p, key)
    if name.endswith((".csv", ".csv.gz", ".txt", ".txt.gz")):
        return _read_csv(p)
    raise DataError(f"{p}: unknown file type; use .csv, .csv.gz, .parquet or .h5/.hdf5")
