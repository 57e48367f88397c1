"""The file side of leaderboard entries: private directories, atomic immutable creation,
deletion, and the count of filesystem operations (:mod:`podracer_hpc.pool.leaderboard` and
:mod:`podracer_hpc.pool.population` write through it; a shared filesystem's metadata server pays for
each operation, so the pool's rounds are measured in them: the round log, bench/pool_scale.py).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from podracer_hpc.files import safeio

__all__ = ["DIR_MODE", "FILE_MODE", "FS_OPS", "LeaderboardWarning", "fs_ops"]

DIR_MODE = 0o2770  # setgid, group-writable (group members may publish and prune), no world access
FILE_MODE = 0o640


class LeaderboardWarning(UserWarning):
    """A file in the leaderboard directory was skipped."""


# Filesystem operations on the leaderboard directory by this process, by kind (open, write,
# scandir, stat, link, rename, unlink, fsync): a shared filesystem's metadata server pays for
# each, so the pool's rounds are measured in them (bench/pool_scale.py, the round log).
FS_OPS: dict[str, int] = {}


def count_op(kind: str, n: int = 1) -> None:
    FS_OPS[kind] = FS_OPS.get(kind, 0) + n


def fs_ops() -> int:
    """Total leaderboard filesystem operations of this process so far."""
    return sum(FS_OPS.values())


def make_private_dir(d: Path) -> None:
    try:
        d.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        if not d.is_dir():
            raise NotADirectoryError(f"{d} exists and is not a directory") from None
        if d.stat().st_mode & 0o007:
            warn(f"{d} is accessible by all users; restrict it with `chmod o-rwx {d}`")
        return
    os.chmod(d, DIR_MODE)


def write_new(path: Path, data: bytes, mode: int = FILE_MODE, sync_dir: bool = True) -> None:
    """Atomically create ``path`` with ``data``; never replaces an existing file."""
    count_op("write", 5 if sync_dir else 3)  # create, fsync, link, unlink of the temporary (+ open, fsync of the dir)
    try:
        safeio.atomic_write_bytes(path, data, mode=mode, overwrite=False, sync_dir=sync_dir)
    except FileExistsError:
        raise FileExistsError(f"{path} already exists; leaderboard entries are immutable") from None


def unlink_if_there(path: Path) -> None:
    count_op("unlink")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def warn(msg: str) -> None:
    warnings.warn(msg, LeaderboardWarning, stacklevel=3)
