"""MPI communication for the tournament, with a world-of-one fallback.

This is the only module of podracer-hpc that imports :mod:`mpi4py`, and it does so lazily:
importing ``podracer_hpc.cluster.mpi`` never initializes MPI. :func:`get_comm` decides:

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

import math
import os
import pickle
import sys
import time
import warnings
from typing import Any, Callable

__all__ = [
    "abort_world",
    "Comm",
    "MeetingTimeout",
    "get_comm",
    "world_position",
    "launcher_env",
    "stop_tree_fanout",
    "stop_tree_neighbours",
]

# MPICH's own hygiene (the PMI netmod, stale shared-memory segments) lives in mpich.py
from podracer_hpc.cluster.mpich import clean_stale_mpich_segments, slurm_pmi2_netmod  # noqa: E402

# Seconds a rank that aborts the world waits first, so that the launcher forwards what it printed.
ABORT_GRACE_S = 0.5

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
            return rank_var, _env_int(env.get(size_var)) if size_var else None
    # srun without an MPI plugin still starts N tasks: MPI then tells whether they can talk.
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        n = _env_int(env.get("SLURM_STEP_NUM_TASKS"))
        if n is not None and n > 1:
            return "SLURM_STEP_NUM_TASKS", n
    return None, None


def _env_int(s: str | None) -> int | None:
    try:
        return int(s) if s is not None else None
    except ValueError:
        return None


_shm_checked = False  # the stale-segment clean-up ran in this process (mpich.clean_stale_mpich_segments)


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


class MeetingTimeout(RuntimeError):
    """A wait for every rank missed its deadline (:attr:`Comm.watch` said so).

    ``what``: the wait (``meeting``, ``allgather``, ``bcast``, ``barrier``, ``allreduce``,
    ``notices``); ``seq``: its number on this rank (:attr:`Comm.waits`); ``waited_s``: how long it
    waited. The world is left as it is: the caller names the absent ranks and ends it
    (:meth:`Comm.abort`)."""

    def __init__(self, what: str, seq: int, waited_s: float):
        super().__init__(f"{what} {seq}: not every rank came within {waited_s:.0f} s")
        self.what, self.seq, self.waited_s = what, seq, waited_s


# (seconds waited so far, the wait's number) -> whether the wait is overdue (then MeetingTimeout)
Watch = Callable[[float, int], bool]


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
        notices_sent, notices_received: stop notices this rank has sent and received.
        notice_hops: the hop count of the first notice this rank heard (1: from the rank that
            announced; None while it has heard none).
        notice_value: the value the first notice this rank heard carries (``announce_stop``'s
            ``value``: 0 for a plain stop; None while it has heard none).
        notified: the ranks this rank sent its notice to (at most once each).
        watch: None (waits have no deadline), or what decides that a wait for every rank is
            overdue: called with the seconds waited and the wait's number while a rank waits (at
            a meeting, before every collective, for the last stop notices); when it says so the
            wait raises :class:`MeetingTimeout`. The rank program's watch reads the heartbeats.
        waits: the number of waits for every rank this rank has begun (the watch's second argument).

    Besides collectives, ranks can tell each other to stop without waiting for anyone
    (:meth:`announce_stop`, :meth:`stop_announced`, :meth:`settle_notices`): small point-to-point
    messages on a communicator of their own, sent without blocking and polled without blocking.
    A notice floods a fixed tree of the ranks (:func:`stop_tree_neighbours`): the rank that
    announces, or first hears a notice, sends it once to each tree neighbour it has not heard
    one from, and never again. Every rank is reached; a rank sends at most ``fanout + 1`` =
    ``ceil(log2 N) + 1`` notices, all ranks together at most ``2(N - 1)`` (``N - 1`` when one
    rank announces), where all-to-all notices were ``N(N - 1)`` when Slurm signals every rank;
    the longest path is the tree's diameter, at most ``2 log_fanout N`` hops. Forwarding happens
    in the polls the rank makes anyway (:meth:`stop_announced` between updates) and while it
    waits at a meeting (:meth:`meet`), so a rank waiting for the others still passes notices on.
    """

    STOP_TAG = 75
    _WAIT_SLEEP_S = 0.002  # the longest nap between two polls while waiting at a meeting

    def __init__(self, mpi_comm: Any = None, note: str = "", launcher_size: int | None = None):
        self._comm = mpi_comm
        self.note = note
        self.launcher_size = launcher_size
        self.calls: dict[str, int] = {}
        self._requests: list[Any] = []  # this rank's stop notices in flight (isend requests)
        self._announced = False  # this rank announced a stop of its own
        self._heard_from: set[int] = set()  # the ranks this rank received a notice from
        self._spread = False  # this rank has sent its notice to its tree neighbours (once, ever)
        self.notices_sent = 0
        self.notices_received = 0
        self.notice_hops: int | None = None
        self.notice_value: int | None = None
        self._value = 0  # what this rank's notices carry (its own announcement's, or the first heard)
        self.notified: tuple[int, ...] = ()
        self.watch: Watch | None = None
        self.waits = 0
        self._MPI: Any = None
        if mpi_comm is None:
            self.rank, self.size = 0, 1
            self.local_rank, self.local_size, self.num_nodes = 0, 1, 1
            self._local = self._notices = None
        else:
            MPI = self._MPI = _import_mpi()
            self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
            self._local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            self.local_rank, self.local_size = self._local.Get_rank(), self._local.Get_size()
            self.num_nodes = int(mpi_comm.allreduce(1 if self.local_rank == 0 else 0))
            self._notices = mpi_comm.Dup()  # stop notices never mix with collectives' messages

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    # --- stopping without lock-step ------------------------------------------------------
    def announce_stop(self, value: int = 0) -> None:
        """Tell every other rank to stop (non-blocking; once per rank is enough).

        The notice goes to this rank's tree neighbours, which pass it on when they next poll
        (:meth:`stop_announced`, :meth:`meet`); a rank that already passed on another's notice
        sends nothing more: its neighbours have it. ``value`` (an int) travels with the notice and
        is what every rank that first hears it from this rank reads in :attr:`notice_value` (the
        rank program: 0 for a stop, else the env steps where a pod reached the run's target).
        """
        if self._notices is None or self._announced:
            return
        self._announced = True
        self._drain()  # a neighbour that already told this rank needs no notice back
        if not self._spread:
            self._value = int(value)
        self._spread_notice(hops=1)

    @property
    def announced(self) -> bool:
        """Whether this rank has announced a stop."""
        return self._announced

    def stop_announced(self) -> bool:
        """Whether another rank has announced a stop (non-blocking: a local probe, no collective).

        A rank's first notice is passed on here, before this returns: to every tree neighbour
        but the ones it came from, without blocking.
        """
        if self._notices is None:
            return False
        self._poll()
        return self.notices_received > 0

    def _drain(self) -> None:
        """Receive every notice that has arrived (no forwarding)."""
        MPI = self._MPI
        while self._notices.iprobe(source=MPI.ANY_SOURCE, tag=self.STOP_TAG):
            self._heard(*self._notices.recv(source=MPI.ANY_SOURCE, tag=self.STOP_TAG))

    def _heard(self, sender: int, hops: int, value: int) -> None:
        """One notice received: count it; the first one heard sets the hops and value passed on."""
        self.notices_received += 1
        self._heard_from.add(sender)
        if self.notice_hops is None:
            self.notice_hops, self.notice_value = hops, value
            if not self._spread:
                self._value = value

    def _poll(self) -> None:
        """Receive what has arrived; on the first notice, pass it on."""
        self._drain()
        if self.notice_hops is not None and not self._spread:
            self._spread_notice(hops=self.notice_hops + 1)

    def _spread_notice(self, hops: int) -> None:
        if self._spread:
            return
        self._spread = True
        dests = [r for r in stop_tree_neighbours(self.rank, self.size) if r not in self._heard_from]
        self._requests += [
            self._notices.isend((self.rank, hops, self._value), dest=r, tag=self.STOP_TAG) for r in dests
        ]
        self.notices_sent += len(dests)
        self.notified = tuple(dests)

    def meet(self, make: Callable[[], Any]) -> list[Any]:
        """A meeting of every rank: wait until all have come, passing stop notices on meanwhile,
        then gather ``make()`` from each (the list is indexed by rank).

        The wait is a non-blocking barrier polled with short naps, so a rank that waits at a
        round or at the end still forwards the notice that the ranks behind it in the tree
        need. ``make`` is called after the wait: no rank sends a notice after its part of the
        meeting is made, so a part can say exactly what its rank sent (:attr:`notified`).
        """
        if self._notices is not None:
            self._count("ibarrier")
            self._await_all("meeting")
        return self._allgather(make())

    def _await_all(self, what: str) -> None:
        """A non-blocking barrier, polled with short naps (stop notices passed on meanwhile); with a
        :attr:`watch`, asked while waiting whether the wait is overdue (then :class:`MeetingTimeout`)."""
        self.waits += 1
        req, nap, t0 = self._comm.Ibarrier(), 1e-4, time.monotonic()
        while not req.Test():
            self._poll()
            if self.watch is not None and self.watch(time.monotonic() - t0, self.waits):
                raise MeetingTimeout(what, self.waits, time.monotonic() - t0)
            time.sleep(nap)
            nap = min(2 * nap, self._WAIT_SLEEP_S)

    def _guard(self, what: str) -> None:
        """Before a blocking collective: with a :attr:`watch`, every rank must first come to a
        watched barrier, so a rank that never comes ends the wait at its deadline (not counted
        in :attr:`calls`: it is the collective's own wait)."""
        if self.watch is not None and self._comm is not None:
            self._await_all(what)

    def settle_notices(self, notified: list[tuple[int, ...]]) -> None:
        """After the ranks' last meeting (``notified[r]``: the ranks rank r sent notices to, as
        its part of that meeting said), receive the notices still in flight and complete this
        rank's sends, so MPI can finalize cleanly. Notices received here are not passed on."""
        if self._notices is None:
            return
        expected = sum(1 for dests in notified if self.rank in dests)
        self.waits += 1
        t0, tag, anyone = time.monotonic(), self.STOP_TAG, self._MPI.ANY_SOURCE
        while self.notices_received < expected:
            while not self._notices.iprobe(source=anyone, tag=tag):
                if self.watch is not None and self.watch(time.monotonic() - t0, self.waits):
                    raise MeetingTimeout("notices", self.waits, time.monotonic() - t0)
                time.sleep(self._WAIT_SLEEP_S)
            self._heard(*self._notices.recv(source=anyone, tag=tag))
        for req in self._requests:
            req.wait()
        self._requests = []

    @property
    def is_mpi(self) -> bool:
        return self._comm is not None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def allgather(self, obj: Any) -> list[Any]:
        """Gather one small picklable object from every rank; the list is indexed by rank."""
        self._guard("allgather")
        return self._allgather(obj)

    def _allgather(self, obj: Any) -> list[Any]:
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
        self._guard("bcast")
        return self._comm.bcast(obj, root=root)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        self._count("barrier")
        if self._comm is not None and self.watch is not None:
            self._await_all("barrier")
        elif self._comm is not None:
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
        self._guard("allreduce")
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


