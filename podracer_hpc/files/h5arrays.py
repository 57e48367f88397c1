"""Named arrays in an HDF5 file, no log schema: the stock-trading task's prepared-market cache and
columnar market files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from podracer_hpc.files.h5log import read_attrs

__all__ = ["ArrayFileError", "read_arrays", "write_arrays"]


class ArrayFileError(ValueError):
    """An HDF5 file of named arrays is missing, unreadable or lacks a group; the message says which."""


def write_arrays(path: str | Path, arrays: dict[str, np.ndarray], attrs: dict[str, Any] | None = None) -> None:
    """Write ``arrays`` to a new HDF5 file at ``path`` (replaced if it exists), ``attrs`` as its attributes.

    Every numeric array is one contiguous, uncompressed dataset, so that :func:`read_arrays` can
    memory-map it; an array of ``str`` is stored as UTF-8 strings. Attribute values that are not a
    number or a string are stored as JSON. The caller makes the write atomic (a temporary name,
    then a rename) if readers may look at ``path`` meanwhile."""
    with h5py.File(path, "w", libver="latest") as f:
        for name, a in arrays.items():
            a = np.asarray(a)
            if a.dtype.kind in "OU":
                f.create_dataset(
                    name,
                    data=np.array([str(x) for x in a.reshape(-1)], dtype=object).reshape(a.shape),
                    dtype=h5py.string_dtype("utf-8"),
                )
            else:
                f.create_dataset(name, data=np.ascontiguousarray(a))
        for k, v in (attrs or {}).items():
            f.attrs[k] = v if isinstance(v, (int, float, str, np.integer, np.floating)) else json.dumps(v)


def read_arrays(
    path: str | Path, names: list[str] | None = None, group: str = "", mmap: bool = False
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, attributes) of an HDF5 file: the datasets of ``group`` (default the root), all or ``names``.

    With ``mmap``, a contiguous numeric dataset comes back as a copy-on-write memory map of the file
    (no read until used; processes on one node share the pages; writing to it never reaches the
    file); other datasets are read. Strings come back as h5py gives them (bytes). JSON attributes
    are decoded. The file is opened read-only without HDF5's file locking, which some shared
    filesystems refuse (the caller only opens files that are complete: written, then renamed)."""
    path = Path(path)
    if not path.is_file():
        raise ArrayFileError(f"{path}: no such file")
    try:
        f = h5py.File(path, "r", locking=False)
    except OSError as e:
        raise ArrayFileError(f"{path}: not a readable HDF5 file ({e})") from None
    with f:
        try:
            g = f[group] if group else f
        except KeyError:
            raise ArrayFileError(f"{path}: no group {group!r} (it has {', '.join(f) or 'nothing'})") from None
        if not isinstance(g, h5py.Group):
            raise ArrayFileError(f"{path}: {group!r} is a dataset, not a group of columns")
        want = [n for n in g if isinstance(g[n], h5py.Dataset)] if names is None else names  # all: datasets only
        out: dict[str, np.ndarray] = {}
        for name in want:
            ds = g.get(name)
            if not isinstance(ds, h5py.Dataset):
                raise ArrayFileError(f"{path}: no dataset {name!r} in {group or 'the root'}")
            offset = ds.id.get_offset() if mmap and ds.dtype.kind in "biuf" and ds.chunks is None else None
            if offset is not None and ds.size:
                out[name] = np.memmap(path, dtype=ds.dtype, mode="c", offset=offset, shape=ds.shape)
            else:
                out[name] = ds[()]
        attrs = read_attrs(f)
    return out, attrs
