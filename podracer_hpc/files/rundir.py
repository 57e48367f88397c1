"""The run directory: the one module that knows its layout, the job's identity and exit codes.

``--run-dir`` (default ``runs/<name>``)::

    config.yaml                       the resolved config (rank 0, at the first start)
    summary.json                      the run's summary (assembled from pods/ by a job's rank 0 at its end;
                                      also its last line of stdout)
    pods/pod<i>.json                  pod i's part of the summary, written when it ends (done or stopped)
    pool.json                         a pool of several jobs (podracer submit --pods-per-job): its shape and
                                      each part's last job id (a resubmission starts only the parts needed)
    logs/<name>_rank<r>.h5            pod r's HDF5 log (h5log.py; r: the pod's index in the pool, which is
                                      its MPI rank unless the pool runs as several jobs)
    checkpoints/rank<r>.safetensors   pod r's state (+ .prev, the one before; r: its pool index, as in the log's name)
    leaderboard/                      the default leaderboard (tournament.leaderboard_dir overrides)
    rounds/<i>.json                   the leaderboard listing round i decided on (exact redo)
    rounds/part<k>/<i>.json           the same, of part k of a pool of several jobs (each part decides its own)
    heartbeats/pod<i>.json            pod i's heartbeat: host, device, what it does, its last update (heartbeat.py)
    parts/part<k>.json                part k's aggregate: its pods' heartbeats, written by its rank 0 every
                                      log.aggregate_interval_s (podracer status reads these, not every log)
    parts/part<k>.hung.json           part k missed a meeting's deadline: the ranks that did not come, named
    retries.jsonl                     one row per retry of a part (podracer submit --wait --retries, podracer
                                      resume): part, old and new job, reason, excluded nodes (retries.py)
    slurm/<job id>/                   submitit's per-task stdout/stderr
    code/<id>/                        the code snapshot a submitted job runs (launch/snapshot.py)
    launch.log                        a local run's mpiexec output (podracer submit --executor local)
    launch-part<i>.log                the same, of part i of a local pool of several jobs (--pods-per-job)
    task<i>/                          array task i's own run directory (podracer submit --array)
    writer.lock                       who writes the run now (host, pid, start time, job): one writer per
                                      run directory (:func:`take_lock`); writer-part<i>.lock: part i of a pool
                                      of several jobs (each part writes its own pods)

``rank<r>`` in a file name is the pod's pool index (the names predate pools of several jobs, and
users' scripts read them: docs/decisions.md); in the code it is ``pod``.

Directories are made group-private (0o750, :func:`make_dirs`), whatever the umask.

Nothing here imports torch, h5py or MPI.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from podracer_hpc.files.bounded import read_json

__all__ = [
    "DIR_MODE",
    "EXIT_BAD_INPUT",
    "EXIT_HUNG",
    "EXIT_OK",
    "EXIT_REQUEUE",
    "PoolPart",
    "RunDir",
    "RunDirLocked",
    "RunLock",
    "describe_owner",
    "git_revision",
    "job_id",
    "lock_owner",
    "locked_message",
    "make_dirs",
    "owner_alive",
    "process_alive",
    "process_start",
    "slurm_ids",
    "take_lock",
]

_LOG_RE = re.compile(r"^(?P<name>.+)_rank(?P<pod>\d+)\.h5$")  # rank<r>: the pod's pool index
_LOCK_RE = re.compile(r"^writer(-part\d+)?\.lock$")

DIR_MODE = 0o750  # run directories and their folders: the owner writes, the group reads, nobody else

EXIT_OK = 0
EXIT_BAD_INPUT = 2  # config, checkpoint, log or run directory is wrong; the message says what to do
EXIT_REQUEUE = 75  # EX_TEMPFAIL: stopped early with every rank checkpointed; run again to resume
# a rank missed a meeting's deadline (tournament.meeting_timeout_s): it is named in parts/part<k>.hung.json
# and on stderr, the world was ended; the checkpoints are intact, so the part can be retried alone
EXIT_HUNG = 76


def job_id(environ: dict[str, str] | None = None) -> str:
    """``<array job>_<task>`` for an array task, the Slurm job id, else ``local``."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_ARRAY_JOB_ID", env.get("SLURM_JOB_ID", "local"))
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_JOB_ID" in env:
        job += f"_{env['SLURM_ARRAY_TASK_ID']}"
    return job