def stop_tree_fanout(size: int) -> int:
    """The fan-out of the stop notices' tree for ``size`` ranks: ``max(2, ceil(log2 size))``.

    A hop costs up to one update (a notice is passed on when a rank next polls) and a send
    costs next to nothing (non-blocking), so the tree is wide: ``ceil(log2 N)`` children keep a
    rank's sends within ``ceil(log2 N) + 1`` and cut the depth to ``log_fanout N`` (3 at 64
    ranks, 4 at 4,096).
    """
    return max(2, math.ceil(math.log2(size))) if size > 1 else 2


def stop_tree_neighbours(rank: int, size: int) -> list[int]:
    """``rank``'s neighbours in the tree that stop notices flood: its parent (none for rank 0)
    and its children, in a complete ``stop_tree_fanout(size)``-ary tree of the ranks rooted at 0
    (rank r's children are ``f*r + 1 .. f*r + f``)."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} not in a world of {size}")
    f = stop_tree_fanout(size)
    parent = [(rank - 1) // f] if rank > 0 else []
    return parent + list(range(f * rank + 1, min(size, f * rank + f + 1)))


def abort_world(errorcode: int) -> tuple[int, int]:
    """Abort every rank of the MPI world with ``errorcode`` if this process is one of several;
    returns ``(rank, size)`` (``(0, 1)``: no MPI world, nothing aborted, the caller exits itself).

    For a rank that stops on an error while the others go on to their next collective, where
    they would wait for it forever (a full disk, a bad log or checkpoint on one rank). Makes no
    :class:`Comm` (its construction is itself a collective the others never enter)."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return 0, 1
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if size > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        # The launcher forwards a rank's output asynchronously and stops forwarding when it tears
        # the world down: without a moment's grace the error this rank just printed can be lost.
        time.sleep(ABORT_GRACE_S)
        world.Abort(errorcode)
    return rank, size


def world_position() -> tuple[int, int]:
    """``(rank, size)`` of this process in an initialized MPI world, ``(0, 1)`` otherwise; a
    local query (no collective, unlike making a :class:`Comm`)."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return 0, 1
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


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
        note = f"world of one: launcher variable {var} is set but MPI is unavailable ({type(e).__name__}: {e})"
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
