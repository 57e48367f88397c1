"""The names and times of market data: its fields and column aliases, time parsing, where a data
file is (``pkg:`` paths, resolved once into a :class:`MarketSource`), and :class:`DataError`."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

__all__ = [
    "FIELDS",
    "PKG_PREFIX",
    "TICKER_ALIASES",
    "TIME_ALIASES",
    "DataError",
    "MarketSource",
    "is_daily",
    "market_source",
    "parse_time",
    "resolve_data_path",
    "to_datetime64",
]

FIELDS = ("open", "high", "low", "close", "volume")
TIME_ALIASES = ("date", "timestamp", "datetime", "time")
TICKER_ALIASES = ("ticker", "tic", "symbol")
_EPOCH = datetime(1970, 1, 1)


class DataError(ValueError):
    """A market data file is malformed or the alignment leaves nothing; the message says where."""


# --------------------------------------------------------------------------------------
# Times
# --------------------------------------------------------------------------------------
def parse_time_cached(cache: dict[str, int], text: str, where: str, hint: str = "") -> int:
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
# Where a data file is
# --------------------------------------------------------------------------------------
PKG_PREFIX = "pkg:"


def resolve_data_path(spec: str | os.PathLike) -> Path:
    """The file that a data path names: a plain path, or ``pkg:PACKAGE/path/in/it`` for a file shipped
    inside an installed package (``pkg:skfolio/datasets/data/sp500_dataset.csv.gz``).

    The package is located without being imported (its own imports may be heavy). A package that
    is not installed, or lacks the file, is a :class:`DataError` saying what to install."""
    s = os.fspath(spec)
    if not s.startswith(PKG_PREFIX):
        return Path(s).expanduser()
    pkg, _, rel = s[len(PKG_PREFIX) :].strip("/").partition("/")
    if not pkg or not rel:
        raise DataError(
            f"{s}: expected pkg:PACKAGE/path/inside/it, e.g. pkg:skfolio/datasets/data/sp500_dataset.csv.gz"
        )
    try:
        found = importlib.util.find_spec(pkg)
    except (ImportError, ValueError):
        found = None
    roots = list(found.submodule_search_locations or []) if found is not None else []
    if not roots:
        raise DataError(
            f"{s}: the package {pkg!r} is not installed here (pip install {pkg}; "
            "for the real-data example: pip install 'podracer-hpc[real-data]')"
        )
    for root in roots:
        p = Path(root) / rel
        if p.is_file():
            return p
    raise DataError(f"{s}: the installed package {pkg} ({roots[0]}) has no file {rel}")


@dataclasses.dataclass(frozen=True)
class MarketSource:
    """A market data file, resolved once and handed down (the env, the cache, the reader, the backtest):
    what the user wrote (``spec``: a path or ``pkg:...``, which names the cache) and the file it names."""

    spec: str
    path: Path

    @property
    def in_package(self) -> bool:
        """Whether the file ships inside an installed package (its cache never goes beside it)."""
        return self.spec.startswith(PKG_PREFIX)


def market_source(data: str | os.PathLike | MarketSource) -> MarketSource:
    """``data`` resolved (:func:`resolve_data_path`) and checked to be a file; a :class:`MarketSource`
    is returned as it is, so that every layer below the first resolves nothing again."""
    if isinstance(data, MarketSource):
        return data
    spec = os.fspath(data)
    path = resolve_data_path(spec)
    if not path.is_file():
        raise DataError(f"{path}: no such market data file")
    return MarketSource(spec, path)
