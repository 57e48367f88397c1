"""Which checkpoint every rank resumes from: one update for all, or a clear error.

A hard kill can catch a checkpoint half-way through the ranks (some wrote update u, others
still hold u - k), tear a rank's very first checkpoint, or leave a corrupt file behind; a run
directory can also be resumed by the wrong number of ranks. Each rank describes what it holds
(:class:`RankFiles`), the ranks exchange that, and :func:`choose` (pure: the same answer on every
rank) picks the latest update that every rank can load, falling back to the ``.prev`` files, or
to a fresh start when no rank ever completed a checkpoint before this one, and otherwise names
what is wrong and what to do. Nothing is deleted: a file set aside is renamed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import safeio

STATE_KIND = "pod-state"


class ResumeError(RuntimeError):
    """The run directory cannot be resumed as it is; the message says why and what to do."""


@dataclass(frozen=True)
class FileState:
    """One checkpoint file: absent, or its update count, or why it cannot be used."""

    exists: bool = False
    updates: int | None = None  # None when absent or unusable
    error: str = ""  # why an existing file cannot be used
    world_size: int | None = None  # ranks of the run that wrote it (None: not recorded)

    @property
    def usable(self) -> bool:
        return self.updates is not None


@dataclass(frozen=True)
class RankFiles:
    """What one rank holds: its checkpoint and the one before it."""

    ckpt: FileState
    prev: FileState


@dataclass(frozen=True)
class Choice:
    """The verdict for every rank: ``fresh`` (no checkpoint), or resume at ``updates``."""

    fresh: bool
    updates: int | None = None
    use_prev: tuple[bool, ...] = ()  # per rank: resume from .prev instead of the checkpoint
    notes: tuple[str, ...] = ()  # what was set aside and why (said on stderr)


def describe(path: Path) -> FileState:
    """Read and verify one checkpoint file (absent files are fine)."""
    if not path.exists() and not path.is_symlink():
        return FileState()
    try:
        _, meta, _ = safeio.load(path, STATE_KIND)
    except safeio.StateFileError as e:
        return FileState(exists=True, error=str(e))
    u = meta.get("updates")
    if not isinstance(u, int) or isinstance(u, bool) or u < 0:
        return FileState(exists=True, error=f"{path}: holds no valid 'updates' counter ({u!r}); not a complete "
                                           "pod checkpoint")
    ws = meta.get("world_size")
    return FileState(exists=True, updates=u, world_size=ws if isinstance(ws, int) else None)


def rank_files(ckpt: Path) -> RankFiles:
    return RankFiles(describe(ckpt), describe(prev_of(ckpt)))


def prev_of(ckpt: Path) -> Path:
    return ckpt.with_suffix(".prev")


def choose(files: list[RankFiles], size: int, other_ranks: list[int] = ()) -> Choice:
    """The update every rank resumes from (pure; ``files[r]`` is rank r's).

    ``other_ranks``: ranks >= ``size`` that have checkpoint files here (a run of more ranks).
    Raises :class:`ResumeError` when the ranks cannot be brought to one consistent state.
    """
    recorded = {f.world_size for rf in files for f in (rf.ckpt, rf.prev) if f.world_size is not None}
    if other_ranks or (recorded and recorded != {size}):
        n = max(recorded | {max(other_ranks, default=-1) + 1})
        raise ResumeError(
            f"this run directory holds the checkpoints of a {n}-rank run, and {size} rank(s) started. "
            f"Resume it with {n} ranks (mpiexec -n {n}, or as many Slurm tasks), or use a new --run-dir."
        )
    if not any(f.exists for rf in files for f in (rf.ckpt, rf.prev)):
        return Choice(fresh=True)
    common = set.intersection(*({f.updates for f in (rf.ckpt, rf.prev) if f.usable} for rf in files))
    notes = []
    if common:
        target = max(common)
        use_prev = tuple(rf.ckpt.updates != target for rf in files)
        for r, (rf, p) in enumerate(zip(files, use_prev)):
            if p:
                why = rf.ckpt.error or (f"at update {rf.ckpt.updates}, ahead of other ranks" if rf.ckpt.exists
                                        else "missing")
                notes.append(f"rank {r}: checkpoint {why}; resuming from its .prev (update {target})")
        return Choice(fresh=False, updates=target, use_prev=use_prev, notes=tuple(notes))
    errors = [f"rank {r}: {f.error}" for r, rf in enumerate(files) for f in (rf.ckpt, rf.prev) if f.error]
    if not errors and not any(rf.prev.exists for rf in files):
        # No rank ever completed a checkpoint before this one: it was torn (some ranks wrote
        # their first checkpoint, others were killed first). Starting over loses nothing saved.
        have = [r for r, rf in enumerate(files) if rf.ckpt.exists]
        return Choice(fresh=True, notes=(f"ranks {have} hold a first checkpoint that other ranks never wrote "
                                         "(a kill during the first checkpoint): starting over from scratch",))
    held = "; ".join(
        f"rank {r}: " + ", ".join(
            f"{name} {f.updates if f.usable else ('unusable' if f.exists else 'missing')}"
            for name, f in (("checkpoint", rf.ckpt), (".prev", rf.prev)))
        for r, rf in enumerate(files))
    raise ResumeError(
        "the ranks' checkpoints cannot be brought to one update (" + held + ")."
        + ("\n  " + "\n  ".join(errors) if errors else "")
        + "\nRestore the damaged files from a backup, or start a new --run-dir."
    )


def agree(allgather: Callable[[Any], list[Any]], rank: int, size: int, ckpt: Path,
          say: Callable[[str], None], ranks_present: list[int] = ()) -> Choice:
    """Every rank: describe, exchange, choose, and put the chosen file at ``ckpt``.

    ``ranks_present``: on rank 0, the ranks that have checkpoint files in the run directory.
    """
    mine = rank_files(ckpt)
    gathered = allgather((mine, [r for r in ranks_present if r >= size]))
    choice = choose([g[0] for g in gathered], size, gathered[0][1])
    if rank == 0:
        for n in choice.notes:
            say(n)
    if choice.fresh:
        for p in (ckpt, prev_of(ckpt)):
            if p.exists():
                _set_aside(p, "discarded")
    elif choice.use_prev[rank]:
        if ckpt.exists():
            _set_aside(ckpt, "corrupt" if mine.ckpt.error else "ahead")
        os.replace(prev_of(ckpt), ckpt)
    return choice


def _set_aside(p: Path, why: str) -> None:
    """Rename a file that will not be used to ``<name>.<why>`` (kept as evidence, never deleted)."""
    os.replace(p, p.with_name(f"{p.name}.{why}"))
