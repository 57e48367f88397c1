"""Launching jobs: Slurm through submitit, or this machine through mpiexec. The only module
that imports submitit.

``podracer submit JOB.yaml`` validates everything it can before anything is queued (the job
file, the resource request, the partition as ``sinfo`` knows it), then starts the job's ranks:

- ``slurm``: one submitit job (or job array) whose tasks are the pods of one MPI world
  (``srun --mpi=pmix|pmi2``, one rank per GPU, bound: ``--gpus-per-task=1``; ``--cpus-per-task``
  given to srun too). Each task runs :class:`RankProgram` from a code snapshot in the run
  directory (``<run dir>/code/<id>``: the package and the job file as they were at submission),
  so that a requeue days later runs the same code whatever happened to the checkout since.
- ``local``: ``mpiexec -n <ranks> podracer train ...`` on this machine, no cluster needed.

``--dry-run`` needs no Slurm: without ``sbatch``/``sinfo`` the request is checked as far as it
can be here and the script is printed; ``sinfo`` checks (partition, nodes, CPUs, GPUs, time
limit) and ``srun --mpi=list`` run where Slurm is installed.

Preemption and time limits: Slurm warns the ranks with a signal (submitit's USR2); every rank
finishes its update and checkpoints, then rank 0 requeues the job (``scontrol requeue``) and
the ranks exit without a result, so the requeued job resumes from the run directory and the
submitter's ``--wait`` keeps waiting.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit
from submitit.slurm.slurm import _make_sbatch_string

from .config import Config, ConfigError, load_config



class LaunchError(ValueError):
    """A request that cannot be right, or a job that failed; the message says which and why."""


class SlurmUnreachable(LaunchError):
    """Slurm's commands are here but do not answer (no slurm.conf, slurmctld down)."""


@dataclass
class Request:
    """What ``podracer submit`` was asked for (the resolved, validated form)."""

    job_file: str
    overrides: list[str]
    executor: str = "local"  # local | slurm
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    array: list[int] = field(default_factory=list)  # array task ids; empty = no array
    array_parallelism: int = 0  # %P throttle; 0 = no limit
    partition: str = ""
    account: str = ""
    time_min: int = 60
    # srun --mpi plugin matching the MPI of mpi4py: pmix for a site's Open MPI / HPC-X (the default,
    # as slurm_templates/site.sh), pmi2 for the PyPI mpich wheel (and MPICH/MVAPICH builds)
    mpi: str = "pmix"
    run_dir: str = ""
    shared_leaderboard: bool = True  # array tasks share one leaderboard (elastic join between tasks)
    signal_delay_s: int = 90
    cpus_per_task: int = 0  # 0: Slurm's default (one CPU per task)
    mem: str = ""  # per node, sbatch syntax: 64G, 0 (all of it)
    exclusive: bool = False
    qos: str = ""
    constraint: str = ""
    job_name: str = ""  # default podracer-<config name>
    mail_type: str = ""
    mail_user: str = ""
    dependency: str = ""
    sbatch: list[str] = field(default_factory=list)  # KEY=VALUE (or KEY) passed to sbatch as --KEY=VALUE
    gpu_bind: str = "per-task"  # per-task: srun --gpus-per-task=1 (one bound GPU per pod); none: all visible
    hdf5_locking: str = ""  # HDF5_USE_FILE_LOCKING for the ranks: "" = the environment's, else BEST_EFFORT
    cache_dir: str = ""  # per-node compile caches; "" = /tmp/podracer-cache-$USER on each node
    snapshot: bool = True  # run a frozen copy of the code (slurm executor)

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node


def parse_array(spec: str) -> tuple[list[int], int]:
    """``"3"`` -> [0, 1, 2]; ``"0-4%2"`` -> ([0..4], 2); ``"1,3,5"`` -> [1, 3, 5]."""
    m = re.fullmatch(r"([0-9,\-]+)(?:%([0-9]+))?", spec.strip())
    if not m:
        raise LaunchError(f"--array {spec!r}: expected N, A-B or A,B,C, optionally followed by %P")
    body, par = m.group(1), int(m.group(2) or 0)
    ids: list[int] = []
    if re.fullmatch(r"[0-9]+", body):
        ids = list(range(int(body)))
    else:
        for part in body.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                if not (a.isdigit() and b.isdigit()) or int(a) > int(b):
                    raise LaunchError(f"--array {spec!r}: bad range {part!r}")
                ids += range(int(a), int(b) + 1)
            elif part.isdigit():
                ids.append(int(part))
            else:
                raise LaunchError(f"--array {spec!r}: bad element {part!r}")
    if not ids:
        raise LaunchError(f"--array {spec!r}: no tasks")
    return sorted(set(ids)), par