@dataclass(frozen=True)
class PoolPart:
    """Which pods of the pool one MPI world runs: part ``index`` of ``count`` (``podracer submit
    --pods-per-job``: each part its own job, failure domain and MPI world, all of them one run
    directory and one leaderboard). Part i of a pool of worlds of n ranks runs pods i*n .. i*n+n-1;
    a single job is part 0 of 1 (pod index = MPI rank)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str, environ: Mapping[str, str] | None = None) -> "PoolPart":
        """``"1/4"`` -> part 1 of 4; ``"auto"``: this Slurm array task's (tasks 0..N-1 of an
        ``sbatch --array=0-<N-1>`` of a template); raises ValueError with what is wrong."""
        if str(text).strip() == "auto":
            env = os.environ if environ is None else environ
            try:
                task, count = int(env["SLURM_ARRAY_TASK_ID"]), int(env["SLURM_ARRAY_TASK_COUNT"])
                lo, hi = int(env.get("SLURM_ARRAY_TASK_MIN", 0)), int(env.get("SLURM_ARRAY_TASK_MAX", count - 1))
            except (KeyError, ValueError):
                raise ValueError(
                    "--pool-part auto takes the part from a Slurm job array (sbatch --array=0-<N-1>), "
                    "but this is not an array task; give INDEX/COUNT"
                ) from None
            if (lo, hi) != (0, count - 1):
                raise ValueError(
                    f"--pool-part auto: the array's tasks are {lo}-{hi} ({count} of them); a pool's parts "
                    f"are 0..N-1: submit with --array=0-{count - 1}"
                )
            text = f"{task}/{count}"
        a, sep, b = str(text).partition("/")
        if not sep or not a.strip().isdigit() or not b.strip().isdigit():
            raise ValueError(f"--pool-part {text!r}: expected INDEX/COUNT, e.g. 0/4")
        part = cls(int(a), int(b))
        if part.count < 1 or part.index >= part.count:
            raise ValueError(f"--pool-part {text!r}: INDEX must be 0..COUNT-1 and COUNT >= 1")
        return part

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def pod(self, rank: int, world: int) -> int:
        """The pool index of MPI rank ``rank`` of this part's world of ``world`` ranks."""
        return self.index * world + rank

    def pods(self, world: int) -> range:
        """This part's pods (pool indices)."""
        return range(self.index * world, (self.index + 1) * world)

    def identity(self, run_root: Path, job: str) -> str:
        """The job name a pod's leaderboard entries carry: the job id of a single job; for a pool of
        several jobs one name for all (from the run directory), stable when a part is resubmitted
        under a new job id (its population entries stay its own)."""
        if self.count == 1:
            return job
        return f"pool{zlib.crc32(str(Path(run_root).resolve()).encode()):08x}"


