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
    checkpoints/rank<r>.safetensors   pod r's state (+ .prev, the one before)
    leaderboard/                      the default leaderboard (tournament.leaderboard_dir overrides)
    rounds/<i>.json                   the leaderboard listing round i decided on (exact redo)
    slurm/<job id>/                   submitit's per-task stdout/stderr
    code/<id>/                        the code snapshot a submitted job runs (launch/snapshot.py)
    launch.log                        a local run's mpiexec output (podracer submit --executor local)
    launch-part<i>.log                the same, of part i of a local pool of several jobs (--pods-per-job)
    task<i>/                          array task i's own run directory (podracer submit --array)

Nothing here imports torch, h5py or MPI.
"""

from __future__ import annotations

import os
import re
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from podracer_hpc.files.bounded import read_json

__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "EXIT_REQUEUE", "PoolPart", "RunDir", "git_revision", "job_id", "slurm_ids"]

_LOG_RE = re.compile(r"^(?P<name>.+)_rank(?P<rank>\d+)\.h5$")

EXIT_OK = 0
EXIT_BAD_INPUT = 2  # config, checkpoint, log or run directory is wrong; the message says what to do
EXIT_REQUEUE = 75  # EX_TEMPFAIL: stopped early with every rank checkpointed; run again to resume


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

    def log(self, rank: int) -> Path:
        return self.logs_dir / f"{self.name}_rank{rank}.h5"

    def rank_logs(self) -> dict[int, Path]:
        """``{rank: log}`` of the logs present; where a rank has several (a run resumed under
        another name), the newest."""
        out: dict[int, Path] = {}
        if not self.logs_dir.is_dir():
            return out
        for p in self.logs_dir.iterdir():
            m = _LOG_RE.match(p.name)
            if not m:
                continue
            r = int(m["rank"])
            try:
                if r not in out or p.stat().st_mtime > out[r].stat().st_mtime:
                    out[r] = p
            except FileNotFoundError:
                continue
        return dict(sorted(out.items()))

    def looks_like_run(self) -> bool:
        """Whether this is (or is becoming) a run directory: a config.yaml or rank logs."""
        return self.config.exists() or bool(self.rank_logs())

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, rank: int) -> Path:
        return self.checkpoints_dir / f"rank{rank}.safetensors"

    def checkpoint_ranks(self) -> list[int]:
        """Ranks that have a checkpoint (or its .prev) here."""
        ranks = set()
        for p in self.checkpoints_dir.glob("rank*"):
            head = p.name.split(".", 1)[0][4:]
            if head.isdigit() and p.name.endswith((".safetensors", ".prev")):
                ranks.add(int(head))
        return sorted(ranks)

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

    def round_listing(self, index: int) -> Path:
        return self.root / "rounds" / f"{index}.json"

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