def _sinfo(fmt: str, partition: str = "") -> list[str]:
    cmd = ["sinfo", "-h", "-o", fmt] + (["-p", partition] if partition else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise SlurmUnreachable(f"sinfo failed ({last}); is Slurm reachable from here?")
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def slurm_minutes(text: str) -> int | None:
    """A Slurm time limit ("infinite", "30", "1:00:00", "2-12:00:00", "1-0") in minutes; None = no limit."""
    t = text.strip().lower()
    if t in ("infinite", "unlimited", "n/a", ""):
        return None
    days, _, rest = t.rpartition("-")
    try:
        d = int(days) if days else 0
        parts = [int(x) for x in rest.split(":")] if rest else [0]
    except ValueError:
        return None
    if days:  # days-hours[:minutes[:seconds]]
        parts = parts + [0] * (3 - len(parts))
        h, m, sec = parts[:3]
    elif len(parts) == 3:
        h, m, sec = parts
    elif len(parts) == 2:
        h, m, sec = 0, parts[0], parts[1]
    else:
        h, m, sec = 0, parts[0], 0
    return d * 1440 + h * 60 + m  # seconds dropped: a limit of 45:30 admits --time 45, not 46


# sbatch options that have a submit option of their own, or that the launcher sets itself
OWN_SBATCH = {
    "nodes": "--nodes", "ntasks-per-node": "--tasks-per-node", "gpus-per-node": "--gpus-per-node",
    "partition": "--partition", "account": "--account", "time": "--time", "array": "--array",
    "cpus-per-task": "--cpus-per-task", "mem": "--mem", "exclusive": "--exclusive", "qos": "--qos",
    "constraint": "--constraint", "job-name": "--job-name", "mail-type": "--mail-type", "mail-user": "--mail-user",
    "dependency": "--dependency", "output": "", "error": "", "open-mode": "", "signal": "", "requeue": "",
    "ntasks": "--nodes and --tasks-per-node", "gpus-per-task": "--gpus-per-node (one bound GPU per pod)",
}
MAIL_TYPES = {"NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
              "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"}
HDF5_LOCKING = {"best-effort": "BEST_EFFORT", "true": "TRUE", "false": "FALSE"}


def parse_sbatch(items: list[str]) -> dict[str, Any]:
    """``--sbatch KEY=VALUE`` (or a bare ``KEY`` for a flag) items -> {key: value}; refuses keys
    that have a submit option of their own or that the launcher must set."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().lstrip("-").replace("_", "-").lower()
        if not re.fullmatch(r"[a-z][a-z0-9-]+", key):
            raise LaunchError(f"--sbatch {item!r}: expected a long sbatch option name, KEY=VALUE or KEY "
                              "(e.g. --sbatch reservation=dgx --sbatch hint=nomultithread)")
        if key in OWN_SBATCH:
            use = OWN_SBATCH[key]
            raise LaunchError(f"--sbatch {item!r}: " + (f"use podracer submit {use} instead" if use else
                              f"--{key} is set by podracer submit itself (logs in the run dir, the signal "
                              "that checkpoints, requeue)"))
        out[key] = value if eq else True
    return out


def _slurm_here() -> bool:
    return shutil.which("sbatch") is not None


def validate(req: Request, dry_run: bool = False) -> Config:
    """Check the request and the job file; raises LaunchError/ConfigError before anything is queued.

    ``dry_run``: nothing will be submitted, so Slurm need not be installed: what needs ``sinfo``
    or ``srun`` is checked only where they exist.
    """
    if not Path(req.job_file).is_file():
        raise LaunchError(f"job file {req.job_file!r} not found (jobs live in jobs/*.yaml)")
    cfg = load_config(req.job_file, req.overrides)
    if req.executor not in ("local", "slurm"):
        raise LaunchError(f"--executor must be local or slurm, got {req.executor!r}")
    if req.nodes < 1:
        raise LaunchError(f"--nodes must be >= 1, got {req.nodes}")
    if req.tasks_per_node < 1:
        raise LaunchError(f"--tasks-per-node must be >= 1, got {req.tasks_per_node}")
    if req.gpus_per_node < 0:
        raise LaunchError(f"--gpus-per-node must be >= 0, got {req.gpus_per_node}")
    if req.gpus_per_node and req.tasks_per_node > req.gpus_per_node:
        raise LaunchError(
            f"--tasks-per-node {req.tasks_per_node} > --gpus-per-node {req.gpus_per_node}: a pod is one rank "
            "on one GPU; ask for as many GPUs as tasks per node (or fewer tasks)"
        )
    if req.time_min < 1:
        raise LaunchError(f"--time must be >= 1 minute, got {req.time_min}")
    if req.mpi not in ("pmi2", "pmix", "none"):
        raise LaunchError(f"--mpi must be pmi2, pmix or none, got {req.mpi!r}")
    if req.cpus_per_task < 0:
        raise LaunchError(f"--cpus-per-task must be >= 1 (0 = Slurm's default), got {req.cpus_per_task}")
    if req.mem and not re.fullmatch(r"[0-9]+[KMGT]?B?", req.mem.upper()):
        raise LaunchError(f"--mem {req.mem!r}: expected a size per node such as 64G, 500M or 0 (all of the node's)")
    bad = [t for t in req.mail_type.upper().split(",") if t and t not in MAIL_TYPES] if req.mail_type else []
    if bad:
        raise LaunchError(f"--mail-type {req.mail_type!r}: {', '.join(bad)} unknown; use {', '.join(sorted(MAIL_TYPES))}")
    for opt, value in (("--qos", req.qos), ("--constraint", req.constraint), ("--job-name", req.job_name),
                       ("--mail-user", req.mail_user), ("--dependency", req.dependency), ("--partition", req.partition),
                       ("--account", req.account)):
        if value and (re.search(r"\s", value) or "\n" in value):
            raise LaunchError(f"{opt} {value!r}: no spaces")
    parse_sbatch(req.sbatch)
    if req.gpu_bind not in ("per-task", "none"):
        raise LaunchError(f"--gpu-bind must be per-task or none, got {req.gpu_bind!r}")
    if req.hdf5_locking and req.hdf5_locking.lower() not in HDF5_LOCKING:
        raise LaunchError(f"--hdf5-locking must be best-effort, true or false, got {req.hdf5_locking!r}")
    if cfg.tournament.mode != "none" and req.ranks < 2 and not req.array:
        print(f"note: a tournament of {req.ranks} pod; ask for more tasks to make it a pool", file=sys.stderr)
    if req.executor == "slurm":
        if not _slurm_here() and not dry_run:
            raise LaunchError("--executor slurm, but there is no sbatch here: run on a login node, or use "
                              "--executor local (--dry-run shows the script without Slurm)")
        if cfg.device.startswith("cuda") and not req.gpus_per_node:
            raise LaunchError(f"the job file says device: {cfg.device}, but --gpus-per-node is 0: ask for one GPU per "
                              f"pod (--gpus-per-node {req.tasks_per_node}) or --set device=auto")
        if req.gpus_per_node > req.tasks_per_node:
            print(f"note: {req.gpus_per_node} GPUs per node for {req.tasks_per_node} pod(s) per node: "
                  f"{req.gpus_per_node - req.tasks_per_node} stay idle (one GPU per pod)", file=sys.stderr)
        if req.mpi == "pmix" and comm_pypi_mpich():
            message = ("--mpi pmix, but mpi4py here loads the PyPI mpich wheel, which speaks PMI-1/2 only: each rank "
                       "would start alone. Use --mpi pmi2 with the wheel, or a site MPI (Open MPI/HPC-X) with pmix "
                       "(docs/slurm-templates.md, 'MPI')")
            if not dry_run:
                raise LaunchError(message)
            print(f"note: {message}", file=sys.stderr)
        if not _slurm_here():
            print("note: no Slurm here: the script is not checked against a cluster (partition, nodes, CPUs, GPUs, "
                  "time limit, MPI plugins)", file=sys.stderr)
        else:
            try:
                _check_against_slurm(req)
            except SlurmUnreachable as e:
                if not dry_run:
                    raise
                print(f"note: {e}: the script is not checked against the cluster", file=sys.stderr)
    else:
        if req.nodes > 1:
            raise LaunchError("--executor local runs on this machine: use --nodes 1 (and --tasks-per-node for the pods)")
    return cfg


def comm_pypi_mpich() -> str | None:
    from .comm import pypi_mpich

    return pypi_mpich()


def _gres_gpus(text: str) -> int:
    """GPUs in a node's GRES as sinfo prints it (``gpu:8``, ``gpu:h100:8(S:0-1)``, ``(null)``)."""
    return sum(int(m) for m in re.findall(r"gpu(?::[A-Za-z0-9_.-]+)?:([0-9]+)", text))


def _check_against_slurm(req: Request) -> None:
    """What sinfo and srun can tell before anything is queued (a request that could never start)."""
    parts = [p.rstrip("*") for p in _sinfo("%P")]
    if req.partition and req.partition not in parts:
        raise LaunchError(f"--partition {req.partition!r} does not exist; partitions here: {', '.join(parts)}")
    part = req.partition or next((p.rstrip("*") for p in _sinfo("%P") if p.endswith("*")), "")
    if part:
        total = sum(int(x) for x in _sinfo("%D", part) if x.isdigit())
        if total and req.nodes > total:
            raise LaunchError(f"--nodes {req.nodes}: partition {part!r} has only {total} nodes")
        limits = [m for m in (slurm_minutes(x) for x in _sinfo("%l", part)) if m is not None]
        if limits and req.time_min > max(limits):
            raise LaunchError(f"--time {req.time_min}: partition {part!r} allows at most {max(limits)} minutes "
                              "(sinfo -o %l); the job would never start")
        cpus = [int(re.sub(r"[^0-9]", "", x)) for x in _sinfo("%c", part) if re.sub(r"[^0-9]", "", x)]
        want = req.tasks_per_node * max(1, req.cpus_per_task)
        if cpus and want > max(cpus):
            raise LaunchError(f"--tasks-per-node {req.tasks_per_node} x --cpus-per-task {max(1, req.cpus_per_task)} = "
                              f"{want} CPUs per node: the nodes of partition {part!r} have at most {max(cpus)} "
                              "(sinfo -o %c); the job would never start")
        gpus = [_gres_gpus(x) for x in _sinfo("%G", part)]
        if gpus and req.gpus_per_node > max(gpus):
            raise LaunchError(f"--gpus-per-node {req.gpus_per_node}: the nodes of partition {part!r} have at most "
                              f"{max(gpus)} GPUs (sinfo -o %G); the job would never start")
        if gpus and max(gpus) and not req.gpus_per_node:
            print(f"note: the nodes of partition {part!r} have {max(gpus)} GPUs each, but the job asks for none "
                  f"(--gpus-per-node): its pods run on the CPU", file=sys.stderr)
    if req.mpi != "none" and shutil.which("srun"):
        try:
            out = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=30)
            text = out.stdout + out.stderr  # "MPI plugin types are...", one per line; "...available: pmix_v4"
            plugins = ({ln.strip() for ln in text.splitlines() if re.fullmatch(r"[a-z0-9_]+", ln.strip())}
                       | set(re.findall(r"\bpmix_v[0-9]+\b", text))) if out.returncode == 0 else set()
        except (OSError, subprocess.TimeoutExpired):
            plugins = set()
        if plugins and not any(p == req.mpi or p.startswith(req.mpi + "_") for p in plugins):
            raise LaunchError(f"--mpi {req.mpi}: this Slurm has no such MPI plugin (srun --mpi=list: "
                              f"{', '.join(sorted(plugins))}); use the one that matches the MPI of mpi4py")