def slurm_ids(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The Slurm ids of this process (job, array task, step, rank, node, restart count)."""
    env = os.environ if environ is None else environ
    keys = (
        "SLURM_JOB_ID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_STEP_ID",
        "SLURM_PROCID",
        "SLURM_NODEID",
        "SLURM_JOB_NODELIST",
        "SLURM_RESTART_COUNT",
    )
    return {k: env[k] for k in keys if k in env}


def git_revision(environ: Mapping[str, str] | None = None) -> str:
    """The revision of the code this process runs: ``PODRACER_GIT_REVISION`` (set by the
    launchers from the job's code snapshot), else the snapshot file next to the package
    (``SNAPSHOT.json``), else ``git`` in the package's checkout; ``<rev>-dirty`` when the
    checkout had uncommitted changes, ``unknown`` when none of these says."""
    env = os.environ if environ is None else environ
    if env.get("PODRACER_GIT_REVISION"):
        return env["PODRACER_GIT_REVISION"]
    pkg = Path(__file__).resolve().parents[1]  # podracer_hpc/
    snap = pkg.parent / "SNAPSHOT.json"
    if snap.is_file():
        try:
            return str(read_json(snap, what="snapshot record")["revision"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        rev = subprocess.run(
            ["git", "-C", str(pkg), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        if rev:
            dirty = subprocess.run(
                ["git", "-C", str(pkg), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


class RunDir:
    """Paths of one run directory (nothing is created by constructing it)."""

    def __init__(self, root: str | os.PathLike, name: str = ""):
        self.root = Path(root)
        self.name = name  # the run's name (log file names); "" to only read a run directory

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    def summary_signature(self) -> tuple[int, int, int] | None:
        """Identity of the summary.json there now (None if none): taken at submission, so that an
        earlier run's summary in a reused run directory is never taken for a new job's (no clocks
        compared: a shared filesystem's server clock may differ from this host's)."""
        try:
            st = self.summary.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def log(self, pod: int) -> Path:
        """Pod ``pod``'s HDF5 log (``rank<pod>``: the pod's pool index, as in every file name here)."""
        return self.logs_dir / f"{self.name}_rank{pod}.h5"

    def pod_logs(self) -> dict[int, Path]:
        """``{pod: log}`` of the logs present, by pool index; where a pod has several (a run resumed
        under another name), the newest."""
        out: dict[int, Path] = {}
        if not self.logs_dir.is_dir():
            return out
        for p in self.logs_dir.iterdir():
            m = _LOG_RE.match(p.name)
            if not m:
                continue
            r = int(m["pod"])
            try:
                if r not in out or p.stat().st_mtime > out[r].stat().st_mtime:
                    out[r] = p
            except FileNotFoundError:
                continue
        return dict(sorted(out.items()))

    def looks_like_run(self) -> bool:
        """Whether this is (or is becoming) a run directory: a config.yaml or pod logs."""
        return self.config.exists() or bool(self.pod_logs())

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint_path(self, pod: int) -> Path:
        """Pod ``pod``'s checkpoint file (``rank<pod>``: the pod's pool index, as in every file name here)."""
        return self.checkpoints_dir / f"rank{pod}.safetensors"

    def checkpoint_pods(self) -> list[int]:
        """Pool indices of the pods that have a checkpoint (or its .prev) here."""
        pods = set()
        for p in self.checkpoints_dir.glob("rank*"):
            head = p.name.split(".", 1)[0][4:]
            if head.isdigit() and p.name.endswith((".safetensors", ".prev")):
                pods.add(int(head))
        return sorted(pods)

    @property
    def pods_dir(self) -> Path:
        return self.root / "pods"

    def pod_record(self, pod: int) -> Path:
        """Pod ``pod``'s part of the summary (poolsummary.py), written when it ends."""
        return self.pods_dir / f"pod{pod}.json"

    @property
    def pool_file(self) -> Path:
        """A pool of several jobs: its shape and each part's job (launch/pooljobs.py)."""
        return self.root / "pool.json"

    def leaderboard(self, shared_dir: str = "") -> Path:
        """The leaderboard directory: ``shared_dir`` if given, else ``<run>/leaderboard``."""
        return Path(shared_dir) if shared_dir else self.root / "leaderboard"

    def round_listing(self, index: int, part: int | None = None) -> Path:
        """The listing collective round ``index`` decided on; ``part``: of that part of a pool of
        several jobs (each part is its own world and holds its own rounds: never another's listing)."""
        if part is None:
            return self.root / "rounds" / f"{index}.json"
        return self.root / "rounds" / f"part{part}" / f"{index}.json"

    @property
    def heartbeats_dir(self) -> Path:
        return self.root / "heartbeats"

    def heartbeat(self, pod: int) -> Path:
        """Pod ``pod``'s heartbeat (files/heartbeat.py): rewritten while it runs."""
        return self.heartbeats_dir / f"pod{pod}.json"

    @property
    def parts_dir(self) -> Path:
        return self.root / "parts"

    def part_aggregate(self, part: int) -> Path:
        """Part ``part``'s aggregate of its pods' heartbeats, written by its world's rank 0."""
        return self.parts_dir / f"part{part}.json"

    def part_hang(self, part: int) -> Path:
        """Part ``part``'s record of a missed meeting deadline (the ranks that did not come)."""
        return self.parts_dir / f"part{part}.hung.json"

    @property
    def retries_file(self) -> Path:
        """The rows of the parts' retries (files/retries.py)."""
        return self.root / "retries.jsonl"

    @property
    def slurm_folder(self) -> Path:
        """submitit's folder: per-job (``%j``) task logs and pickles."""
        return self.root / "slurm" / "%j"

    def slurm_logs(self, job: str) -> Path:
        return self.root / "slurm" / str(job)

    @property
    def code_dir(self) -> Path:
        return self.root / "code"

    @property
    def launch_log(self) -> Path:
        return self.root / "launch.log"

    def part_launch_log(self, part: int) -> Path:
        """Part ``part``'s mpiexec output, for a local pool of several jobs."""
        return self.root / f"launch-part{part}.log"

    def task(self, index: int) -> Path:
        """Array task ``index``'s own run directory."""
        return self.root / f"task{index}"

    def lock_file(self, part: "PoolPart | None" = None) -> Path:
        """The writer lock of a whole run (``writer.lock``) or of part i of a pool of several jobs
        (``writer-part<i>.lock``: each part writes only its own pods)."""
        if part is None or part.count == 1:
            return self.root / "writer.lock"
        return self.root / f"writer-part{part.index}.lock"

    @staticmethod
    def is_lock(name: str) -> bool:
        """Whether a file name in the run directory is a writer lock."""
        return bool(_LOCK_RE.match(name))

    def debris(self, pods: range | list[int], before: float) -> list[Path]:
        """Temporary files that writers of ``pods`` left when killed mid-write, last modified before
        ``before`` (a live writer's temporary is younger than its lock): checkpoint writes
        (``.rank<r>.safetensors.<hex>.tmp``, ``rank<r>.prev.tmp``), pod records and log rebuilds."""
        want = []
        for p in pods:
            want += [
                (self.checkpoints_dir, f".rank{p}.safetensors.*.tmp"),
                (self.checkpoints_dir, f"rank{p}.prev.tmp"),
                (self.pods_dir, f".pod{p}.json.*.tmp"),
                (self.logs_dir, f".*_rank{p}.h5.recover.tmp"),
            ]
        out = []
        for folder, pattern in want:
            for f in folder.glob(pattern):
                try:
                    if f.is_file() and not f.is_symlink() and f.stat().st_mtime < before:
                        out.append(f)
                except OSError:
                    continue
        return sorted(out)

    def sweep_debris(self, pods: range | list[int], before: float) -> tuple[int, int]:
        """Remove :meth:`debris`; returns how many files and how many bytes went."""
        count = size = 0
        for f in self.debris(pods, before):
            try:
                n = f.stat().st_size
                f.unlink()
            except OSError:
                continue
            count, size = count + 1, size + n
        return count, size


