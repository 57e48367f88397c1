"""Atomic file writes (no torch): a temp file in the same directory, fsync, rename. Every
file podracer-hpc rewrites in place (checkpoints and leaderboard entries through safeio.py, the
config, summaries, listings) goes through :func:`atomic_write_bytes`: a reader sees the old file
or the new one, never half a file."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from podracer_hpc.files.rundir import make_dirs

__all__ = ["atomic_write_bytes"]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def atomic_write_bytes(
    path: str | os.PathLike, data: bytes, mode: int = 0o640, overwrite: bool = True, sync_dir: bool = True
) -> None:
    """Write ``data`` to ``path`` atomically: a temp file in the same dir, fsync, then rename.

    ``overwrite=False`` only creates: the temp file is hard-linked to ``path``, which fails with
    ``FileExistsError`` if ``path`` exists, even when another host races for the same name.
    ``sync_dir=False`` skips the fsync of the directory (a caller that writes a second file into
    the same directory next, whose directory fsync makes both names durable).

    Written for shared filesystems, where every call on a name costs a metadata server round
    trip: the directory is created only when it is missing, the temporary file gets its mode at
    creation (a chmod only when the umask would strip bits), a replaced temporary is not unlinked
    again (bench/leaderboard_fsops.py counts these calls).
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, mode)
    except FileNotFoundError:
        make_dirs(path.parent)  # group-private, whatever the umask
        fd = os.open(tmp, flags, mode)
    placed = False
    try:
        with os.fdopen(fd, "wb") as f:
            if mode & _UMASK:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
            placed = True
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise FileExistsError(f"{path} already exists") from None
            except OSError:  # a filesystem without hard links
                if path.exists():
                    raise FileExistsError(f"{path} already exists") from None
                os.rename(tmp, path)
                placed = True
    finally:
        if not placed:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
    if not sync_dir:
        return
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