def run_dir_for(req: Request, cfg: Config) -> Path:
    return Path(req.run_dir or Path("runs") / cfg.name).resolve()


def task_overrides(req: Request, cfg: Config, task: int | None) -> tuple[list[str], Path]:
    """The ``--set`` list and run dir of one (array) task."""
    base = run_dir_for(req, cfg)
    sets = list(req.overrides)
    if task is None:
        return sets, base
    sets.append(f"seed={cfg.seed + 1000 * task}")
    if req.shared_leaderboard and not cfg.tournament.leaderboard_dir:
        sets.append(f"tournament.leaderboard_dir={base / 'leaderboard'}")
    return sets, base / f"task{task}"


# ------------------------------------------------------------------------------------------
# Code snapshot: what a (requeued) job runs
# ------------------------------------------------------------------------------------------
@dataclass
class Snapshot:
    """The frozen code of a submission: ``<run dir>/code/<id>/`` holds ``podracer_hpc/`` (the
    package that submitted, dirty or not), the job file (its own name: the run's default name is
    the file's stem) and ``SNAPSHOT.json``
    (revision, dirty flag, where it came from). ``id`` is a digest of all of them, so a resubmission
    of unchanged code reuses it. The ranks import the package from here (``PYTHONPATH``, with
    ``PYTHONSAFEPATH=1`` so that a checkout in the working directory does not come first)."""

    path: Path
    id: str
    revision: str
    dirty: bool
    source: Path
    files: list[Path]
    job_text: bytes
    job_name: str

    @property
    def job_file(self) -> Path:
        return self.path / self.job_name