def make_dirs(path: str | os.PathLike, mode: int = DIR_MODE) -> Path:
    """``mkdir -p``, each folder it creates given exactly ``mode`` (group-private, whatever the
    umask: under ``umask 000`` a plain mkdir makes folders anyone may write into). Folders that
    exist are left as they are."""
    path = Path(path)
    missing = []
    p = path
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            if not d.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "a file stands where a directory is needed", str(d)) from None
            continue
        os.chmod(d, mode)
    return path


# ------------------------------------------------------------------------------------------
# One writer per run directory
# ------------------------------------------------------------------------------------------
class RunDirLocked(RuntimeError):
    """Another live process writes this run directory (the message names it and what to do)."""


_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF}


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """When process ``pid`` of this host started (boot id and clock ticks since boot, from
    ``/proc``), or "" where that cannot be told: with the pid, it names one process for good (a
    pid alone is reused by the next process the system starts)."""
    try:
        ticks = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""
    return f"{_boot_id()}:{ticks}"


def process_alive(pid: int, start: str = "") -> bool:
    """Whether process ``pid`` runs on this host (a zombie nobody reaped yet does not) and, given
    the ``start`` that :func:`process_start` recorded for it, is still that process (not another
    that reuses its pid)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return False
    try:
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            return False
    except (OSError, IndexError):
        return True  # no /proc: it answered the signal
    now = process_start(pid)
    return not (start and now and now != start)


def lock_owner(path: str | os.PathLike) -> dict | None:
    """The owner a writer lock names (host, pid, start, since, job, part), None if there is none
    (no file, an empty one, or not a lock's record). Reads only."""
    try:
        raw = Path(path).read_bytes()[:65536]
        rec = json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and "pid" in rec and "host" in rec else None


def owner_alive(rec: dict) -> bool | None:
    """Whether a lock's owner runs: True or False on its own host (pid and start time), None from
    another host (only its filesystem lock, or Slurm, can tell)."""
    if rec.get("host") != socket.gethostname():
        return None
    try:
        pid = int(rec.get("pid", 0))
    except (TypeError, ValueError):
        return False
    return process_alive(pid, str(rec.get("start") or ""))


def describe_owner(rec: dict) -> str:
    """``host pid 123 (job 456, part 1/2), writing since 2026-... (5 min ago)``."""
    since = rec.get("since")
    when = ""
    if isinstance(since, (int, float)):
        ago = max(0.0, time.time() - since)
        span = f"{ago:.0f} s" if ago < 120 else f"{ago / 60:.0f} min" if ago < 7200 else f"{ago / 3600:.1f} h"
        when = f", writing since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))} ({span} ago)"
    extra = [f"job {rec['job']}"] if rec.get("job") not in (None, "", "local") else []
    if rec.get("part") not in (None, "", "0/1"):
        extra.append(f"part {rec['part']}")
    return f"{rec.get('host')} pid {rec.get('pid')}" + (f" ({', '.join(extra)})" if extra else "") + when


class RunLock:
    """A run directory's writer lock, held by this process until :meth:`release` (or its death).

    The lock file names its owner (host, pid, the process's start time, since when, the job); the
    file is also ``flock``-ed where the filesystem supports it (a lock the kernel drops when its
    owner dies, on any host that shares the filesystem's locks). Liveness, as pools of several
    jobs check it: the flock first; without one, the pid and its start time on the owner's host,
    and a Slurm job's requeued run takes over its own earlier run's lock."""

    def __init__(self, path: Path, fd: int, record: dict):
        self.path, self.fd, self.record = path, fd, record

    def release(self) -> None:
        """Remove the lock file (if it still names this process) and drop the flock."""
        if self.fd < 0:
            return
        try:
            if lock_owner(self.path) == self.record:
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = -1


def _open_locked(path: Path) -> tuple[int, bool | None]:
    """Open (create) the lock file and try its flock: (fd, True) held, (fd, False) someone holds
    it, (fd, None) the filesystem has no flock. Retries when the file was replaced meanwhile
    (its owner released it: the name now holds another file)."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    for _ in range(20):
        fd = os.open(path, flags, 0o640)
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held: bool | None = True
        except BlockingIOError:
            return fd, False
        except ImportError:
            return fd, None
        except OSError as e:
            if e.errno in _NO_FLOCK:
                return fd, None
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, held
        os.close(fd)
    raise RunDirLocked(f"{path}: the lock file keeps being replaced; another writer is starting: try again")


def take_lock(
    rundir: RunDir, part: PoolPart, pods: range, environ: Mapping[str, str] | None = None
) -> tuple[RunLock, str]:
    """Become the one writer of ``rundir`` (of ``part``'s ``pods`` for a pool of several jobs).

    Returns the lock and a note ("" or which dead writer's lock was taken over); raises
    :class:`RunDirLocked` naming the live writer and what to do, OSError when the directory
    cannot be written at all."""
    env = os.environ if environ is None else environ
    make_dirs(rundir.root)
    path = rundir.lock_file(part)
    fd, held = _open_locked(path)
    try:
        old = lock_owner(path)
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start": process_start(os.getpid()),
            "since": time.time(),
            "job": job_id(dict(env)),
            "restart": str(env.get("SLURM_RESTART_COUNT", "0")),
            "part": str(part),
            "pods": [pods.start, pods.stop],
        }
        why = _live_reason(old, me, held)
        if why:
            raise RunDirLocked(locked_message(rundir, path, old, why))
        for other in _sibling_locks(rundir, part):
            rec = lock_owner(other)
            if rec is not None and owner_alive(rec):
                raise RunDirLocked(locked_message(rundir, other, rec, "it runs"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fchmod(fd, 0o640)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    note = ""
    if old is not None and not (old.get("host") == me["host"] and old.get("pid") == me["pid"]):
        note = f"took over the writer lock of {describe_owner(old)}: that process is gone ({path})"
    return RunLock(path, fd, me), note


def _live_reason(old: dict | None, me: dict, held: bool | None) -> str:
    """Why the lock's recorded owner must be taken for a live writer ("" when it is gone)."""
    if held is False:
        return "it holds the lock file's flock"
    if old is None:
        return ""
    if old.get("host") == me["host"] and old.get("pid") == me["pid"] and old.get("start") == me["start"]:
        return ""  # this process's own earlier lock (a train() that ended without releasing it)
    alive = owner_alive(old)
    if alive is not None:
        return "it runs" if alive else ""
    if (
        old.get("job") not in (None, "", "local")
        and old.get("job") == me["job"]
        and old.get("restart") != me["restart"]
    ):
        return ""  # this Slurm job's run before its requeue: Slurm ended every process of it
    if held:
        return ""  # the flock was free: its owner is gone (the kernel drops a dead process's flock)
    return "this filesystem has no flock, and its host is another: nothing here can tell whether it still runs"


def _sibling_locks(rundir: RunDir, part: PoolPart) -> list[Path]:
    """The locks that a writer of ``part`` must also find free: a whole run's and a pool part's
    exclude each other (their pods overlap); the parts of one pool do not."""
    if part.count > 1:
        return [rundir.lock_file()]
    try:
        return sorted(p for p in rundir.root.glob("writer-part*.lock") if rundir.is_lock(p.name))
    except OSError:
        return []


def locked_message(rundir: RunDir, path: Path, old: dict | None, why: str) -> str:
    """Why a second writer does not start: who writes (host, pid, since when), how to stop it, and
    the lock file to delete only when that process is surely gone."""
    who = describe_owner(old) if old is not None else "another process (it is taking the lock now)"
    pid = old.get("pid") if old else None
    stop = f"kill -USR2 {pid} on {old.get('host')} stops it with a checkpoint" if pid else "stop it"
    if old and old.get("job") not in (None, "", "local"):
        stop = f"scancel --signal=USR2 {old['job']} stops it with a checkpoint"
    return (
        f"{rundir.root} is being written by another podracer process: {who} ({why}; {path}). "
        "Two writers would overwrite each other's checkpoints, logs and summary, so this one does not start. "
        f"Wait for it to end, or stop it ({stop}) and run this again to resume; or use another --run-dir. "
        f"Only if you are sure that process is gone, delete {path}."
    )
