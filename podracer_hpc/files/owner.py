"""Who wrote a file: checkpoints and leaderboard entries are loaded only from their run's people.

A run directory and a leaderboard are written by one user, or by the members of one group (the
leaderboard is ``2770``: setgid, so every file in it gets the directory's group). A file there
owned by someone else is refused by default (:func:`check_owner`): it was planted by an outsider
through a directory that others can write (a run made under umask 000, a world-writable
``tournament.leaderboard_dir``). A file is trusted when its owner is

- this user, or root (who can write anything anyway);
- another user and the file's group is the run's group (the group of the run directory or the
  leaderboard root), in a directory that others cannot write (there only group members create
  files, and a setgid directory gives every new file its group, so the group proves nothing
  when others may create files too);
- otherwise, a member of the run's group (its primary group or a listed member).

``podracer evaluate``, ``export policy`` and ``backtest`` take ``--allow-foreign-files`` to load
such a file anyway (docs/security.md).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from podracer_hpc.files.bounded import open_regular, read_open
from podracer_hpc.files.safeio import StateFileError

__all__ = ["ALLOW_FLAG", "ForeignFile", "check_owner", "group_of", "read_owned"]

ALLOW_FLAG = "--allow-foreign-files"  # the tools' override (named in the messages)


class ForeignFile(StateFileError):
    """A checkpoint or entry owned by neither this user nor a member of its run's group."""


def group_of(directory: str | os.PathLike) -> int | None:
    """The group of a run directory or leaderboard root (None if it cannot be read)."""
    try:
        return os.stat(directory).st_gid
    except OSError:
        return None


def _member(uid: int, gid: int) -> bool:
    """Whether user ``uid`` belongs to group ``gid`` (False when the system does not know it)."""
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    if user.pw_gid == gid:
        return True
    try:
        return user.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


def _open_to_all(directory: Path) -> bool:
    try:
        return bool(os.stat(directory).st_mode & stat.S_IWOTH)
    except OSError:
        return True


def _trusted(st: os.stat_result, gid: int | None, directory: Path) -> bool:
    """The module doc's rule (the directory is looked at only for another user's file of the run's group)."""
    if st.st_uid in (os.getuid(), 0):
        return True
    if gid is None:
        return False
    if st.st_gid == gid and not _open_to_all(directory):
        return True
    return _member(st.st_uid, gid)


def _name(uid: int, users: bool = True) -> str:
    try:
        return f"{uid} ({pwd.getpwuid(uid).pw_name if users else grp.getgrgid(uid).gr_name})"
    except KeyError:
        return str(uid)


def check_owner(path: str | os.PathLike, gid: int | None, st: os.stat_result | None = None) -> None:
    """Raise :class:`ForeignFile` if ``path`` is not trusted (the module doc) for a run whose
    group is ``gid``; ``st``: its stat if the caller has it (an open file's)."""
    path = Path(path)
    st = os.stat(path) if st is None else st
    if _trusted(st, gid, path.parent):
        return
    open_dir = _open_to_all(path.parent)
    run_group = "unknown" if gid is None else _name(gid, users=False)
    raise ForeignFile(
        f"{path}: owned by user {_name(st.st_uid)} and group {_name(st.st_gid, users=False)}, neither you nor "
        f"a member of the run's group {run_group}{' (its directory is writable by all users)' if open_dir else ''}: "
        f"refused, someone outside the run may have planted it. Load it only if you know who wrote it: "
        f"{ALLOW_FLAG}"
    )


def read_owned(
    path: str | os.PathLike, gid: int | None, limit: int, allow_foreign: bool = False, what: str = "file"
) -> bytes:
    """The bytes of the regular file ``path`` (a FIFO or a device refused without blocking), at most
    ``limit`` (:func:`podracer_hpc.files.bounded.read_open`), after :func:`check_owner` on the open
    file (``allow_foreign``: no check)."""
    fd = open_regular(path, what)
    try:
        if not allow_foreign:
            check_owner(path, gid, os.fstat(fd))
        return read_open(fd, path, limit, what)
    finally:
        os.close(fd)