def _package_files(pkg: Path) -> list[Path]:
    return sorted(p for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in (".pyc", ".pyo") and not p.name.startswith(".nfs"))


def plan_snapshot(base: Path, job_file: str) -> Snapshot:
    """The snapshot this submission will run (computed; nothing is written)."""
    from .device import code_revision

    pkg = Path(__file__).resolve().parent
    files = _package_files(pkg)
    job_text = Path(job_file).read_bytes()
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes() + b"\0")
    job_name = Path(job_file).name
    h.update(job_name.encode() + b"\0" + job_text)
    revision = code_revision({})
    sid = h.hexdigest()[:12]
    return Snapshot(base / "code" / sid, sid, revision, revision.endswith("-dirty"), pkg, files, job_text, job_name)


def make_snapshot(snap: Snapshot) -> Snapshot:
    """Write the snapshot (once: an existing one with this id is the same code) atomically."""
    if (snap.path / "SNAPSHOT.json").is_file():
        return snap
    tmp = snap.path.parent / f".{snap.id}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for f in snap.files:
        dest = tmp / "podracer_hpc" / f.relative_to(snap.source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    (tmp / snap.job_name).write_bytes(snap.job_text)
    meta = {"revision": snap.revision, "dirty": snap.dirty, "id": snap.id, "source": str(snap.source),
            "files": len(snap.files), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (tmp / "SNAPSHOT.json").write_text(json.dumps(meta, indent=2) + "\n")
    try:
        os.rename(tmp, snap.path)
    except OSError:  # another submission wrote the same snapshot first
        shutil.rmtree(tmp, ignore_errors=True)
        if not (snap.path / "SNAPSHOT.json").is_file():
            raise
    return snap


def _cpu_list(cpus: set[int]) -> str:
    """{0, 1, 2, 5} -> "0-2,5"."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def launch_line() -> str:
    """What a Slurm task got, as the pod process sees it: code, CPUs, GPUs (one line, stderr)."""
    from .device import code_revision

    try:
        cpus = _cpu_list(os.sched_getaffinity(0))
    except AttributeError:
        cpus = "?"
    e = os.environ
    pkg = Path(__file__).resolve().parent
    return (f"podracer task {e.get('SLURM_PROCID', '?')} (local {e.get('SLURM_LOCALID', '?')}) on "
            f"{e.get('SLURMD_NODENAME', os.uname().nodename)}: code {pkg} (revision {code_revision()}), "
            f"SLURM_CPUS_PER_TASK={e.get('SLURM_CPUS_PER_TASK', '')}, CPUs {cpus}, "
            f"CUDA_VISIBLE_DEVICES={e.get('CUDA_VISIBLE_DEVICES', '')}, "
            f"HDF5_USE_FILE_LOCKING={e.get('HDF5_USE_FILE_LOCKING', '')}")


# ------------------------------------------------------------------------------------------
# What runs in each Slurm task
# ------------------------------------------------------------------------------------------
class RankProgram:
    """One pod rank of a submitit job: trains, and on a warning signal checkpoints and requeues."""

    def __init__(self, job_file: str, overrides: list[str], run_dir: str):
        self.job_file, self.overrides, self.run_dir = job_file, list(overrides), run_dir

    def __call__(self) -> dict[str, Any]:
        print(launch_line(), file=sys.stderr, flush=True)
        from .run import train

        cfg = load_config(self.job_file, self.overrides)
        result = train(cfg, self.run_dir)
        if result.complete:
            return result.summary
        # Stopped by Slurm's warning: every rank has checkpointed. Rank 0 requeues the job; the
        # others wait for that (srun --kill-on-bad-exit would otherwise end rank 0 first), then all
        # leave without a result so the submitter keeps waiting for the requeued run.
        from .comm import get_comm

        comm = get_comm()
        if comm.rank == 0 and "SLURM_JOB_ID" in os.environ:
            job = os.environ.get("SLURM_ARRAY_JOB_ID", "")
            job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ["SLURM_JOB_ID"]
            # Requeue only a job that Slurm still runs (a warning signal: USR2, or --signal). A
            # scancel also stops the ranks (SIGTERM) with checkpoints, but Slurm already marked the
            # job CANCELLED, and `scontrol requeue` would bring a finished job back to life; a job
            # at its time limit (TIMEOUT) or requeued by Slurm itself is Slurm's to restart or not.
            st = slurm_job_state(job)
            if st is None or st.state == "RUNNING":
                subprocess.run(["scontrol", "requeue", job], check=False, timeout=60)
            else:
                print(f"job {job} is {st.state}: not requeued; run the same job again to resume from "
                      f"{self.run_dir}", file=sys.stderr, flush=True)
        comm.barrier()
        raise SystemExit(75)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """submitit's hook (a signal before training started): resubmit as is; the run dir resumes."""
        return submitit.helpers.DelayedSubmission(RankProgram(self.job_file, self.overrides, self.run_dir))


# ------------------------------------------------------------------------------------------
# Executors
# ------------------------------------------------------------------------------------------
def _rank_setup(req: Request, snap: Snapshot | None) -> list[str]:
    """The batch script's lines before srun: the environment every rank inherits."""
    q = shlex.quote
    # A warning signal to the whole job (`scancel --signal=USR2 --full`, a site's preemption that
    # signals everything) reaches this batch shell too: without a trap bash dies of it, the job
    # ends FAILED and cannot be requeued (issue 23). Trapped, the shell waits for srun while the
    # ranks checkpoint and rank 0 requeues. (srun resets the disposition and relays the signal.)
    # (A trap's command runs only once srun has ended, after the requeue has killed this shell: no echo.)
    lines = ["trap : USR1 USR2  # a warning signal to the whole job (scancel --full) must not end this shell",
             "export PYTHONUNBUFFERED=1"]
    if snap is not None:
        lines += [f"export PYTHONPATH={q(str(snap.path))}${{PYTHONPATH:+:$PYTHONPATH}}",
                  "export PYTHONSAFEPATH=1  # the snapshot, not a checkout in the working directory",
                  f"export PODRACER_CODE={q(str(snap.path))}",
                  f"export PODRACER_GIT_REVISION={q(snap.revision)}"]
    if req.cpus_per_task:
        # Slurm 22.05-23.02: srun does not inherit sbatch's --cpus-per-task (it is also on the srun line)
        lines += [f"export SRUN_CPUS_PER_TASK={req.cpus_per_task}", f"export OMP_NUM_THREADS={req.cpus_per_task}"]
    lines.append(f"export PODRACER_GPUS={req.gpus_per_node}  # per node; pods fail without a GPU they asked for"
                 if req.gpus_per_node else "export PODRACER_GPUS=0  # no GPU asked for (even if --exclusive holds some)")
    if req.gpus_per_node:
        if req.gpu_bind == "per-task":
            lines.append("export PODRACER_GPU_BIND=per-task  # each pod checks it sees exactly one GPU")
    lock = HDF5_LOCKING.get(req.hdf5_locking.lower(), "") if req.hdf5_locking else ""
    lines.append(f"export HDF5_USE_FILE_LOCKING={lock}" if lock else
                 "export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-BEST_EFFORT}  # Lustre without flock")
    lines.append(f"export PODRACER_CACHE_DIR={q(req.cache_dir)}" if req.cache_dir else
                 "export PODRACER_CACHE_DIR=${PODRACER_CACHE_DIR:-/tmp/podracer-cache-${USER:-$(id -un)}}")
    if snap is not None:
        lines.append(f"echo \"podracer: job $SLURM_JOB_ID runs code {snap.path} (revision {snap.revision})\"")
    return lines


def _slurm_parameters(req: Request, cfg: Config, name: str, snap: Snapshot | None = None) -> dict[str, Any]:
    srun = ["--kill-on-bad-exit=1"] + ([] if req.mpi == "none" else [f"--mpi={req.mpi}"])
    if req.cpus_per_task:
        srun.append(f"--cpus-per-task={req.cpus_per_task}")
    if req.gpus_per_node and req.gpu_bind == "per-task":
        srun.append("--gpus-per-task=1")
    extra: dict[str, Any] = {"requeue": True}
    if sys.version_info < (3, 11):  # no PYTHONSAFEPATH: a checkout in the working directory would come first
        extra["chdir"] = str(run_dir_for(req, cfg))
    extra.update(parse_sbatch(req.sbatch))
    params: dict[str, Any] = {
        "job_name": req.job_name or f"podracer-{name}",
        "nodes": req.nodes,
        "ntasks_per_node": req.tasks_per_node,
        "time": req.time_min,
        "signal_delay_s": min(req.signal_delay_s, max(10, req.time_min * 60 // 3)),
        # A rank that dies ends the step, instead of leaving the others waiting in a collective.
        "srun_args": srun,
        "additional_parameters": extra,
        "setup": _rank_setup(req, snap),
        "wckey": None,  # submitit's default is --wckey=submitit, which sites that enforce wckeys reject
    }
    for key, value in (("gpus_per_node", req.gpus_per_node), ("partition", req.partition),
                       ("account", req.account), ("array_parallelism", req.array_parallelism),
                       ("cpus_per_task", req.cpus_per_task), ("mem", req.mem.upper() if req.mem else ""),
                       ("exclusive", req.exclusive), ("qos", req.qos), ("constraint", req.constraint),
                       ("mail_type", req.mail_type.upper()), ("mail_user", req.mail_user),
                       ("dependency", req.dependency)):
        if value:
            params[key] = value
    return params


def sbatch_text(req: Request, cfg: Config) -> str:
    """The sbatch script submitit will submit for this request (shown by --dry-run; the code
    snapshot is named, not written)."""
    folder = run_dir_for(req, cfg) / "slurm" / "%j"
    snap = plan_snapshot(run_dir_for(req, cfg), req.job_file) if req.snapshot else None
    params = _slurm_parameters(req, cfg, cfg.name, snap)
    if req.array:
        params["map_count"] = len(req.array)
    python = shlex.quote(sys.executable)
    return _make_sbatch_string(command=f"{python} -u -m submitit.core._submit {shlex.quote(str(folder))}",
                               folder=folder, **params)


@dataclass
class Launched:
    """Handles of what was started, for waiting and reporting."""

    executor: str
    run_dirs: list[Path]
    jobs: list[Any] = field(default_factory=list)  # submitit jobs (slurm)
    procs: list[subprocess.Popen] = field(default_factory=list)  # mpiexec processes (local)
    logs: list[Path] = field(default_factory=list)
    stale_summaries: list[tuple[int, int, int] | None] = field(default_factory=list)  # per run dir, at submission
    started: float = field(default_factory=time.monotonic)
    snapshot: Snapshot | None = None

    def describe(self) -> str:
        if self.executor == "slurm":
            ids = ", ".join(str(j.job_id) for j in self.jobs)
            code = (f"; code snapshot {self.snapshot.path} (revision {self.snapshot.revision})" if self.snapshot
                    else "")
            return (f"submitted Slurm job {ids}; logs {self.logs[0].parent}; run dir "
                    f"{self.run_dirs[0].parent if len(self.run_dirs) > 1 else self.run_dirs[0]}{code}")
        return (f"started {len(self.procs)} local mpiexec run(s) (pid {', '.join(str(p.pid) for p in self.procs)}: "
                f"kill -USR2 <pid> stops it with a checkpoint); output in {', '.join(map(str, self.logs))}")


def submit_slurm(req: Request, cfg: Config) -> Launched:
    base = run_dir_for(req, cfg)
    folder = base / "slurm" / "%j"
    snap = None
    job_file = str(Path(req.job_file).resolve())
    if req.snapshot:
        try:
            snap = make_snapshot(plan_snapshot(base, req.job_file))
        except OSError as e:
            raise LaunchError(f"cannot write the code snapshot in {base / 'code'}: {e}") from e
        job_file = str(snap.job_file)
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=30)
    ex.update_parameters(**_slurm_parameters(req, cfg, cfg.name, snap))
    tasks = req.array or [None]
    calls, dirs = [], []
    for t in tasks:
        sets, d = task_overrides(req, cfg, t)
        calls.append(RankProgram(job_file, sets, str(d)))
        dirs.append(d)
    stale = [summary_signature(d) for d in dirs]
    try:
        if req.array:
            with ex.batch():
                jobs = [ex.submit(c) for c in calls]
        else:
            jobs = [ex.submit(calls[0])]
    except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError) as e:
        raise LaunchError(f"sbatch refused the job: {str(e).strip() or type(e).__name__}") from e
    return Launched("slurm", dirs, jobs=jobs, logs=[Path(str(j.paths.stderr)) for j in jobs], stale_summaries=stale,
                    snapshot=snap)


def find_mpiexec() -> str:
    """The mpiexec next to this interpreter (the venv's mpich wheel), else the one on PATH."""
    from .mpirun import MpiexecNotFound, find_mpiexec as find

    try:
        return find()
    except MpiexecNotFound as e:
        raise LaunchError(str(e)) from None


def submit_local(req: Request, cfg: Config) -> Launched:
    """Start the job's ranks on this machine with mpiexec (array tasks up to %P at a time).

    Each run is ``python -m podracer_hpc.mpirun -n <ranks> ...``: the signal relay in front of
    mpiexec (podracer_hpc/mpirun.py), so that USR1/USR2/TERM sent to the pid printed here stop
    every rank with a checkpoint (exit 75), as on Slurm.
    """
    launched = Launched("local", [])
    tasks = req.array or [None]
    mpiexec = find_mpiexec()
    for t in tasks:
        sets, d = task_overrides(req, cfg, t)
        d.mkdir(parents=True, exist_ok=True)
        log = d / "launch.log"
        cmd = [sys.executable, "-m", "podracer_hpc.mpirun", "--mpiexec", mpiexec, "-n", str(req.ranks),
               sys.executable, "-m", "podracer_hpc.cli", "train", str(Path(req.job_file).resolve()), "--run-dir",
               str(d), *sum((["--set", s] for s in sets), [])]
        if req.array_parallelism:
            while sum(p.poll() is None for p in launched.procs) >= req.array_parallelism:
                time.sleep(0.2)
        launched.stale_summaries.append(summary_signature(d))
        with open(log, "ab") as f:
            f.write(f"$ {shlex.join(cmd)}\n".encode())
            f.flush()
            launched.procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                                   stdin=subprocess.DEVNULL,
                                                   env={**os.environ, "PYTHONUNBUFFERED": "1"}))
        launched.run_dirs.append(d)
        launched.logs.append(log)
    return launched


