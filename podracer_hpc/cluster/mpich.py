"""MPICH hygiene: what the PyPI ``mpich`` wheel needs before MPI starts, kept apart from the
mpi4py wrapper (comm.py). No mpi4py here: the launcher asks :func:`pypi_mpich` which MPI the
ranks will load without starting one.

- :func:`pypi_mpich`: whether mpi4py here loads the wheel's ``libmpi`` (it speaks PMI-1/2 only);
- :func:`slurm_pmi2_netmod`: under Slurm's pmi2 plugin, the wheel's OFI netmod (its UCX
  addresses overflow Slurm's 1024-byte PMI-1 reads);
- :func:`clean_stale_mpich_segments`: shared-memory segments that killed ranks of an earlier
  start left in /dev/shm, removed before this start's MPI_Init (else it can spin forever).
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import sys
import time
from pathlib import Path

__all__ = ["ORPHAN_AGE_S", "SHM_DIR", "clean_stale_mpich_segments", "mpich_world_id", "pypi_mpich", "slurm_pmi2_netmod"]


def pypi_mpich() -> str | None:
    """The PyPI ``mpich`` wheel's ``libmpi`` when it is the MPI that mpi4py loads here (mpi4py 4
    tries the environment's own ``lib/`` before the system's), else None (a site MPI, conda's,
    or ``MPI4PY_LIBMPI`` naming another)."""
    if os.environ.get("MPI4PY_LIBMPI"):
        return None
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("mpich")
    except (ImportError, PackageNotFoundError):
        return None
    for f in dist.files or []:
        if Path(str(f)).name == "libmpi.so.12":
            path = Path(str(dist.locate_file(f))).resolve()
            return str(path) if path.exists() else None
    return None


def slurm_pmi2_netmod(environ: dict[str, str] | None = None, wheel: bool | None = None) -> str | None:
    """Under Slurm's pmi2 plugin, make the PyPI mpich wheel use its OFI netmod (unless the user
    chose one), and say so.

    Slurm's ``mpi/pmi2`` server reads a PMI-1 request with one ``read()`` of at most 1024 bytes
    (measured on Slurm 22.05, Debian's; tests/slurm checks it). MPICH 5.0.2 (the PyPI ``mpich``
    wheel) speaks PMI-1 and sends its UCX business cards in segments of up to 1024 value characters,
    so a ``cmd=put ... value=...`` line can be longer than one read: Slurm then parses the tail as
    a new request ("mpi/pmi2: invalid client request") and ``MPI_Init`` fails with "Destination
    is unreachable" or hangs. Whether a line overflows depends on how well the address bytes
    compress, so it failed some starts and not others. The OFI netmod's addresses are a few
    dozen bytes: one short put, no overflow. Only for the wheel (``wheel``, default: detected by
    :func:`pypi_mpich`): a site's MPICH, MVAPICH or Cray MPICH under pmi2 keeps its own netmod, and
    an explicit ``MPIR_CVAR_CH4_NETMOD`` (e.g. ``ucx`` on a site whose Slurm reads whole lines) is
    kept. Rank 0 prints a line when it sets the variable.

    Returns the value set, or None when nothing was changed.
    """
    env = os.environ if environ is None else environ
    if env.get("SLURM_MPI_TYPE", "").lower() != "pmi2" or env.get("MPIR_CVAR_CH4_NETMOD"):
        return None
    if not (pypi_mpich() is not None if wheel is None else wheel):
        return None
    env["MPIR_CVAR_CH4_NETMOD"] = "ofi"
    if env.get("SLURM_PROCID", "0") == "0":
        print(
            "podracer: MPIR_CVAR_CH4_NETMOD=ofi (the PyPI mpich wheel under srun --mpi=pmi2: its UCX addresses "
            "overflow Slurm's 1024-byte PMI-1 reads; set MPIR_CVAR_CH4_NETMOD to choose another)",
            file=sys.stderr,
            flush=True,
        )
    return "ofi"


# ------------------------------------------------------------------------------------------
# Stale MPICH shared-memory segments: clean them before MPI starts
# ------------------------------------------------------------------------------------------
# MPICH 4/5 (the PyPI ``mpich`` wheel) puts each node's intra-node queues in a POSIX shared
# memory segment named ``/dev/shm/mpich_shm_<world id>_<node id>`` (and ``mpich_vci_...``),
# where the world id is the 32-bit FNV-1a hash of the PMI kvs name (src/mpid/ch4/shm/posix/
# posix_init.c, src/util/mpir_pmi.c). The first rank of a node creates it with O_EXCL and is
# its "root"; the others open it and wait for the root's ready flags; the root unlinks it in
# MPI_Finalize. A rank that is killed (scontrol requeue, scancel, a time limit, SIGKILL) never
# finalizes, so the segment stays. Under ``srun --mpi=pmi2`` the kvs name is
# ``<job id>.<step id>`` (``PMI_JOBID``), the same again when a requeued job starts its step 0:
# every rank of the new start then opens the old segment, none is root, the old ready flags
# and queue state are taken for this start's, and MPI_Init spins forever (seen on the local
# cluster: 100% CPU in PMPI_Init_thread from the first requeue of a killed job on).
# Under mpiexec (Hydra) the kvs name holds mpiexec's pid, so a killed run only leaks 2 MB.
#
# So before MPI starts, each rank takes a POSIX record lock (fcntl) in a per-user lock file in
# /dev/shm, on the byte whose offset is its world id:
# - exclusive and non-blocking first: it gets it only when no live rank of this job step on
#   this host is past this point (a live rank holds a shared lock on that byte until it exits;
#   the kernel drops it when the process dies). Then every segment of this world id is from an
#   earlier start: it is removed (unless some live process still maps it: never touch a
#   mapping). The lock is then turned into a shared one (atomic for fcntl locks) and kept.
# - otherwise another rank of this start (on this or another logical node of the same host)
#   already cleaned: wait for a shared lock and go on.
# The lock file lives where the segments live, so its scope is exactly theirs: one host, or one
# container with a private /dev/shm; different logical nodes on one host share it correctly.
# The same pass removes the leftovers of other dead runs (Hydra runs, other job steps) of this
# user: only segments no live process maps, whose world id no live podracer rank holds, and
# older than ORPHAN_AGE_S (a live MPICH job maps its segment from creation, microseconds after
# shm_open, until its end; its ranks attach during MPI_Init, and unlinking an attached segment
# does not disturb them: the age also covers a job whose processes this one cannot see, in
# another pid namespace sharing /dev/shm). Other users' segments are never touched.
SHM_DIR = "/dev/shm"
ORPHAN_AGE_S = 600.0
_MPICH_SEGMENT = re.compile(r"mpich_(?:shm|vci)_([0-9a-f]{1,8})_[0-9]+")
_shm_lock_fd: int | None = None  # held open (with the shared lock) for the life of the rank


def mpich_world_id(kvsname: str) -> str:
    """MPICH's world id of a PMI kvs name, as it appears in its segment names (FNV-1a, hex)."""
    h = 2166136261
    for b in kvsname.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return f"{h:x}"


