"""Tables: named numpy columns of one length (no pandas needed; ``Table.to_pandas()`` if you have
it), read from and written to CSV."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

__all__ = ["TEXT_COLUMNS", "Table", "read_csv"]


# ---------------------------------------------------------------------- the table


class Table:
    """Named 1-D numpy columns of equal length, in order. Strings are object arrays."""

    def __init__(self, columns: Mapping[str, Any] | None = None):
        self.columns: dict[str, np.ndarray] = {}
        n = None
        for k, v in (columns or {}).items():
            a = _as_column(v)
            if n is not None and len(a) != n:
                raise ValueError(f"column {k!r} has {len(a)} rows, the others {n}")
            n = len(a)
            self.columns[k] = a

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> "Table":
        """Rows (dicts) to columns; a key missing from a row becomes NaN (numbers) or '' (strings)."""
        names: list[str] = list(columns or [])
        for r in rows:
            names += [k for k in r if k not in names]
        cols = {}
        for k in names:
            vals = [r.get(k, _MISSING) for r in rows]
            present = [v for v in vals if v is not _MISSING]
            if present and all(isinstance(v, str) for v in present):
                vals = ["" if v is _MISSING else v for v in vals]
            else:
                vals = [math.nan if v is _MISSING else v for v in vals]
            cols[k] = vals
        return cls(cols)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, key: str) -> np.ndarray:
        return self.columns[key]

    def __contains__(self, key: str) -> bool:
        return key in self.columns

    def __repr__(self) -> str:
        return f"Table({len(self)} rows: {', '.join(self.columns)})"

    @property
    def names(self) -> list[str]:
        return list(self.columns)

    def take(self, idx: Any) -> "Table":
        """Rows selected by a boolean mask or an index array."""
        return Table({k: v[idx] for k, v in self.columns.items()})

    def where(self, **equal: Any) -> "Table":
        """Rows whose columns equal the given values, e.g. ``t.where(system="pbt", pod=0)``."""
        mask = np.ones(len(self), dtype=bool)
        for k, v in equal.items():
            mask &= self.columns[k] == v
        return self.take(mask)

    def unique(self, key: str) -> list[Any]:
        """Distinct values of a column, in order of first appearance."""
        seen: dict[Any, None] = {}
        for v in self.columns[key].tolist():
            seen.setdefault(v, None)
        return list(seen)

    def rows(self) -> Iterator[dict[str, Any]]:
        names = self.names
        for vals in zip(*(self.columns[k].tolist() for k in names)):
            yield dict(zip(names, vals))

    def to_csv(self, path: str | Path) -> Path:
        """Write CSV (a header row; floats at full precision, NaN as ``nan``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.names)
            for r in self.rows():
                w.writerow([_cell(v) for v in r.values()])
        return path

    def to_parquet(self, path: str | Path) -> Path | None:
        """Write Parquet if pyarrow is installed; returns None (and writes nothing) otherwise."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            return None
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({k: v.tolist() if v.dtype == object else v for k, v in self.columns.items()}), path)
        return path

    def to_pandas(self) -> Any:
        import pandas as pd  # optional

        return pd.DataFrame(self.columns)


_MISSING = object()


def _as_column(v: Any) -> np.ndarray:
    a = np.asarray(v)
    if a.dtype.kind in "US":
        a = a.astype(object)
    if a.ndim != 1:
        a = a.reshape(-1)
    return a


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)  # round-trips exactly; nan, inf as such
    if isinstance(v, bool):
        return str(v)
    return str(v)


# Columns kept as text when read back: a git revision such as 34425e4 would parse as a float.
TEXT_COLUMNS = frozenset({"git_revision"})


def read_csv(path: str | Path) -> Table:
    """Read a CSV written by :meth:`Table.to_csv`: integer, float and bool columns get their types."""
    with open(path, newline="") as f:
        r = csv.reader(f)
        names = next(r)
        data = list(r)
    cols: dict[str, Any] = {}
    for i, k in enumerate(names):
        vals = [row[i] for row in data]
        cols[k] = np.array(vals, dtype=object) if k in TEXT_COLUMNS else _parse_column(vals)
    return Table(cols)


def _parse_column(vals: list[str]) -> np.ndarray:
    if vals and all(v in ("True", "False") for v in vals):
        return np.array([v == "True" for v in vals])
    try:
        return np.array([int(v) for v in vals], dtype=np.int64)
    except ValueError:
        pass
    try:
        return np.array([float(v) for v in vals], dtype=np.float64)
    except ValueError:
        return np.array(vals, dtype=object)


def typed(t: Table, names: Sequence[str]) -> Table:
    """An empty table still has its columns."""
    if len(t):
        return t
    return Table({k: np.array([], dtype=object) for k in names})