# ------------------------------------------------------------------------------------------
# Waiting with progress, never hanging
# ------------------------------------------------------------------------------------------
def progress_line(run_dir: Path) -> str:
    """Rounds, env steps, best evaluation and steps/s of a run, from its HDF5 logs."""
    from .h5log import LogError, read_log

    steps, best, sps, rounds, n = 0, float("-inf"), 0.0, 0, 0
    for p in sorted((run_dir / "logs").glob("*_rank*.h5")):
        try:
            log = read_log(p)
        except (LogError, OSError, KeyError):
            continue
        n += 1
        tr, ev, to = log["train"], log["eval"], log["tournament"]
        if len(tr["env_steps"]):
            steps += int(tr["env_steps"][-1])
            sps += float(tr["steps_per_s"][-1])
        if len(ev["return_mean"]):
            best = max(best, float(ev["return_mean"].max()))
        if len(to["round"]):
            rounds = max(rounds, int(to["round"][-1]) + 1)
    if not n:
        return f"{run_dir.name}: waiting for the ranks to start"
    best_text = f"best eval {best:.1f}" if best > float("-inf") else "best eval n/a"
    return f"{run_dir.name}: {n} pods | {steps:,} env steps | {sps / 1e3:.0f}k steps/s | rounds {rounds} | {best_text}"


