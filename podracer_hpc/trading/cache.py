"""The prepared-market cache: a data file read, aligned and turned into features once, shared by every pod.

Reading and aligning tens of millions of bars and computing the indicators takes a minute or two
(``bench/trading_data.py``); a tournament of 100 pods must not do it 100 times. The first process
that needs a market prepares it and writes **one HDF5 file**; every other process, on any node,
opens that file read-only and memory-maps it (no parse, no copy until used; processes on one
node share the pages):

- ``dates`` ``[T]`` int64 (seconds), ``tickers`` ``[S]``, ``open high low close volume`` ``[T, S]``
  float64 and ``valid`` ``[T, S]`` (the aligned :class:`~.data.MarketData`);
- ``market_obs`` ``[T, 9 S + 1]`` (the market part of the observation, in the env's observation
  dtype: float32 unless it asks for float64) and ``turbulence`` ``[T]`` float64;
- attributes: the alignment notes, the data's fingerprint, the options, the code version, and the
  data file's identity (size, modification time, sha256 of its contents).

**Where**: ``<cache dir>/<data file name>.market-<options hash>.h5``. The cache dir is the
``cache_dir`` argument, else ``$PODRACER_MARKET_CACHE``, else the data file's own directory (on a
cluster, the shared filesystem the data already lives on); when that directory cannot be written,
or the file is inside an installed package (``pkg:``), ``~/.cache/podracer-hpc/markets``. One file
per set of options that change the preparation (tickers, turbulence window, observation dtype,
HDF5 group, the data file's absolute path).

**Fresh or stale**: a cache is used when its options and code version match and the data file has
the recorded size and modification time; if only the time changed (copied, touched), the contents
are hashed and compared. Anything else, or ``force``, prepares it again (in place: the same name).
The code version is a hash of the source of ``data.py``, ``indicators.py`` and this module, so a
change to the reader, the alignment or the indicators rebuilds every cache on first use.

**Concurrency**: preparation holds a POSIX lock (``fcntl.lockf``, which NFS and Lustre support) on
``<cache file>.lock``; a process that finds the cache missing waits for the lock, then looks again,
so 100 pods starting at once prepare it once. The file is written under a temporary name, synced
and renamed into place: a reader never sees half a file, and a process that still maps an old
version keeps reading it. A filesystem without locks (the lock call fails) only costs duplicate
work. A cache directory that cannot be written at all means preparing in memory, with a note.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import functools
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

import podracer_hpc.trading.indicators as ind  # (not "from . import": that names the package, a circle)
from podracer_hpc.trading.data import MarketData, align
from podracer_hpc.trading.fields import FIELDS, DataError, MarketSource, market_source
from podracer_hpc.trading.readers import read_rows

CACHE_ENV = "PODRACER_MARKET_CACHE"
FORMAT = 1  # the file layout; bump when the datasets or attributes change
MIN_COVERAGE = 0.9  # the alignment's thresholds (load_market's defaults)
MIN_DATE_COVERAGE = 0.5

Progress = Callable[[str], None]


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of the code that prepares a market (reader, alignment, indicators, this module)."""
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in ("data.py", "indicators.py", "cache.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


@dataclasses.dataclass
class PreparedMarket:
    """A prepared market: the aligned bars, the market part of the observation and the turbulence
    index (CPU tensors; memory-mapped from the cache file when ``path`` is set)."""

    data: MarketData
    market_obs: torch.Tensor  # [T, 9 S + 1]
    turbulence: torch.Tensor  # [T] float64
    fingerprint: int
    path: Path | None  # the cache file; None when prepared in memory only
    prepared_here: bool  # this call prepared it (False: read a file that was there)
    seconds: float  # time this call took


def _options(
    src: MarketSource, stocks: Sequence[str], turbulence_window: int, dtype: torch.dtype, key: str
) -> dict[str, Any]:
    w = int(turbulence_window)
    return {
        "format": FORMAT,
        "data": str(src.path.resolve()),
        "stocks": list(stocks),
        "turbulence_window": w if w >= 2 else 0,
        "dtype": _obs_dtype_name(dtype),
        "key": key,
        "min_coverage": MIN_COVERAGE,
        "min_date_coverage": MIN_DATE_COVERAGE,
    }


def _obs_dtype_name(dtype: torch.dtype) -> str:
    return "float64" if dtype == torch.float64 else "float32"


def _cache_dir(src: Path, cache_dir: str | os.PathLike | None, in_package: bool = False) -> Path:
    d = cache_dir or os.environ.get(CACHE_ENV, "")
    if d:
        return Path(d).expanduser()
    if os.access(src.parent, os.W_OK) and not in_package:  # never write into an installed package
        return src.parent
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "podracer-hpc" / "markets"


def cache_path(
    data: str | os.PathLike | MarketSource,
    stocks: Sequence[str] = (),
    turbulence_window: int = 252,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    key: str = "",
) -> Path:
    """The cache file of a data file and the options that change its preparation."""
    src = market_source(data)
    return _cache_file(src, _options(src, stocks, turbulence_window, dtype, key), cache_dir)


def _cache_file(src: MarketSource, opts: dict[str, Any], cache_dir: str | os.PathLike | None) -> Path:
    h = hashlib.sha256(json.dumps(opts, sort_keys=True).encode()).hexdigest()[:12]
    return _cache_dir(src.path, cache_dir, src.in_package) / f"{src.path.name}.market-{h}.h5"


def file_identity(path: Path, with_hash: bool = True) -> dict[str, Any]:
    """Size, modification time (ns) and sha256 of a file's contents."""
    st = path.stat()
    out: dict[str, Any] = {"data_size": int(st.st_size), "data_mtime_ns": int(st.st_mtime_ns)}
    if with_hash:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
        out["data_sha256"] = h.hexdigest()
    return out


def _stale_reason(attrs: dict[str, Any], src: MarketSource, opts: dict[str, Any]) -> str | None:
    """Why a cache's attributes do not fit the data and options (None: fresh)."""
    if attrs.get("options") != opts:
        return "other options"
    if attrs.get("code_version") != code_version():
        return f"written by other code (version {attrs.get('code_version')}, now {code_version()})"
    now = file_identity(src.path, with_hash=False)
    if now["data_size"] != attrs.get("data_size"):
        return f"the data file changed (size {attrs.get('data_size')} -> {now['data_size']})"
    if now["data_mtime_ns"] != attrs.get("data_mtime_ns"):
        if file_identity(src.path)["data_sha256"] != attrs.get("data_sha256"):
            return "the data file changed (its contents)"
    return None


def _read(path: Path, src: MarketSource, opts: dict[str, Any], t0: float) -> tuple[PreparedMarket | None, str]:
    """The cache at ``path`` if it is there and fresh, else (None, why not)."""
    from podracer_hpc.files.h5arrays import ArrayFileError, read_arrays

    if not path.is_file():
        return None, "missing"
    try:
        arrays, attrs = read_arrays(path, mmap=True)
    except ArrayFileError as e:
        return None, f"unreadable ({e})"
    why = _stale_reason(attrs, src, opts)
    if why:
        return None, why
    try:
        t = lambda name: torch.from_numpy(arrays[name])  # noqa: E731  (zero-copy over the memory map)
        md = MarketData(
            dates=arrays["dates"].view("datetime64[s]"),
            tickers=[x.decode() if isinstance(x, bytes) else str(x) for x in arrays["tickers"]],
            **{f: t(f) for f in FIELDS},
            valid=t("valid"),
            notes=list(attrs.get("notes") or []),
            meta={"source": str(attrs.get("source", src.path)), "cache": str(path)},
        )
        return PreparedMarket(
            md, t("market_obs"), t("turbulence"), int(attrs["fingerprint"]), path, False, time.perf_counter() - t0
        ), ""
    except KeyError as e:
        return None, f"incomplete (no {e})"


def say_to_stderr(prefix: str) -> Progress:
    """Progress lines: wall seconds and this process's CPU seconds so far, then the message."""
    t0, c0 = time.perf_counter(), time.process_time()

    def say(msg: str) -> None:
        print(
            f"{prefix} {time.perf_counter() - t0:7.1f}s ({time.process_time() - c0:6.1f}s CPU)  {msg}",
            file=sys.stderr,
            flush=True,
        )

    return say


def prepare(
    src: str | os.PathLike | MarketSource,
    stocks: Sequence[str] = (),
    turbulence_window: int = 252,
    dtype: torch.dtype = torch.float32,
    key: str = "",
    progress: Progress | None = None,
) -> tuple[MarketData, torch.Tensor, torch.Tensor]:
    """Read, align and compute the features of a data file (no cache): (market, market_obs, turbulence)."""
    say = progress or (lambda _m: None)
    src = market_source(src)
    say(f"reading {src.path} ({src.path.stat().st_size / 1e6:,.1f} MB)")
    rows = read_rows(src, key)
    say(
        f"read {len(rows):,} bars of {len(rows.tick_names):,} tickers{' (wide file: closes only)' if rows.wide else ''}"
    )
    md = align(rows, list(stocks) or None, min_coverage=MIN_COVERAGE, min_date_coverage=MIN_DATE_COVERAGE)
    del rows
    say(f"aligned: {md.num_days:,} times x {md.num_stocks} tickers" + "".join(f"; {n}" for n in md.notes))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the indicators and the turbulence index run in two threads of their own
    try:
        obs, turb = ind.market_features(
            md.high,
            md.low,
            md.close,
            turbulence_window,
            torch.float64 if dtype == torch.float64 else torch.float32,
            progress=say,
        )
    finally:
        torch.set_num_threads(threads)
    return md, obs, turb


def _write(path: Path, md: MarketData, obs: torch.Tensor, turb: torch.Tensor, attrs: dict[str, Any]) -> None:
    from podracer_hpc.files.h5arrays import write_arrays

    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        write_arrays(
            tmp,
            {
                "dates": md.dates.astype("datetime64[s]").astype(np.int64),
                "tickers": np.asarray(md.tickers, dtype=object),
                **{f: getattr(md, f).numpy() for f in FIELDS},
                "valid": md.valid.numpy(),
                "market_obs": obs.numpy(),
                "turbulence": turb.numpy(),
            },
            attrs,
        )
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class _Lock:
    """An exclusive POSIX lock on ``<path>.lock`` (released when the process dies, also over NFS)."""

    def __init__(self, path: Path, say: Progress):
        self.path = path.with_name(path.name + ".lock")
        self.say = say
        self.fd = -1

    def __enter__(self) -> "_Lock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o664)
        waited, told = 0.0, 0.0
        while True:
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):  # no locks on this filesystem: go on without
                    self.say(
                        f"cannot lock {self.path} ({e.strerror}); preparing without a lock (other "
                        "processes may prepare the same market at the same time)"
                    )
                    return self
            if waited - told >= 30 or not told:
                self.say(f"waiting for {self.path}: another process is preparing this market")
                told = waited or 1e-9
            time.sleep(0.2)
            waited += 0.2

    def __exit__(self, *exc: Any) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing releases the lock
            self.fd = -1


