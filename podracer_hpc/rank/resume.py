"""Which checkpoint every rank resumes from: one update for all, or a clear error.

Pods train independently between tournament rounds, and each checkpoints on its own clock, so
ranks need not resume from the same update: only from the same *epoch* (the stretch between two
rounds, the ``round`` counter of a checkpoint) when they meet at rounds (``tournament.sync:
collective``), and from anything at all when they never meet (``async``). A hard kill can
catch the post-round checkpoints half-way through the ranks, tear a rank's very first
checkpoint, or leave a corrupt file behind; a run directory can also be resumed by the wrong
number of ranks. Each rank describes what it holds (:class:`RankFiles`), the ranks exchange
that, and :func:`choose` (pure: the same answer on every rank) picks for every rank its latest
loadable state of the latest epoch all ranks can reach, falling back to ``.prev`` (which the
writer keeps in the previous epoch once a new one began: :func:`rotate_prev`), or to a fresh
start when no rank ever completed a checkpoint before this one, and otherwise names what is
wrong and what to do. Nothing is deleted: a file set aside is renamed.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from podracer_hpc.config import Config, renamed_keys, to_dict
from podracer_hpc.files import safeio
from podracer_hpc.files.bounded import read_yaml

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
    epoch: int = 0  # tournament rounds done when it was written

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
    """The verdict for every rank: ``fresh`` (no rank resumes), or per rank the file to use."""

    fresh: bool
    use: tuple[str, ...] = ()  # per rank: "ckpt", "prev" or "fresh" (async: a rank that never wrote one)
    updates: tuple[int, ...] = ()  # per rank: the update it resumes at (0 when fresh)
    epoch: int = 0  # the epoch the ranks resume in (collective)
    notes: tuple[str, ...] = ()  # what was set aside and why (said on stderr)
    # this rank's checkpoint and .prev epochs after the choice was carried out (agree: the files
    # are read once there, not again by the rank program)
    epochs: tuple[int | None, int | None] = (None, None)

    @property
    def use_prev(self) -> tuple[bool, ...]:
        return tuple(u == "prev" for u in self.use)


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
        return FileState(
            exists=True, error=f"{path}: holds no valid 'updates' counter ({u!r}); not a complete pod checkpoint"
        )
    ws, ep = meta.get("world_size"), meta.get("round", 0)
    return FileState(
        exists=True,
        updates=u,
        world_size=ws if isinstance(ws, int) else None,
        epoch=ep if isinstance(ep, int) and not isinstance(ep, bool) else 0,
    )


def rank_files(ckpt: Path) -> RankFiles:
    return RankFiles(describe(ckpt), describe(prev_of(ckpt)))


def prev_of(ckpt: Path) -> Path:
    return ckpt.with_suffix(".prev")


def choose(files: list[RankFiles], size: int, other_ranks: list[int] = (), independent: bool = False) -> Choice:
    """The state every rank resumes from (pure; ``files[r]`` is rank r's).

    ``other_ranks``: ranks >= ``size`` that have checkpoint files here (a run of more ranks).
    ``independent``: the pods never meet (async rounds): each takes its own latest state.
    Raises :class:`ResumeError` when the ranks cannot be brought to one consistent state.
    """
    recorded = {f.world_size for rf in files for f in (rf.ckpt, rf.prev) if f.world_size is not None}
    if other_ranks or (recorded and recorded != {size}):
        n = max(recorded | {max(other_ranks, default=-1) + 1})
        raise ResumeError(
            f"this run directory holds the checkpoints of a {n}-rank run, and {size} rank(s) started. "
            f"Resume it with {n} ranks (podracer mpirun -n {n}, or as many Slurm tasks), or use a new --run-dir."
        )
    if not any(f.exists for rf in files for f in (rf.ckpt, rf.prev)):
        return Choice(fresh=True, use=("fresh",) * size, updates=(0,) * size)
    usable = [[(name, f) for name, f in (("ckpt", rf.ckpt), ("prev", rf.prev)) if f.usable] for rf in files]
    errors = [f"rank {r}: {f.error}" for r, rf in enumerate(files) for f in (rf.ckpt, rf.prev) if f.error]
    if independent:
        target = None
    elif all(usable):
        target = min(max(f.epoch for _, f in u) for u in usable)
    else:
        target = -1
    picks: list[tuple[str, FileState] | None] = []
    for u in usable:
        within = [x for x in u if target is None or x[1].epoch == target]
        picks.append(max(within, key=lambda x: (x[1].updates, x[0] == "ckpt")) if within else None)
    have_nothing = [r for r, rf in enumerate(files) if not rf.ckpt.exists and not rf.prev.exists]
    if independent and all(p is not None or r in have_nothing for r, p in enumerate(picks)):
        picks_ok = True
    else:
        picks_ok = all(p is not None for p in picks)
    if picks_ok:
        use = tuple(p[0] if p else "fresh" for p in picks)
        notes = []
        for r, (rf, p) in enumerate(zip(files, picks)):
            if p is not None and p[0] == "prev":
                why = rf.ckpt.error or (
                    f"in round {rf.ckpt.epoch}, past the round the other ranks reached" if rf.ckpt.exists else "missing"
                )
                notes.append(f"rank {r}: checkpoint {why}; resuming from its .prev (update {p[1].updates})")
            elif p is None:
                notes.append(f"rank {r}: no checkpoint; this pod starts from scratch (the pods never meet)")
        return Choice(
            fresh=False,
            use=use,
            updates=tuple(p[1].updates if p else 0 for p in picks),
            epoch=target if target is not None and target >= 0 else 0,
            notes=tuple(notes),
        )
    if not errors and not any(rf.prev.exists for rf in files):
        # No rank ever completed a checkpoint before this one: it was torn (some ranks wrote
        # their first checkpoint, others were killed first). Starting over loses nothing saved.
        have = [r for r, rf in enumerate(files) if rf.ckpt.exists]
        return Choice(
            fresh=True,
            use=("fresh",) * size,
            updates=(0,) * size,
            notes=(
                f"ranks {have} hold a first checkpoint that other ranks never wrote "
                "(a kill during the first checkpoint): starting over from scratch",
            ),
        )
    held = "; ".join(
        f"rank {r}: "
        + ", ".join(
            f"{name} "
            + (f"update {f.updates} (round {f.epoch})" if f.usable else ("unusable" if f.exists else "missing"))
            for name, f in (("checkpoint", rf.ckpt), (".prev", rf.prev))
        )
        for r, rf in enumerate(files)
    )
    raise ResumeError(
        "the ranks' checkpoints cannot be brought to one round ("
        + held
        + ")."
        + ("\n  " + "\n  ".join(errors) if errors else "")
        + "\nRestore the damaged files from a backup, or start a new --run-dir."
    )


def rotate_prev(ckpt_epoch: int | None, prev_epoch: int | None, new_epoch: int, independent: bool) -> bool:
    """Whether writing a checkpoint of ``new_epoch`` should first turn the current one into ``.prev``.

    Collective pods keep in ``.prev`` the last state of the previous epoch once a new one began,
    so that a rank whose post-round checkpoint is written can still go back to the round the
    others have not finished (ranks are at most one round apart); within the first epoch, and
    always for independent pods, ``.prev`` is simply the checkpoint before.
    """
    if ckpt_epoch is None:
        return False
    if independent or ckpt_epoch < new_epoch:
        return True
    return prev_epoch is None or prev_epoch >= new_epoch


def agree(
    allgather: Callable[[Any], list[Any]],
    rank: int,
    size: int,
    ckpt: Path,
    say: Callable[[str], None],
    ranks_present: list[int] = (),
    independent: bool = False,
) -> Choice:
    """Every rank: describe, exchange, choose, and put the chosen file at ``ckpt``.

    ``ranks_present``: on rank 0, the ranks that have checkpoint files in the run directory.
    """
    mine = rank_files(ckpt)
    gathered = allgather((mine, [r for r in ranks_present if r >= size]))
    choice = choose([g[0] for g in gathered], size, gathered[0][1], independent=independent)
    if rank == 0:
        for n in choice.notes:
            say(n)
    use = choice.use[rank] if choice.use else "fresh"
    epochs: tuple[int | None, int | None] = (None, None)
    if choice.fresh or use == "fresh":
        for p in (ckpt, prev_of(ckpt)):
            if p.exists():
                _set_aside(p, "discarded")
    elif use == "prev":
        if ckpt.exists():
            _set_aside(ckpt, "corrupt" if mine.ckpt.error else "ahead")
        os.replace(prev_of(ckpt), ckpt)
        epochs = (mine.prev.epoch, None)
    else:
        epochs = (mine.ckpt.epoch, mine.prev.epoch if mine.prev.usable else None)
    return dataclasses.replace(choice, epochs=epochs)


def _set_aside(p: Path, why: str) -> None:
    """Rename a file that will not be used to ``<name>.<why>`` (kept as evidence, never deleted)."""
    os.replace(p, p.with_name(f"{p.name}.{why}"))


# Config keys a resumed run may change (a section, or a dotted key of one): what it trains to, how it
# logs and evaluates, where it runs, whether it reads unkeyed leaderboard entries.
RESUMABLE_KEYS = ("total_env_steps", "log", "eval", "device", "threads", "name", "tournament.accept_unkeyed")


def config_changes(run_config: Path, checkpoint_config: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between the config a run directory holds (its config.yaml, written once at the
    run's first start, else the checkpoint's) and this start's (``to_dict`` of it), one line per
    key; old key names read as today's; keys a resume may change (:data:`RESUMABLE_KEYS`) left out."""
    written = renamed_keys(_run_config(run_config) or checkpoint_config, warn=False)
    return _diff_config(written, new, to_dict(Config()))


def _run_config(path: Path) -> dict[str, Any] | None:
    """The run's config.yaml (written once, at the run's first start), or None if unreadable."""
    try:
        d = read_yaml(path, what="run config")
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return d if isinstance(d, dict) else None


def _diff_config(old: dict[str, Any], new: dict[str, Any], defaults: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys whose values differ between a checkpoint's config and this run's. A key the checkpoint
    does not have (added to podracer-hpc since) is no difference if this run has its default."""
    out = []
    for k in sorted(set(old) | set(new)):
        if prefix + k in RESUMABLE_KEYS:
            continue
        a, b, d = old.get(k), new.get(k), (defaults or {}).get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff_config(a, b, d if isinstance(d, dict) else {}, prefix + k + ".")
        elif k not in old and b == d:
            continue
        elif a != b:
            out.append(f"{prefix}{k}: checkpoint has {a!r}, this run has {b!r}")
    return out
