"""A log that a killed writer left open: rebuilt from what a reader sees (h5log's writer calls
:func:`recover` through :func:`open_log`). Also the few lines of HDF5's documented superblock
format that clearing its "open for write" flags needs (:func:`clear_open_flags`, what ``h5clear
-s`` does; h5py has no call for it), with the superblock checksum (:func:`lookup3`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

from podracer_hpc.files.h5log import (
    GROUPS,
    LOG_MODE,
    READABLE_VERSIONS,
    H5Writer,
    LogError,
    fill_value,
    read_attrs,
    to_attr,
    write_error,
)

__all__ = ["clear_open_flags", "lookup3", "open_log", "recover", "salvage", "stored_eof"]


def open_log(
    path: str | Path, attrs: dict[str, Any], say: Callable[[str], None] | None = None, flush_interval_s: float = 2.0
) -> H5Writer:
    """The rank's log writer, a log left open by a killed writer rebuilt first (``say`` says so)."""
    return H5Writer(path, attrs, flush_interval_s=flush_interval_s, say=say, recover=recover)


_M32 = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M32


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 hash (``hashlittle``): the checksum HDF5 keeps on its metadata."""
    n = len(data)
    v = [(0xDEADBEEF + n + initval) & _M32] * 3  # a, b, c

    def add(block: bytes) -> None:
        for j in range(3):
            v[j] = (v[j] + int.from_bytes(block[4 * j : 4 * j + 4], "little")) & _M32

    i = 0
    while n - i > 12:  # every full 12-byte block but the last: add, then mix
        add(data[i : i + 12])
        for x, y, z, k in ((0, 2, 1, 4), (1, 0, 2, 6), (2, 1, 0, 8), (0, 2, 1, 16), (1, 0, 2, 19), (2, 1, 0, 4)):
            v[x] = ((v[x] - v[y]) & _M32) ^ _rot(v[y], k)
            v[y] = (v[y] + v[z]) & _M32
        i += 12
    if n == i:
        return v[2]
    add(data[i:] + bytes(12 - (n - i)))  # the last 1-12 bytes, zero-padded (the same sums)
    for x, y, k in ((2, 1, 14), (0, 2, 11), (1, 0, 25), (2, 1, 16), (0, 2, 4), (1, 0, 14), (2, 1, 24)):
        v[x] = ((v[x] ^ v[y]) - _rot(v[y], k)) & _M32  # the final mix
    return v[2]


_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def clear_open_flags(path: str | Path) -> bool:
    """Clear the "open for write / SWMR write" flags a killed writer left in an HDF5 file's
    superblock (what ``h5clear -s`` does), so that it can be read. Only for a file no process
    has open. Superblock versions 2 and 3 (``libver="latest"``): signature, version, the sizes
    of offsets and lengths, the flags byte, four addresses, a lookup3 checksum of all before it.
    Returns True if flags were set and are now cleared, False if there was nothing to clear.
    """
    with open(path, "r+b") as fh:
        size = os.fstat(fh.fileno()).st_size
        base = 0
        while base + 12 <= size:  # the superblock sits at 0, 512, 1024, 2048, ... (a user block)
            fh.seek(base)
            head = fh.read(12)
            if head[:8] == _SIGNATURE:
                break
            base = 512 if base == 0 else base * 2
        else:
            raise LogError(f"{path}: no HDF5 superblock found")
        version, offsets, flags = head[8], head[9], head[11]
        if version < 2:
            raise LogError(f"{path}: HDF5 superblock version {version}; only versions 2-3 are cleared")
        if flags == 0:
            return False
        fh.seek(base)
        block = bytearray(fh.read(12 + 4 * offsets + 4))
        if int.from_bytes(block[-4:], "little") != lookup3(bytes(block[:-4])):
            raise LogError(f"{path}: the HDF5 superblock's checksum does not match; not touched")
        block[11] = 0
        block[-4:] = lookup3(bytes(block[:-4])).to_bytes(4, "little")
        fh.seek(base)
        fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def stored_eof(path: str | Path) -> int | None:
    """The end of file an HDF5 file's superblock (versions 2-3) records, in bytes from the file's
    start; None for another superblock. A file shorter than this lost its end (a write that a
    full disk refused): an SWMR reader retries such reads for minutes, a plain one fails at once."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        base = 0
        while base + 12 <= size:
            fh.seek(base)
            head = fh.read(12)
            if head[:8] == _SIGNATURE:
                break
            base = 512 if base == 0 else base * 2
        else:
            return None
        if head[8] < 2:
            return None
        o = head[9]
        fh.seek(base + 12 + 2 * o)
        return base + int.from_bytes(fh.read(o), "little")


def _read_column(ds: Any, size: int) -> np.ndarray:
    """The rows of a dataset that can be read: none from a chunk past the file's end (``size``), and
    none after the first block of rows HDF5 cannot read."""
    limit = ds.shape[0]
    try:
        for i in range(ds.id.get_num_chunks()):
            info = ds.id.get_chunk_info(i)
            if info.byte_offset is None or info.byte_offset + info.size > size:
                limit = min(limit, int(info.chunk_offset[0]))
    except (OSError, RuntimeError, ValueError, AttributeError):
        pass  # no chunk index to read: the rows themselves say how far they go
    parts, n = [], 0
    while n < limit:
        try:
            part = ds[n : min(limit, n + 256)]
        except (OSError, RuntimeError, ValueError):
            break
        parts.append(part)
        n += len(part)
    arr = np.concatenate(parts) if parts else ds[0:0]
    if arr.dtype.kind == "O":
        arr = np.array([x.decode() if isinstance(x, bytes) else x for x in arr], dtype=object)
    return arr


