"""The file side of leaderboard entries: private directories, atomic immutable creation,
deletion, and the count of filesystem operations (:mod:`podracer_hpc.pool.leaderboard` and
:mod:`podracer_hpc.pool.population` write through it; a shared filesystem's metadata server pays for
each operation, so the pool's rounds are measured in them: the round log, bench/pool_scale.py).
"""

from __future__ import annotations

import os
import secrets
import stat
import warnings
from pathlib import Path

from podracer_hpc.files import safeio
from podracer_hpc.files.owner import check_owner

__all__ = ["DIR_MODE", "FILE_MODE", "FS_OPS", "KEY_FILE", "LeaderboardWarning", "SecretError", "fs_ops", "secret"]

DIR_MODE = 0o2770  # setgid, group-writable (group members may publish and prune), no world access
FILE_MODE = 0o640
KEY_FILE = "leaderboard.key"  # the leaderboard's secret (the HMAC key of its entries), group-private


class SecretError(safeio.StateFileError):
    """The leaderboard's secret file is missing, exposed to others, foreign or damaged."""


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


def secret(root: Path, gid: int | None, create: bool, allow_foreign: bool = False) -> bytes | None:
    """The leaderboard's secret (32 random bytes, hex in ``root/leaderboard.key``, mode 0o640):
    made on first use when ``create`` (None when it is missing and not ``create``). Raises
    :class:`SecretError` when it is not a regular file, others may read or write it, or it is not
    owned by this user or the leaderboard's group (files/owner.py; ``allow_foreign``: not
    checked): a secret others know signs nothing."""
    path = root / KEY_FILE
    count_op("open")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        if not create:
            return None
        try:
            write_new(path, secrets.token_hex(32).encode() + b"\n", mode=FILE_MODE)
        except FileExistsError:
            pass  # another pod made it first: use theirs
        return secret(root, gid, False, allow_foreign)
    except OSError as e:
        raise SecretError(
            f"{path}: cannot open the leaderboard's secret ({e.strerror}); it must be a plain file"
        ) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise SecretError(f"{path}: the leaderboard's secret is not a plain file; remove it (a new one is made)")
        if st.st_mode & 0o007:
            raise SecretError(
                f"{path}: the leaderboard's secret is open to all users (mode {stat.S_IMODE(st.st_mode):o}), so "
                f"anyone could sign entries: `chmod o-rwx {path}`, and if others may have read it, remove it "
                "(a new one is made; entries signed with the old one are then refused)"
            )
        if not allow_foreign:
            check_owner(path, gid, st)
        raw = f.read(129)
    try:
        key = bytes.fromhex(raw.decode().strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != 32:
        raise SecretError(f"{path}: not a leaderboard secret (64 hex digits); remove it (a new one is made)")
    return key


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