class JobError(LaunchError):
    """The job ran (or was queued) but did not complete its training; ``exit_code`` for the CLI."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


# States in which a job will still run, or run again (a requeued job is PENDING again).
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                 "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT", "STOPPED",
                 "POWER_UP_NODE", "UPDATE_DB"}
# Pending reasons that no amount of waiting resolves: the request exceeds a partition's, QOS's or
# association's limit, or names something that does not exist (slurm/src/common/slurm_protocol_defs.c).
NEVER_STARTS = {
    "PartitionNodeLimit": "more nodes than the partition allows",
    "PartitionTimeLimit": "a longer time limit than the partition allows",
    "PartitionConfig": "a request the partition's configuration cannot meet",
    "BadConstraints": "constraints no node satisfies",
    "DependencyNeverSatisfied": "a dependency that can never be satisfied",
    "InvalidAccount": "an account that does not exist or you may not use",
    "InvalidQOS": "a QOS that does not exist or you may not use",
    "QOSMaxWallDurationPerJobLimit": "a longer time limit than the QOS allows",
    "AssocMaxWallDurationPerJobLimit": "a longer time limit than your association allows",
    "QOSMaxNodePerJobLimit": "more nodes than the QOS allows",
    "AssocMaxNodesPerJobLimit": "more nodes than your association allows",
    "QOSMaxCpuPerJobLimit": "more CPUs than the QOS allows",
    "AssocMaxCpuPerJobLimit": "more CPUs than your association allows",
    "QOSMaxGRESPerJob": "more GPUs/GRES than the QOS allows",
    "AssocMaxGRESPerJob": "more GPUs/GRES than your association allows",
    "QOSMaxMemoryPerJob": "more memory than the QOS allows",
}


@dataclass
class SlurmJobState:
    """What Slurm says about one job: ``state`` is "" when nothing knows it (any more)."""

    state: str
    reason: str = ""
    restarts: int = 0
    exit_code: str = ""
    source: str = ""  # scontrol | sacct


def _scontrol_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for tok in text.split():
        k, eq, v = tok.partition("=")
        if eq and k not in fields:
            fields[k] = v
    return fields


def slurm_job_state(job_id: str) -> SlurmJobState | None:
    """The job's state, from slurmctld (``scontrol``: live jobs, and ended ones for MinJobAge
    seconds, with or without accounting), else from ``sacct`` (accounting, if any).

    Returns None when Slurm could not be asked right now (slurmctld busy): ask again later.
    """
    try:
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode == 0 and out.stdout.strip():
        f = _scontrol_fields(out.stdout.splitlines()[0])
        restarts = int(f["Restarts"]) if f.get("Restarts", "").isdigit() else 0
        return SlurmJobState(f.get("JobState", "UNKNOWN"), f.get("Reason", ""), restarts, f.get("ExitCode", ""),
                             "scontrol")
    if "invalid job id" not in (out.stderr + out.stdout).lower():
        return None  # slurmctld did not answer: not the same as "gone"
    try:
        acct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        acct = None
    if acct is not None and acct.returncode == 0:
        for line in acct.stdout.splitlines():
            state, _, code = line.strip().partition("|")
            if state:
                return SlurmJobState(state.split()[0], "", 0, code, "sacct")
    return SlurmJobState("")


def job_state(job_id: str) -> str:
    """The job's state name ("" when Slurm no longer knows it)."""
    st = slurm_job_state(job_id)
    return st.state if st else "UNKNOWN"