def _mapped_inodes() -> set[tuple[int, int]]:
    """(device, inode) of every file that a live process maps (those whose maps we may read)."""
    found: set[tuple[int, int]] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[4] != "0":
                        major, minor = parts[3].split(":")
                        found.add((os.makedev(int(major, 16), int(minor, 16)), int(parts[4])))
        except (OSError, ValueError):
            continue  # gone, or another user's process (their segments are not ours to remove)
    return found


def _lock(fd: int, kind: int, offset: int) -> bool:
    try:
        fcntl.lockf(fd, kind, 1, offset)
        return True
    except OSError:
        return False


def clean_stale_mpich_segments(
    environ: dict[str, str] | None = None,
    shm_dir: str = SHM_DIR,
    orphan_age_s: float = ORPHAN_AGE_S,
    wait_s: float = 60.0,
) -> list[str]:
    """Remove MPICH segments left by killed ranks before this rank starts MPI (see above).

    Returns the names removed. Keeps the lock file open (a shared lock on this job step's byte)
    for the life of the process when the job step is known (``PMI_JOBID``, set by Slurm's pmi2
    plugin). Never raises: a host without /dev/shm, or one where the lock cannot be taken, is
    left alone.
    """
    global _shm_lock_fd
    env = os.environ if environ is None else environ
    if not os.path.isdir(shm_dir):
        return []
    own = mpich_world_id(env["PMI_JOBID"]) if env.get("PMI_JOBID") else None
    try:
        fd = os.open(os.path.join(shm_dir, f"podracer-mpich-{os.geteuid()}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return []
    own_clean = False
    if own is not None:
        own_clean = _lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, int(own, 16))
        if not own_clean:  # another rank of this start is cleaning or has cleaned: wait for it
            end = time.monotonic() + wait_s
            while not _lock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, int(own, 16)) and time.monotonic() < end:
                time.sleep(0.05)
    removed, kept_live = [], []
    mapped: set[tuple[int, int]] | None = None
    try:
        names = sorted(os.listdir(shm_dir))
    except OSError:
        names = []
    for name in names:
        m = _MPICH_SEGMENT.fullmatch(name)
        if not m:
            continue
        wid, path = m.group(1), os.path.join(shm_dir, name)
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
            continue
        mine = wid == own
        if mine and not own_clean:
            continue  # made by a live rank of this start
        if not mine:
            if time.time() - max(st.st_mtime, st.st_ctime) < orphan_age_s:
                continue  # maybe a live job between shm_open and mmap
            if not _lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, int(wid, 16)):
                continue  # a live podracer rank of that job step holds it
        try:
            if mapped is None:
                mapped = _mapped_inodes()
            if (st.st_dev, st.st_ino) in mapped:
                if mine:
                    kept_live.append(name)
                continue
            os.unlink(path)
            removed.append(name)
        except OSError:
            pass
        finally:
            if not mine:
                _lock(fd, fcntl.LOCK_UN, int(wid, 16))
    if own_clean:
        _lock(fd, fcntl.LOCK_SH, int(own, 16))  # atomic downgrade: the next ranks go on at once
    if own is not None:
        _shm_lock_fd = fd  # closing any fd of the file would drop this process's locks
    else:
        os.close(fd)
    if removed:
        print(
            f"podracer: removed {len(removed)} MPICH shared-memory segment(s) left in {shm_dir} by killed "
            f"ranks of earlier runs ({', '.join(removed)})",
            file=sys.stderr,
            flush=True,
        )
    if kept_live:
        print(
            f"podracer: warning: {', '.join(kept_live)} in {shm_dir} is from an earlier start of this job step "
            "but a live process still maps it; MPI_Init may hang (kill the leftover ranks)",
            file=sys.stderr,
            flush=True,
        )
    return removed
