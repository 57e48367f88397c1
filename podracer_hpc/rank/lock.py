"""The run directory's writer lock for a world of ranks: rank 0 takes it for the whole world (its
ranks are one writer; a pool's part locks only its own pods) and sweeps what killed writers of
these pods left; every rank learns the outcome, so a refused world ends on every rank with exit 2
(none waits for rank 0) and nothing of the live writer's is touched."""

from __future__ import annotations

from typing import Any, Callable

from podracer_hpc.files.rundir import PoolPart, RunDir, RunDirLocked, RunLock, take_lock

__all__ = ["take_world_lock"]


def take_world_lock(comm: Any, rundir: RunDir, part: PoolPart, say: Callable[[str], None]) -> RunLock | None:
    """The lock (rank 0; None on the other ranks). Raises :class:`RunDirLocked` on every rank when
    a live writer holds it, ``OSError`` when rank 0 could not take it."""
    pods = part.pods(comm.size)
    outcome, error, lock = ("ok", ""), None, None
    if comm.rank == 0:
        try:
            lock, note = take_lock(rundir, part, pods)
            outcome = ("ok", note)
        except RunDirLocked as e:
            outcome = ("locked", str(e))
        except OSError as e:
            error, outcome = e, ("os", f"{e.strerror or e}: {e.filename}")
    kind, text = comm.allgather(outcome)[0]
    if error is not None:
        raise error
    if kind == "locked":
        raise RunDirLocked(text)
    if kind == "os":
        raise OSError(text)
    if text:
        say(text)
    if lock is not None:
        count, size = rundir.sweep_debris(pods, before=lock.record["since"])
        if count:
            say(f"removed {count} temporary file(s) ({size / 2**20:.1f} MiB) that killed writes left in {rundir.root}")
    return lock
