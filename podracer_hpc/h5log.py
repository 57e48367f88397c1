"""Per-rank HDF5 logs: a SWMR writer and a reader. The only module that imports h5py.

One file per rank, ``<run>/logs/<job>_rank<r>.h5``. Schema version 1 (docs/hdf5-schema.md):

- ``/train``: one row per PPO update (columns in ``TRAIN_COLUMNS``),
- ``/eval``: one row per evaluation (``EVAL_COLUMNS``),
- ``/tournament``: one row per tournament decision (``TOURNAMENT_COLUMNS``).

Each column is a resizable 1-D dataset. Root attributes: ``schema_version``, ``config``
(JSON), ``git_revision``, ``host``, ``device``, ``versions`` (JSON), ``seed``, ``rank``,
``world_size``, ``slurm`` (JSON of SLURM_* ids), ``created``. The writer switches to SWMR
mode so that ``podracer status`` and analysis can read a file while it is written; rows are
flushed every few seconds and on every evaluation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

SCHEMA_VERSION = 1

TRAIN_COLUMNS: dict[str, Any] = {
    "update": np.int64,
    "env_steps": np.int64,
    "wall_s": np.float64,
    "steps_per_s": np.float64,
    "return_mean": np.float64,  # training episodes that ended in this update (NaN if none)
    "return_std": np.float64,
    "episodes": np.int64,
    "loss": np.float64,
    "policy_loss": np.float64,
    "value_loss": np.float64,
    "entropy": np.float64,
    "approx_kl": np.float64,
    "clipfrac": np.float64,
    "explained_variance": np.float64,
    "learning_rate": np.float64,
}
EVAL_COLUMNS: dict[str, Any] = {
    "update": np.int64,
    "env_steps": np.int64,
    "wall_s": np.float64,
    "return_mean": np.float64,
    "return_std": np.float64,
    "return_min": np.float64,
    "return_max": np.float64,
    "episodes": np.int64,
}
TOURNAMENT_COLUMNS: dict[str, Any] = {
    "round": np.int64,
    "env_steps": np.int64,
    "wall_s": np.float64,
    "fitness": np.float64,
    "action": h5py.string_dtype("utf-8"),
    "source": h5py.string_dtype("utf-8"),
    "old_hparams": h5py.string_dtype("utf-8"),  # JSON
    "new_hparams": h5py.string_dtype("utf-8"),  # JSON
    "tournament_s": np.float64,  # seconds in the round's collectives, publish, load and prune
}
GROUPS = {"train": TRAIN_COLUMNS, "eval": EVAL_COLUMNS, "tournament": TOURNAMENT_COLUMNS}


def _scalar(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


class LogError(ValueError):
    """A log file is missing, unreadable or of an unknown schema version."""


class H5Writer:
    """Appends rows to one rank's log; reopening an existing log continues it (resume)."""

    def __init__(self, path: str | Path, attrs: dict[str, Any], flush_interval_s: float = 2.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.flush_interval_s = flush_interval_s
        exists = self.path.exists()
        self.f = h5py.File(self.path, "a" if exists else "w", libver="latest")
        if exists:
            version = _scalar(self.f.attrs.get("schema_version"))
            if version != SCHEMA_VERSION:
                self.f.close()
                raise LogError(
                    f"{self.path}: log schema version {version}, this podracer-hpc writes {SCHEMA_VERSION}; "
                    "use a new --run-dir"
                )
        for group, cols in GROUPS.items():
            g = self.f.require_group(group)
            for name, dtype in cols.items():
                if name not in g:
                    g.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(256,))
        for k, v in attrs.items():
            self.f.attrs[k] = v if isinstance(v, (int, float, str, np.integer, np.floating)) else json.dumps(v)
        self.f.attrs["schema_version"] = SCHEMA_VERSION
        self.f.swmr_mode = True
        self._last_flush = time.monotonic()

    def truncate_after(self, env_steps: int) -> int:
        """Drop rows logged after ``env_steps`` (work lost since the checkpoint we resume from)."""
        dropped = 0
        for group in ("train", "eval", "tournament"):
            g = self.f[group]
            steps = g["env_steps"][...]
            keep = int(np.searchsorted(steps, env_steps, side="right")) if len(steps) else 0
            if keep < len(steps):
                dropped += len(steps) - keep
                for name in g:
                    g[name].resize((keep,))
        self.flush()
        return dropped

    def append(self, group: str, row: dict[str, Any], flush: bool = False) -> None:
        """Append one row; missing columns get NaN / -1 / ''."""
        g = self.f[group]
        cols = GROUPS[group]
        unknown = set(row) - set(cols)
        if unknown:
            raise KeyError(f"unknown {group} columns {sorted(unknown)}; known: {list(cols)}")
        n = g["env_steps"].shape[0]
        for name, dtype in cols.items():
            ds = g[name]
            ds.resize((n + 1,))
            if name in row:
                v = row[name]
            elif dtype is np.float64:
                v = np.nan
            elif dtype is np.int64:
                v = -1
            else:
                v = ""
            ds[n] = v
        if flush or time.monotonic() - self._last_flush > self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        self.f.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self.f.id.valid:
            self.f.flush()
            self.f.close()

    def __enter__(self) -> "H5Writer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_log(path: str | Path) -> dict[str, Any]:
    """Read a rank log (also while it is written): {'attrs': {...}, 'train': {col: array}, ...}.

    A file whose writer died is readable up to its last flush. A file of another schema
    version is refused with a clear message.
    """
    path = Path(path)
    if not path.exists():
        raise LogError(f"{path}: no such log file")
    try:
        f = h5py.File(path, "r", libver="latest", swmr=True)
    except OSError as e:
        raise LogError(f"{path}: not a readable HDF5 log ({e})") from None
    with f:
        version = _scalar(f.attrs.get("schema_version"))
        if version != SCHEMA_VERSION:
            raise LogError(
                f"{path}: log schema version {version}, this podracer-hpc reads {SCHEMA_VERSION}"
            )
        out: dict[str, Any] = {"attrs": {}}
        for k, v in f.attrs.items():
            if isinstance(v, str) and v[:1] in "{[":
                try:
                    v = json.loads(v)
                except json.JSONDecodeError:
                    pass
            out["attrs"][k] = _scalar(v)
        for group in GROUPS:
            g = f.get(group)
            cols: dict[str, np.ndarray] = {}
            if g is not None:
                for name in g:
                    ds = g[name]
                    ds.refresh()
                    arr = ds[...]
                    if arr.dtype.kind == "O":
                        arr = np.array([x.decode() if isinstance(x, bytes) else x for x in arr], dtype=object)
                    cols[name] = arr
                n = min((len(a) for a in cols.values()), default=0)  # a writer may die mid-row
                cols = {k: a[:n] for k, a in cols.items()}
            out[group] = cols
        return out
