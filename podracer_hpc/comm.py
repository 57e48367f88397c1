"""MPI communication for the tournament, with a world-of-one fallback.

This is the only module of podracer-hpc that imports :mod:`mpi4py`, and it does so lazily:
importing ``podracer_hpc.comm`` never initializes MPI. :func:`get_comm` decides:

- ``mode="none"`` (or ``PODRACER_COMM=none``): a world of one, MPI is never touched.
- ``mode="auto"`` (default): MPI only when a launcher started this process (``mpiexec``/
  ``mpirun`` of MPICH, Open MPI, MVAPICH, Cray PALS, or a multi-task ``srun`` step); otherwise a
  world of one. If mpi4py or the MPI library is missing or fails to load, a world of one too:
  no crash, :attr:`Comm.note` says why and a :class:`RuntimeWarning` is emitted when a launcher
  asked for more than one rank.
- ``mode="mpi"`` (or ``PODRACER_COMM=mpi``): always use MPI (a singleton ``python x.py`` run
  initializes MPI as a world of one); failing to load it raises.

All collectives here are the pickle-based lowercase mpi4py ones: meant for small Python objects
(floats, ints, dicts of floats, small dataclasses), never for tensors.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import re
import stat
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

__all__ = ["Comm", "get_comm", "launcher_env", "slurm_pmi2_netmod", "pypi_mpich", "clean_stale_mpich_segments",
           "mpich_world_id"]

# Variables that MPI launchers put in each rank's environment, with the size they claim (if any).
_LAUNCHER_VARS: tuple[tuple[str, str | None], ...] = (
    ("PMI_RANK", "PMI_SIZE"),  # MPICH hydra, Intel MPI, srun --mpi=pmi2
    ("PMIX_RANK", "PMIX_SIZE"),  # srun --mpi=pmix, Open MPI 5 (PMIX_SIZE is rarely set)
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI mpirun
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),  # MVAPICH
    ("PALS_RANKID", None),  # Cray PALS (aprun/mpiexec on HPE Cray EX)
)


def launcher_env(environ: dict[str, str] | None = None) -> tuple[str | None, int | None]:
    """Whether an MPI launcher (or a multi-task ``srun`` step) started this process.

    Returns ``(variable, claimed_size)``: the environment variable that gave it away (None when
    no launcher is detected) and the world size the launcher announced (None if unknown).
    A batch script itself (``SLURM_NTASKS`` set, but no ``srun`` step) is not a launch.
    """
    env = os.environ if environ is None else environ
    for rank_var, size_var in _LAUNCHER_VARS:
        if rank_var in env:
            return rank_var, _int_or_none(env.get(size_var)) if size_var else None
    # srun without an MPI plugin still starts N tasks: MPI then tells whether they can talk.
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        n = _int_or_none(env.get("SLURM_STEP_NUM_TASKS"))
        if n is not None and n > 1:
            return "SLURM_STEP_NUM_TASKS", n
    return None, None


def _int_or_none(s: str | None) -> int | None:
    try:
        return int(s) if s is not None else None
    except ValueError:
        return None


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
        print("podracer: MPIR_CVAR_CH4_NETMOD=ofi (the PyPI mpich wheel under srun --mpi=pmi2: its UCX addresses "
              "overflow Slurm's 1024-byte PMI-1 reads; set MPIR_CVAR_CH4_NETMOD to choose another)",
              file=sys.stderr, flush=True)
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
# cluster: 100% CPU in PMPI_Init_thread from the first requeue of a killed job on; issue 11).
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
_shm_checked = False


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


def clean_stale_mpich_segments(environ: dict[str, str] | None = None, shm_dir: str = SHM_DIR,
                               orphan_age_s: float = ORPHAN_AGE_S, wait_s: float = 60.0) -> list[str]:
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
        print(f"podracer: removed {len(removed)} MPICH shared-memory segment(s) left in {shm_dir} by killed "
              f"ranks of earlier runs ({', '.join(removed)})", file=sys.stderr, flush=True)
    if kept_live:
        print(f"podracer: warning: {', '.join(kept_live)} in {shm_dir} is from an earlier start of this job step "
              "but a live process still maps it; MPI_Init may hang (kill the leftover ranks)", file=sys.stderr,
              flush=True)
    return removed


def _import_mpi() -> Any:
    """Import (and thereby initialize) mpi4py.MPI. Separate so tests can simulate failures.

    The one place MPI starts in podracer (submitit tasks, sbatch templates, mpiexec alike), so
    the one place stale shared memory of killed earlier starts is removed first.
    """
    global _shm_checked
    slurm_pmi2_netmod()
    if not _shm_checked and "mpi4py.MPI" not in sys.modules:
        _shm_checked = True
        if os.environ.get("PODRACER_SHM_CLEANUP", "1") != "0":
            clean_stale_mpich_segments()
    from mpi4py import MPI  # noqa: PLC0415  (lazy on purpose)

    return MPI


class Comm:
    """A communicator: MPI ``COMM_WORLD`` or a world of one.

    Attributes:
        rank, size: this process's rank and the number of ranks.
        local_rank, local_size: rank and size within this node (MPI shared-memory split);
            0 and 1 in a world of one.
        num_nodes: number of nodes (shared-memory groups) in the world.
        is_mpi: whether MPI is in use.
        launcher_size: the world size the launcher announced, if any. ``launcher_size > 1``
            with ``size == 1`` means every process thinks it is alone (see :attr:`note`).
        note: a human-readable line on how the communicator was chosen, and why it fell back.
        calls: how many collectives of each kind this rank has entered (a test counts them per
            update: the training loop must enter none).

    Besides collectives, ranks can tell each other to stop without waiting for anyone
    (:meth:`announce_stop`, :meth:`stop_announced`, :meth:`settle_notices`): small point-to-point
    messages on a communicator of their own, sent without blocking and polled without blocking.
    """

    STOP_TAG = 75

    def __init__(self, mpi_comm: Any = None, note: str = "", launcher_size: int | None = None):
        self._comm = mpi_comm
        self.note = note
        self.launcher_size = launcher_size
        self.calls: dict[str, int] = {}
        self._sent: list[Any] = []  # requests of this rank's stop notices
        self._received = 0  # stop notices received from other ranks
        if mpi_comm is None:
            self.rank, self.size = 0, 1
            self.local_rank, self.local_size, self.num_nodes = 0, 1, 1
            self._local = self._notices = None
        else:
            MPI = _import_mpi()
            self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
            self._local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            self.local_rank, self.local_size = self._local.Get_rank(), self._local.Get_size()
            self.num_nodes = int(mpi_comm.allreduce(1 if self.local_rank == 0 else 0))
            self._notices = mpi_comm.Dup()  # stop notices never mix with collectives' messages

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    # --- stopping without lock-step ------------------------------------------------------
    def announce_stop(self) -> None:
        """Tell every other rank to stop (non-blocking; once per rank is enough)."""
        if self._notices is None or self._sent:
            return
        self._sent = [self._notices.isend(self.rank, dest=r, tag=self.STOP_TAG)
                      for r in range(self.size) if r != self.rank]

    @property
    def announced(self) -> bool:
        """Whether this rank has announced a stop."""
        return bool(self._sent)

    def stop_announced(self) -> bool:
        """Whether another rank has announced a stop (non-blocking: a local probe, no collective)."""
        if self._notices is None:
            return False
        got = False
        while self._notices.iprobe(source=_import_mpi().ANY_SOURCE, tag=self.STOP_TAG):
            self._notices.recv(source=_import_mpi().ANY_SOURCE, tag=self.STOP_TAG)
            self._received += 1
            got = True
        return got or self._received > 0

    def settle_notices(self, announced: list[bool]) -> None:
        """After the ranks' last meeting (``announced[r]``: rank r announced a stop), receive the
        notices still in flight and complete this rank's sends, so MPI can finalize cleanly."""
        if self._notices is None:
            return
        expected = sum(1 for r, a in enumerate(announced) if a and r != self.rank)
        while self._received < expected:
            self._notices.recv(source=_import_mpi().ANY_SOURCE, tag=self.STOP_TAG)
            self._received += 1
        for req in self._sent:
            req.wait()
        self._sent = []

    @property
    def is_mpi(self) -> bool:
        return self._comm is not None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def allgather(self, obj: Any) -> list[Any]:
        """Gather one small picklable object from every rank; the list is indexed by rank."""
        self._count("allgather")
        if self._comm is None:
            return [_copy(obj)]
        return self._comm.allgather(obj)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Broadcast ``obj`` from ``root``; other ranks' argument is ignored (pass None)."""
        self._count("bcast")
        if self._comm is None:
            if root != 0:
                raise ValueError(f"root={root} in a world of one")
            return _copy(obj)
        return self._comm.bcast(obj, root=root)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        self._count("barrier")
        if self._comm is not None:
            self._comm.Barrier()

    def allreduce_sum(self, value: float | int) -> float | int:
        """Sum of a number over all ranks."""
        return self._allreduce(value, "SUM", sum)

    def allreduce_max(self, value: float | int) -> float | int:
        """Maximum of a number over all ranks."""
        return self._allreduce(value, "MAX", max)

    def _allreduce(self, value: Any, op: str, fallback: Callable[[list[Any]], Any]) -> Any:
        self._count("allreduce")
        if self._comm is None:
            return fallback([value])
        MPI = _import_mpi()
        return self._comm.allreduce(value, op=getattr(MPI, op))

    def abort(self, errorcode: int = 1) -> None:
        """Abort every rank (use when one rank fails and the others would wait forever)."""
        if self._comm is not None:
            self._comm.Abort(errorcode)
        raise SystemExit(errorcode)

    def __repr__(self) -> str:
        kind = "MPI" if self.is_mpi else "world-of-one"
        return (
            f"Comm({kind}, rank={self.rank}/{self.size}, local_rank={self.local_rank}/"
            f"{self.local_size}, nodes={self.num_nodes}, note={self.note!r})"
        )