def summary_signature(run_dir: Path) -> tuple[int, int, int] | None:
    """Identity of the summary.json there now (None if none): taken at submission, so that an
    earlier run's summary in a reused run directory is never taken for this job's (no clocks
    compared: a shared filesystem's server clock may differ from this host's)."""
    try:
        st = (run_dir / "summary.json").stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_summary(run_dir: Path, stale: tuple[int, int, int] | None = None) -> dict[str, Any] | None:
    """The run's summary.json, unless it is the one that was there at submission (``stale``)."""
    sig = summary_signature(run_dir)
    if sig is None or sig == stale:
        return None
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _complete(summary: dict[str, Any] | None) -> bool:
    return summary is not None and summary.get("complete", True) is not False


def _incomplete_text(summary: dict[str, Any] | None, run_dir: Path) -> str:
    if summary is None:
        return f"it wrote no summary ({run_dir / 'summary.json'})"
    return (f"its summary says it stopped early ({summary.get('env_steps', '?'):,} env steps; \"complete\": false; "
            f"the checkpoints in {run_dir} resume it)" if isinstance(summary.get("env_steps"), int)
            else f"its summary says it stopped early (\"complete\": false; {run_dir / 'summary.json'})")


@dataclass
class _Watch:
    """What wait() remembers about one Slurm job between polls."""

    seen: bool = False
    last: str = ""
    restarts: int = 0
    ended_at: float | None = None  # monotonic time the job was first seen ended or gone
    ended_state: str = ""


