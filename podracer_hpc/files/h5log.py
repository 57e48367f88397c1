"""Per-rank HDF5 logs: a SWMR writer and a reader. With h5recover.py (a log a killed writer left
open) and h5arrays.py (named arrays, no log schema), the only modules that import h5py.

One file per rank, ``<run>/logs/<job>_rank<r>.h5``. Schema version 1 (docs/hdf5-schema.md):

- ``/train``: one row per pod iteration: a PPO update, or SAC/TD3's ``rollout_steps`` env steps
  and the updates due (columns in ``TRAIN_COLUMNS``),
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
import os
import time
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

from podracer_hpc.files.rundir import make_dirs

LOG_MODE = 0o640  # a rank's log: the owner writes, the group reads

SCHEMA_VERSION = 4
# Versions this code reads. Version 2 added the typed tournament source columns (source_kind,
# source_id, source_rejected); a version-1 log that is continued is upgraded in place (its old
# rows get empty source columns, which records.read_records reads from the legacy ``source``).
# Version 3 added what a comparison on common start states used: the evaluation's
# seed and standard error (/eval, /tournament) and the paired difference (/tournament); older
# rows get NaN / -1.
# Version 4 added the off-policy learners' columns (/train q_mean, alpha) and the
# pod's learner (/tournament algo); older rows get NaN / ''.
READABLE_VERSIONS = (1, 2, 3, 4)

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
    "learning_rate": np.float64,  # PPO's learning rate; SAC/TD3: the actor's
    "q_mean": np.float64,  # SAC/TD3: mean of the twin critics' Q on the sampled batches (NaN for PPO)
    "alpha": np.float64,  # SAC: the entropy temperature (NaN for PPO and TD3)
    "grad_steps": np.int64,  # gradient steps in this row (PPO: -1, its epochs x minibatches are fixed)
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
    "return_se": np.float64,  # standard error of return_mean
    "eval_seed": np.int64,  # the start states' seed (fitness.eval_seed: the same for every pod of the run)
}
TOURNAMENT_COLUMNS: dict[str, Any] = {
    "round": np.int64,
    "env_steps": np.int64,
    "wall_s": np.float64,
    "fitness": np.float64,
    "action": h5py.string_dtype("utf-8"),
    "source": h5py.string_dtype("utf-8"),  # schema 1's one-string form, still written (records.Source.legacy)
    "source_kind": h5py.string_dtype("utf-8"),  # "" | pod | entry | fresh (records.SOURCE_KINDS)
    "source_id": h5py.string_dtype("utf-8"),  # the pod's rank or the entry id
    "source_rejected": np.int64,  # 1: the source could not be loaded, the pod kept its own agent
    "old_hparams": h5py.string_dtype("utf-8"),  # JSON
    "new_hparams": h5py.string_dtype("utf-8"),  # JSON
    "tournament_s": np.float64,  # seconds in the round's collectives, publish, load and prune
    "fs_ops": np.int64,  # leaderboard filesystem operations of this pod in the round
    "fitness_se": np.float64,  # standard error of fitness
    "eval_seed": np.int64,  # the round's start states (every pod of the round: the same)
    "episodes": np.int64,  # episodes behind fitness
    "source_score": np.float64,  # the candidate's (or source's) score as the rule saw it
    "diff_mean": np.float64,  # paired mean return difference candidate - own on common start states
    "diff_se": np.float64,  # its standard error
    "margin_se": np.float64,  # the margin the rule asked for, in standard errors
    "verified": np.int64,  # 1: the candidate was evaluated again on this round's start states before it was taken
    "algo": h5py.string_dtype("utf-8"),  # the pod's learner: ppo | sac | td3 (agent.algo)
}
GROUPS = {"train": TRAIN_COLUMNS, "eval": EVAL_COLUMNS, "tournament": TOURNAMENT_COLUMNS}


def read_attrs(obj: Any) -> dict[str, Any]:
    """An HDF5 object's attributes as Python values (JSON text decoded, numpy scalars unwrapped)."""
    attrs: dict[str, Any] = {}
    for k, v in obj.attrs.items():
        if isinstance(v, str) and v[:1] in "{[":
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                pass
        attrs[k] = _scalar(v)
    return attrs


