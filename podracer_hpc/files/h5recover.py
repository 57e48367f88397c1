"""A log that a killed writer left open: rebuilt from what a reader sees (h5log's writer calls
:func:`recover` through :func:`open_log`). Also the few lines of HDF5's documented superblock
format that clearing its "open for write" flags needs (:func:`clear_open_flags`, what ``h5clear
-s`` does; h5py has no call for it), with the superblock checksum (:func:`lookup3`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

from podracer_hpc.files.h5log import GROUPS, LOG_MODE, H5Writer, LogError, fill_value, read_log, to_attr

__all__ = ["clear_open_flags", "lookup3", "open_log", "recover"]


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


def _read_unclean(path: Path) -> dict[str, Any]:
    """Read a log whose writer died. SWMR kept it consistent if the writer had switched to SWMR;
    one killed before that (while creating or reopening the log) left plain "open for write"
    flags, which no reader gets past: read a copy with the flags cleared (the original stays).
    Whatever fails on the copy, the error raised is the reader's own, naming the log."""
    try:
        return read_log(path)
    except LogError as e:
        error = e
    copy = path.with_name(f".{path.name}.clear.tmp")
    try:
        copy.write_bytes(path.read_bytes())
        if clear_open_flags(copy):
            return read_log(copy)
    except LogError:  # not HDF5 at all, a superblock we do not touch, or unreadable all the same
        pass
    finally:
        copy.unlink(missing_ok=True)
    raise error from None


def recover(path: str | Path) -> int:
    """Rebuild the log at ``path`` from what a reader sees (its rows up to the last flush).

    Used when a killed writer left the file marked open (in SWMR mode, or before it switched
    to it). The rebuilt file replaces ``path`` atomically; the original is kept beside it as
    ``<name>.unclean``. Returns the number of rows kept; raises :class:`LogError` if the file
    cannot be read at all.
    """
    path = Path(path)
    log = _read_unclean(path)
    tmp = path.with_name(f".{path.name}.recover.tmp")
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
    unclean = path.with_name(path.name + ".unclean")
    unclean.unlink(missing_ok=True)
    os.link(path, unclean)  # the log's name always holds a whole file, the old one or the new one
    os.replace(tmp, path)
    return sum(len(next(iter(log[g].values()), [])) for g in GROUPS if log.get(g))