def salvage(path: str | Path) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """What can be read of a damaged log (a killed writer, a write a full disk refused), as
    :func:`~podracer_hpc.files.h5log.read_log` returns it, and per group ``(rows kept, rows it
    held)``. Reads a copy whose "open for write" flags are cleared and whose lost end is padded
    to the size the superblock records (so that HDF5 fails at once where data is missing, instead
    of retrying): rows are kept up to the first one any column cannot give. The original is not
    touched. :class:`LogError` if not even the file's root can be read."""
    path = Path(path)
    copy = path.with_name(f".{path.name}.salvage.tmp")
    try:
        size = path.stat().st_size
        shutil.copyfile(path, copy)
        try:
            clear_open_flags(copy)
            eof = stored_eof(copy)
        except LogError:
            eof = None
        if eof is not None and size < eof < size + (1 << 40):
            os.truncate(copy, eof)  # sparse zeros where the disk refused the end
        try:
            f = h5py.File(copy, "r", libver="latest")
        except (OSError, RuntimeError) as e:
            raise LogError(f"{path}: not a readable HDF5 log ({e})") from None
        with f:
            version = f.attrs.get("schema_version")
            version = version.item() if isinstance(version, np.generic) else version
            if version not in READABLE_VERSIONS:
                raise LogError(f"{path}: log schema version {version}, this podracer-hpc reads {READABLE_VERSIONS}")
            try:
                attrs = read_attrs(f)
            except (OSError, RuntimeError):
                attrs = {"schema_version": version}
            log: dict[str, Any] = {"attrs": attrs}
            lost: dict[str, tuple[int, int]] = {}
            for group in GROUPS:
                cols: dict[str, np.ndarray] = {}
                held = 0
                try:
                    g = f.get(group)
                    names = list(g) if g is not None else []
                except (OSError, RuntimeError, KeyError):
                    g, names = None, []
                for name in names:
                    try:
                        ds = g[name]
                    except (OSError, RuntimeError, KeyError):
                        cols[name] = np.zeros(0)
                        continue
                    held = max(held, ds.shape[0])
                    cols[name] = _read_column(ds, size)
                n = min((len(a) for a in cols.values()), default=0)
                log[group] = {k: a[:n] for k, a in cols.items()}
                lost[group] = (n, held)
            return log, lost
    except OSError as e:
        raise LogError(f"{path}: cannot be read to recover it ({e.strerror or e})") from None
    finally:
        copy.unlink(missing_ok=True)


def _lost_text(log: dict[str, Any], lost: dict[str, tuple[int, int]]) -> str:
    """``/train rows 1025-1499 lost (after update 1024), ...`` or "" when every row was kept."""
    parts = []
    for group, (kept, held) in lost.items():
        if held > kept:
            upd = log[group].get("update")
            after = f", after update {int(upd[-1])}" if upd is not None and len(upd) else ""
            parts.append(f"/{group} rows {kept + 1}-{held} lost{after}")
    return "; ".join(parts)


def recover(path: str | Path) -> tuple[int, str]:
    """Rebuild the log at ``path`` from what can be read of it (:func:`salvage`: its rows up to
    the last flush, or up to the first row a full disk damaged).

    Used when a killed writer left the file marked open (in SWMR mode, or before it switched
    to it) or a refused write left it shorter than its superblock says. The rebuilt file
    replaces ``path`` atomically; the original is kept beside it as ``<name>.unclean``. Returns
    the number of rows kept and what was lost ("" if nothing); raises :class:`LogError` if the
    file cannot be read at all.
    """
    path = Path(path)
    log, lost = salvage(path)
    tmp = path.with_name(f".{path.name}.recover.tmp")
    try:
        _write_rebuilt(tmp, log)
    except (OSError, RuntimeError) as e:  # a disk still full: the advice, and no half file left behind
        tmp.unlink(missing_ok=True)
        raise write_error(path, e, "rebuilding") from None
    unclean = path.with_name(path.name + ".unclean")
    unclean.unlink(missing_ok=True)
    os.link(path, unclean)  # the log's name always holds a whole file, the old one or the new one
    os.replace(tmp, path)
    return sum(kept for kept, _ in lost.values()), _lost_text(log, lost)


def _write_rebuilt(tmp: Path, log: dict[str, Any]) -> None:
    """Write ``log`` (read_log's form) as a fresh log file at ``tmp``, fsynced."""
    with h5py.File(tmp, "w", libver="latest") as f:
        for k, v in log["attrs"].items():
            f.attrs[k] = to_attr(v)
        for group, cols in GROUPS.items():
            g = f.create_group(group)
            have = log.get(group, {})
            n = min((len(have[c]) for c in cols if c in have), default=0)
            for name, dtype in cols.items():
                data = have.get(name)
                if data is None:  # a column this version added: fill it like append() does
                    data = fill_value(dtype, n)
                g.create_dataset(
                    name,
                    data=list(data[:n]) if dtype not in (np.float64, np.int64) else np.asarray(data[:n], dtype=dtype),
                    shape=(n,),
                    maxshape=(None,),
                    dtype=dtype,
                    chunks=(256,),
                )
    with open(tmp, "rb+") as fh:
        os.fchmod(fh.fileno(), LOG_MODE)
        os.fsync(fh.fileno())