def open_market(
    data: str | os.PathLike | MarketSource,
    stocks: Sequence[str] = (),
    turbulence_window: int = 252,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    key: str = "",
    progress: Progress | None = None,
    force: bool = False,
) -> PreparedMarket:
    """The prepared market of a data file: read from its cache, or prepared (once, under a lock) and cached.

    ``stocks`` selects and orders tickers as :func:`~.data.load_market` does; ``dtype`` is the
    observation dtype. ``progress`` gets the steps of a preparation (default: lines on stderr);
    ``force`` prepares again even if the cache is fresh. Bad data raises :class:`DataError`."""
    t0 = time.perf_counter()
    src = market_source(data)
    stocks = list(stocks or ())
    opts = _options(src, stocks, turbulence_window, dtype, key)
    path = _cache_file(src, opts, cache_dir)
    if not force:
        m, _ = _read(path, src, opts, t0)
        if m is not None:
            return m
    say = progress or say_to_stderr("[podracer data]")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _Lock(path, say)
        lock.__enter__()
    except OSError as e:
        say(
            f"cannot write the market cache in {path.parent} ({e.strerror or e}); preparing in memory "
            f"(set {CACHE_ENV} or --cache-dir to a writable directory to share it)"
        )
        md, obs, turb = prepare(src, stocks, turbulence_window, dtype, key, say)
        return PreparedMarket(md, obs, turb, md.fingerprint(), None, True, time.perf_counter() - t0)
    try:
        if not force:
            m, why = _read(path, src, opts, t0)
            if m is not None:  # another process prepared it while we waited
                return m
        else:
            why = "forced"
        say(f"preparing {path.name} ({why})")
        identity = file_identity(src.path)
        md, obs, turb = prepare(src, stocks, turbulence_window, dtype, key, say)
        attrs = {
            "format": FORMAT,
            "options": opts,
            "code_version": code_version(),
            **identity,
            "fingerprint": md.fingerprint(),
            "notes": md.notes,
            "source": str(src.path),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": os.uname().nodename,
        }
        try:
            _write(path, md, obs, turb, attrs)
        except OSError as e:  # full, quota, read-only: the market is ready, only sharing it failed
            say(f"cannot write the market cache {path} ({e.strerror or e}); using the market prepared in memory")
            return PreparedMarket(md, obs, turb, attrs["fingerprint"], None, True, time.perf_counter() - t0)
        say(f"wrote {path} ({path.stat().st_size / 1e6:,.1f} MB)")
    finally:
        lock.__exit__()
    m, why = _read(path, src, opts, t0)
    if m is None:  # the data changed while we read it
        raise DataError(f"{src.path}: changed while it was prepared ({why}); run again")
    m.prepared_here = True
    return m