def _scalar(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def fill_value(dtype: Any, n: int) -> Any:
    """``n`` empty values of a column: NaN, -1 or ''."""
    if dtype is np.float64:
        return np.full(n, np.nan)
    if dtype is np.int64:
        return np.full(n, -1, dtype=np.int64)
    return [""] * n


def to_attr(v: Any) -> Any:
    """An attribute value as stored: numbers and strings as they are, anything else as JSON."""
    return v if isinstance(v, (int, float, str, np.integer, np.floating)) else json.dumps(v)


class LogError(ValueError):
    """A log file is missing, unreadable or of an unknown schema version."""


class H5Writer:
    """Appends rows to one rank's log; reopening an existing log continues it (resume)."""

    def __init__(
        self,
        path: str | Path,
        attrs: dict[str, Any],
        flush_interval_s: float = 2.0,
        say: Callable[[str], None] | None = None,
        recover: Callable[[Path], int] | None = None,
    ):
        """Open (or create) the log at ``path``. A log that a killed writer left marked open is
        rebuilt by ``recover`` (h5recover.recover: ``h5recover.open_log`` passes it), which
        ``say`` reports; without it such a log is a :class:`LogError`."""
        self.path = Path(path)
        self._recover = recover
        make_dirs(self.path.parent)  # group-private, whatever the umask
        self.flush_interval_s = flush_interval_s
        exists = self.path.exists()
        self.f = self._open_existing(say) if exists else h5py.File(self.path, "w", libver="latest")
        if not exists:
            os.chmod(self.path, LOG_MODE)  # h5py creates 0o666 less the umask
        if exists:
            version = _scalar(self.f.attrs.get("schema_version"))
            if version not in READABLE_VERSIONS:
                self.f.close()
                raise LogError(
                    f"{self.path}: log schema version {version}, this podracer-hpc writes {SCHEMA_VERSION} "
                    f"(and continues {', '.join(map(str, READABLE_VERSIONS))}); use a new --run-dir"
                )
        for group, cols in GROUPS.items():
            g = self.f.require_group(group)
            have = [g[name].shape[0] for name in cols if name in g]
            rows = min(have) if have else 0
            for name, dtype in cols.items():
                if name not in g:  # a column this version added: old rows get its empty value
                    ds = g.create_dataset(name, shape=(rows,), maxshape=(None,), dtype=dtype, chunks=(256,))
                    if rows:
                        ds[...] = fill_value(dtype, rows)
            n = min(g[name].shape[0] for name in cols)  # a writer may have died mid-row
            for name in cols:
                if g[name].shape[0] != n:
                    g[name].resize((n,))
        for k, v in attrs.items():
            self.f.attrs[k] = to_attr(v)
        self.f.attrs["schema_version"] = SCHEMA_VERSION
        self.f.swmr_mode = True
        self._last_flush = time.monotonic()

    def _open_existing(self, say: Callable[[str], None] | None) -> h5py.File:
        """Open a log to continue it; rebuild it first if a killed writer left it marked open."""
        try:
            return h5py.File(self.path, "a", libver="latest")
        except (OSError, RuntimeError) as e:  # h5py raises RuntimeError for some corrupt superblocks
            if self.path.is_dir():
                raise LogError(
                    f"{self.path}: is a directory, not a log file; move it away or use a new --run-dir"
                ) from None
            first = e
        # A writer killed with the file open (SIGKILL, node failure) leaves the superblock's
        # "open for write / SWMR write" flags set, and HDF5 then refuses to open it for writing.
        # What it flushed is intact (SWMR keeps the file consistent for readers at every
        # moment): the recovery reads that, writes it to a fresh file and puts it in its place.
        if self._recover is None:
            raise LogError(
                f"{self.path}: cannot be opened for writing ({first}); if a killed writer left it open, "
                "podracer_hpc.files.h5recover.open_log rebuilds it"
            )
        try:
            rows = self._recover(self.path)
        except LogError as e:
            raise LogError(
                f"{e}; it cannot be continued (opening it for writing said: {first}). "
                "Move it away or use a new --run-dir"
            ) from None
        if say is not None:
            say(
                f"{self.path} was left open by a killed writer: recovered {rows} rows "
                f"(the original is kept as {self.path.name}.unclean)"
            )
        return h5py.File(self.path, "a", libver="latest")

    def truncate_after(self, env_steps: int) -> int:
        """Drop rows logged after ``env_steps`` (work lost since the checkpoint we resume from).

        Keeps each group's rows up to the first one beyond ``env_steps``; ``env_steps=-1``
        drops every row (a run that restarts from scratch). Returns the number of rows dropped.
        """
        dropped = 0
        for group in GROUPS:
            g = self.f[group]
            steps = g["env_steps"][...]
            beyond = np.flatnonzero(steps > env_steps)
            keep = int(beyond[0]) if len(beyond) else len(steps)
            if keep < len(steps):
                dropped += len(steps) - keep
                for name in g:
                    g[name].resize((keep,))
        self.flush()
        return dropped

    def rows(self) -> dict[str, int]:
        """Rows in each group now (a checkpoint records them: :meth:`truncate_to` on resume)."""
        return {group: int(self.f[group]["env_steps"].shape[0]) for group in GROUPS}

    def truncate_to(self, rows: dict[str, int]) -> int:
        """Keep the first ``rows[group]`` rows of each group (what a checkpoint's log held); returns
        the rows dropped. Exact where env steps are not: a round's rows and the checkpoint just
        before it can share their env steps (a round redone after a kill would log it twice)."""
        dropped = 0
        for group in GROUPS:
            g = self.f[group]
            n, keep = g["env_steps"].shape[0], int(rows.get(group, g["env_steps"].shape[0]))
            if 0 <= keep < n:
                dropped += n - keep
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
            ds[n] = row[name] if name in row else fill_value(dtype, 1)[0]
        if flush or time.monotonic() - self._last_flush > self.flush_interval_s:
            self.flush()

    def extend(self, group: str, columns: dict[str, Any], flush: bool = False) -> None:
        """Append many rows at once: ``columns`` maps names to equal-length sequences (missing
        columns get NaN / -1 / ''). For tools that build logs (benchmarks, tests)."""
        g = self.f[group]
        cols = GROUPS[group]
        unknown = set(columns) - set(cols)
        if unknown:
            raise KeyError(f"unknown {group} columns {sorted(unknown)}; known: {list(cols)}")
        k = {len(v) for v in columns.values()}
        if len(k) > 1:
            raise ValueError(f"{group} columns of different lengths: {sorted(k)}")
        k_rows = k.pop() if k else 0
        n = g["env_steps"].shape[0]
        for name, dtype in cols.items():
            ds = g[name]
            ds.resize((n + k_rows,))
            ds[n:] = columns[name] if name in columns else fill_value(dtype, k_rows)
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
    except (OSError, RuntimeError) as e:
        raise LogError(f"{path}: not a readable HDF5 log ({e})") from None
    with f:
        version = _scalar(f.attrs.get("schema_version"))
        if version not in READABLE_VERSIONS:
            raise LogError(
                f"{path}: log schema version {version}, this podracer-hpc reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
            )
        out: dict[str, Any] = {"attrs": read_attrs(f)}
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


class LogTail:
    """Reads one rank log incrementally: each :meth:`poll` returns only the rows appended since the
    previous poll, so a monitor's cost per poll does not grow with the log's length.

    ``columns``: the columns to read, per group (a group left out is not read; None: every column
    of every group). A poll first compares the file's (inode, mtime, size) with the last poll's and
    opens nothing when they are unchanged. A log that shrank (a resumed run cut rows written after
    its checkpoint) or was replaced (a recovered log) is read again from its first row, and the
    poll says so (``reset``). ``rows_read`` counts the rows read so far (over all groups).
    """

    def __init__(self, path: str | Path, columns: dict[str, tuple[str, ...]] | None = None):
        self.path = Path(path)
        self.columns = columns
        self.rows: dict[str, int] = {g: 0 for g in (columns if columns is not None else GROUPS)}
        self.attrs: dict[str, Any] | None = None  # the root attributes, read at the first poll (and after a reset)
        self.rows_read = 0
        self._sig: tuple[int, int, int] | None = None

    def poll(self) -> dict[str, Any]:
        """The rows appended since the last poll: ``{"reset": bool, group: {column: array}}`` (a
        group or column the file lacks is an empty array). Raises :class:`LogError` if the file is
        missing, unreadable or of an unknown schema version; the next poll tries again."""
        try:
            st = self.path.stat()
        except OSError:
            raise LogError(f"{self.path}: no such log file") from None
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        empty = {g: {} for g in self.rows}
        if sig == self._sig:
            return {"reset": False, **empty}
        reset = self._sig is not None and sig[0] != self._sig[0]
        try:
            f = h5py.File(self.path, "r", libver="latest", swmr=True)
        except (OSError, RuntimeError) as e:
            raise LogError(f"{self.path}: not a readable HDF5 log ({e})") from None
        with f:
            if self.attrs is None or reset:
                version = _scalar(f.attrs.get("schema_version"))
                if version not in READABLE_VERSIONS:
                    raise LogError(
                        f"{self.path}: log schema version {version}, this podracer-hpc reads "
                        f"{', '.join(map(str, READABLE_VERSIONS))}"
                    )
                self.attrs = read_attrs(f)
            sets: dict[str, dict[str, Any]] = {}
            counts: dict[str, int] = {}
            for group in self.rows:
                g = f.get(group)
                names = self.columns[group] if self.columns is not None else tuple(GROUPS[group])
                sets[group] = {}
                if g is None:
                    counts[group] = 0
                    continue
                for name in names:
                    if name in g:
                        ds = g[name]
                        ds.refresh()
                        sets[group][name] = ds
                # a writer may be between two columns of a row: the rows every column read has
                counts[group] = min((ds.shape[0] for ds in sets[group].values()), default=0)
            if any(counts[g] < self.rows[g] for g in self.rows):
                reset = True
            if reset:
                self.rows = {g: 0 for g in self.rows}
            out: dict[str, Any] = {"reset": reset}
            for group, dsets in sets.items():
                lo, hi = self.rows[group], counts[group]
                names = self.columns[group] if self.columns is not None else tuple(GROUPS[group])
                cols: dict[str, np.ndarray] = {}
                for name in names:
                    ds = dsets.get(name)
                    if ds is None:
                        arr = np.asarray(
                            fill_value(GROUPS[group][name], hi - lo),
                            dtype=object if GROUPS[group][name] not in (np.float64, np.int64) else None,
                        )
                    else:
                        arr = ds[lo:hi] if hi > lo else ds[0:0]
                        if arr.dtype.kind == "O":
                            arr = np.array([x.decode() if isinstance(x, bytes) else x for x in arr], dtype=object)
                    cols[name] = arr
                out[group] = cols
                self.rows_read += hi - lo
                self.rows[group] = hi
        self._sig = sig
        return out