def _slurm_step(launched: "Launched", i: int, w: _Watch, out: Any, confirm_s: float) -> bool:
    """One poll of Slurm job i: True when it completed its training; raises JobError when it will not."""
    job, d = launched.jobs[i], launched.run_dirs[i]
    log = Path(str(job.paths.stderr))
    st = slurm_job_state(str(job.job_id))
    if st is None:
        return False  # slurmctld busy: ask again
    now = time.monotonic()
    if st.state:
        w.seen = True
        label = st.state + (f" ({st.reason})" if st.reason and st.reason not in ("None", "") else "")
        if st.restarts > w.restarts:
            w.restarts = st.restarts
            print(f"job {job.job_id}: requeued (start {st.restarts + 1}); it resumes from {d}", file=out, flush=True)
        if label != w.last:
            w.last = label
            print(f"job {job.job_id}: {label}", file=out, flush=True)
    if st.state in ACTIVE_STATES or st.state.startswith("REQUEUE"):
        w.ended_at = None
        if st.state == "PENDING" and st.reason in NEVER_STARTS:
            raise JobError(f"Slurm job {job.job_id} cannot start: {st.reason} (it asks for {NEVER_STARTS[st.reason]}). "
                           f"It stays queued until you cancel it (scancel {job.job_id}) and submit a request that fits.")
        return False
    if not st.state and not w.seen and now - launched.started < 30:
        return False  # not visible yet
    # Ended (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...), or gone from slurmctld (MinJobAge passed)
    # and from accounting (none). Confirm once a few seconds later: a requeue passes through
    # ended-looking states before it is PENDING again.
    if w.ended_at is None or w.ended_state != st.state:
        w.ended_at, w.ended_state = now, st.state
        return False
    if now - w.ended_at < confirm_s:
        return False
    summary = read_summary(d, launched.stale_summaries[i])
    state = st.state or "gone from the queue, and Slurm keeps no record of it (no accounting)"
    if st.state == "COMPLETED" or not st.state:
        if _complete(summary):
            return True
        raise JobError(f"Slurm job {job.job_id} ended {state} without completing its training: "
                       f"{_incomplete_text(summary, d)}; see {log}:\n" + _tail(log))
    code = f", exit code {st.exit_code}" if st.exit_code and st.exit_code != "0:0" else ""
    raise JobError(f"Slurm job {job.job_id} ended {state}{code}: {_incomplete_text(summary, d)}; see {log}:\n"
                   + _tail(log))


def _local_step(launched: "Launched", i: int) -> bool:
    p, d, log = launched.procs[i], launched.run_dirs[i], launched.logs[i]
    if p.poll() is None:
        return False
    rc = p.returncode
    summary = read_summary(d, launched.stale_summaries[i])
    if rc == 0 and _complete(summary):
        return True
    if rc == 75:
        raise JobError(f"local run {d} stopped early (exit 75): every rank checkpointed; submit the same command "
                       f"again to resume; see {log}", exit_code=75)
    why = f"exit {rc}" if rc >= 0 else f"killed by signal {-rc}"
    if rc == 0:
        why += f", but {_incomplete_text(summary, d)}"
    raise JobError(f"local run {d} failed ({why}); see {log}:\n" + _tail(log))


def wait(launched: Launched, timeout_s: float, poll_s: float = 3.0, out: Any = None,
         confirm_s: float = 4.0) -> list[dict[str, Any]]:
    """Wait for every job with progress lines; returns the summaries of jobs that completed their
    training. Raises JobError as soon as one job ends without completing (failed, cancelled,
    stopped, gone from the queue with no complete summary, or pending for a reason that never
    resolves), naming its state and log, within ``poll_s + confirm_s`` seconds of Slurm saying so;
    a requeued job is waited for. Raises LaunchError after ``timeout_s``.
    """
    out = out or sys.stderr
    deadline = time.monotonic() + timeout_s
    last: dict[str, str] = {}
    watches = [_Watch() for _ in launched.run_dirs]
    done: set[int] = set()
    while True:
        for i, d in enumerate(launched.run_dirs):
            if i in done:
                continue
            line = progress_line(d)
            if last.get(str(d)) != line:
                print(line, file=out, flush=True)
                last[str(d)] = line
            finished = (_local_step(launched, i) if launched.executor == "local"
                        else _slurm_step(launched, i, watches[i], out, confirm_s))
            if finished:
                done.add(i)
        if len(done) == len(launched.run_dirs):
            break
        if time.monotonic() > deadline:
            raise JobError(f"gave up waiting after {timeout_s:.0f} s; the job goes on: "
                           f"podracer status {launched.run_dirs[0]}")
        time.sleep(poll_s)
    summaries = []
    for i, d in enumerate(launched.run_dirs):
        summaries.append(read_summary(d, launched.stale_summaries[i]))
    return summaries


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return "  (no log file yet)"
    return "\n".join("  " + x for x in lines)


__all__ = ["Request", "LaunchError", "JobError", "ConfigError", "validate", "sbatch_text", "submit_slurm",
           "submit_local", "wait", "parse_array", "parse_sbatch", "RankProgram", "progress_line", "slurm_job_state",
           "Snapshot", "plan_snapshot", "make_snapshot", "launch_line"]