def read_fresh(
    data: str | os.PathLike | MarketSource,
    stocks: Sequence[str] = (),
    turbulence_window: int = 252,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    key: str = "",
) -> tuple[Path, PreparedMarket | None, str]:
    """(cache file, its prepared market if it is there and fresh else None, 'fresh' or why it would be
    prepared again), preparing nothing: the data file's identity is checked once, and a caller that
    goes on to use a fresh market reads no file again."""
    src = market_source(data)
    opts = _options(src, list(stocks), turbulence_window, dtype, key)
    path = _cache_file(src, opts, cache_dir)
    m, why = _read(path, src, opts, time.perf_counter())
    return path, m, "fresh" if m is not None else why


def cache_status(
    data: str | os.PathLike | MarketSource,
    stocks: Sequence[str] = (),
    turbulence_window: int = 252,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    key: str = "",
) -> tuple[Path, str]:
    """(cache file, 'fresh' or why it would be prepared again) without preparing anything."""
    path, _, state = read_fresh(data, stocks, turbulence_window, dtype, cache_dir, key)
    return path, state


__all__ = [
    "PreparedMarket",
    "open_market",
    "prepare",
    "cache_path",
    "cache_status",
    "read_fresh",
    "code_version",
    "file_identity",
    "CACHE_ENV",
]