def _copy(obj: Any) -> Any:
    """What an MPI collective returns: a copy made by pickling (also catches unpicklable objects)."""
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def get_comm(mode: str | None = None) -> Comm:
    """Return the world communicator (see the module docstring for ``mode``).

    ``mode`` defaults to the ``PODRACER_COMM`` environment variable, else ``"auto"``.
    """
    mode = (mode or os.environ.get("PODRACER_COMM") or "auto").lower()
    if mode not in ("auto", "mpi", "none"):
        raise ValueError(f"comm mode must be 'auto', 'mpi' or 'none', got {mode!r}")
    if mode == "none":
        return Comm(note="world of one: MPI disabled (mode 'none')")

    var, claimed = launcher_env()
    if mode == "auto" and var is None:
        return Comm(note="world of one: no MPI launcher detected (no PMI_*/PMIX_*/OMPI_* variables)")

    try:
        MPI = _import_mpi()
        world = MPI.COMM_WORLD
        comm = Comm(world, launcher_size=claimed)
    except Exception as e:  # ImportError (no mpi4py), RuntimeError (no libmpi), MPI errors
        if mode == "mpi":
            raise RuntimeError(f"MPI requested (mode 'mpi') but unavailable: {type(e).__name__}: {e}") from e
        note = (
            f"world of one: launcher variable {var} is set but MPI is unavailable "
            f"({type(e).__name__}: {e})"
        )
        if claimed is not None and claimed > 1:
            note += f"; the launcher started {claimed} processes that will each run alone"
            warnings.warn(note, RuntimeWarning, stacklevel=2)
        return Comm(note=note, launcher_size=claimed)

    lib = _library_version(MPI)
    comm.note = f"MPI ({lib}): {comm.size} rank(s) on {comm.num_nodes} node(s)"
    if var is not None:
        comm.note += f", detected via {var}"
    if claimed is not None and comm.size != claimed:
        comm.note += (
            f"; WARNING: the launcher announced {claimed} ranks but MPI sees {comm.size}: "
            "mpi4py is linked to another MPI than the launcher's, or srun lacks --mpi=pmix/pmi2"
        )
        warnings.warn(comm.note, RuntimeWarning, stacklevel=2)
    return comm


def _library_version(MPI: Any) -> str:
    try:
        return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())[:60]
    except Exception:
        return "unknown library"
