"""Slurm: the submitit executor, the task each rank runs, the sbatch script, what Slurm says.

The only module of podracer-hpc that imports submitit. A job is one submitit job (or job array)
whose tasks are the pods of one MPI world (``srun --mpi=pmix|pmi2``, one rank per GPU, bound:
``--gpus-per-task=1``; ``--cpus-per-task`` given to srun too). Each task runs
:class:`RankProgram` from the code snapshot. Preemption and time limits: Slurm warns the ranks
with a signal (submitit's USR2); every rank finishes its update and checkpoints, then rank 0
requeues the job (``scontrol requeue``) and the ranks exit without a result, so the requeued job
resumes from the run directory and the submitter's ``--wait`` keeps waiting.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import submitit

from podracer_hpc.cluster.caches import record_line
from podracer_hpc.cluster.jobstate import (
    SlurmJobState,
    slurm_job_state,
)  # re-exported: what Slurm says
from podracer_hpc.cluster.mpich import pypi_mpich
from podracer_hpc.config import Config, load_config
from podracer_hpc.files.rundir import EXIT_REQUEUE, RunDir, git_revision, job_id
from podracer_hpc.launch.errors import LaunchError, SlurmUnreachable
from podracer_hpc.launch.image import image_info, mpi_mismatch
from podracer_hpc.launch.request import (
    HDF5_LOCKING,
    Request,
    fit_cpus,
    parse_sbatch,
    parse_srun,
    run_dir_for,
    slurm_minutes,
    task_overrides,
    threads_per_core_one,
)
from podracer_hpc.launch.snapshot import Snapshot, make_snapshot, plan_snapshot

try:  # submitit's own script writer is private: guarded, and pyproject bounds submitit below 2
    from submitit.slurm.slurm import _make_sbatch_string
except ImportError:  # pragma: no cover  (a submitit that renamed it)
    _make_sbatch_string = None

__all__ = [
    "RankProgram",
    "SlurmJobState",
    "check_request",
    "launch_line",
    "parameters",
    "sbatch_text",
    "slurm_job_state",
    "submit",
    "submit_script",
]


# ------------------------------------------------------------------------------------------
# Before anything is queued: what sinfo and srun can tell
# ------------------------------------------------------------------------------------------
def slurm_here() -> bool:
    return shutil.which("sbatch") is not None


def _sinfo(fmt: str, partition: str = "") -> list[str]:
    cmd = ["sinfo", "-h", "-o", fmt] + (["-p", partition] if partition else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise SlurmUnreachable(f"sinfo failed ({last}); is Slurm reachable from here?")
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def _gres_gpus(text: str, gpu_type: str = "") -> int:
    """GPUs in a node's GRES as sinfo prints it (``gpu:8``, ``gpu:h100:8(S:0-1)``, ``(null)``);
    ``gpu_type``: only those of that type."""
    found = re.findall(r"gpu(?::([A-Za-z0-9_.-]+))?:([0-9]+)", text)
    return sum(int(n) for t, n in found if not gpu_type or t == gpu_type)


def check_request(req: Request, cfg: Config, dry_run: bool) -> None:
    """The Slurm side of ``validate``: GPUs asked for where the job needs them, the MPI plugin
    that matches mpi4py, and the cluster itself where Slurm is here."""
    if not slurm_here() and not dry_run:
        raise LaunchError(
            "--executor slurm, but there is no sbatch here: run on a login node, or use "
            "--executor local (--dry-run shows the script without Slurm)"
        )
    if cfg.device.startswith("cuda") and not req.gpus_per_node:
        raise LaunchError(
            f"the job file says device: {cfg.device}, but --gpus-per-node is 0: ask for one GPU per "
            f"pod (--gpus-per-node {req.tasks_per_node}) or --set device=auto"
        )
    if req.gpus_per_node > req.tasks_per_node:
        print(
            f"note: {req.gpus_per_node} GPUs per node for {req.tasks_per_node} pod(s) per node: "
            f"{req.gpus_per_node - req.tasks_per_node} stay idle (one GPU per pod)",
            file=sys.stderr,
        )
    if req.container_image:
        _check_image_mpi(req)
    elif req.mpi == "pmix" and pypi_mpich():  # the ranks run this interpreter's mpi4py
        message = (
            "--mpi pmix, but mpi4py here loads the PyPI mpich wheel, which speaks PMI-1/2 only: each rank "
            "would start alone. Use --mpi pmi2 with the wheel, or a site MPI (Open MPI/HPC-X) with pmix "
            "(docs/slurm-templates.md, 'MPI')"
        )
        if not dry_run:
            raise LaunchError(message)
        print(f"note: {message}", file=sys.stderr)
    if not slurm_here():
        print(
            "note: no Slurm here: the script is not checked against a cluster (partition, nodes, CPUs, GPUs, "
            "time limit, MPI plugins)",
            file=sys.stderr,
        )
        return
    try:
        _check_against_slurm(req)
    except SlurmUnreachable as e:
        if not dry_run:
            raise
        print(f"note: {e}: the script is not checked against the cluster", file=sys.stderr)


def _check_image_mpi(req: Request) -> None:
    """The MPI of the image the ranks run in (its IMAGE.json, read from the image: not this
    login node's mpi4py) against ``--mpi``: a mismatch is refused, dry run or not (the image says
    what its ranks will load). An image that cannot be read here is noted, not refused."""
    info, why = image_info(req.container_image)
    if info is None:
        print(f"note: the image's MPI is not checked against --mpi {req.mpi}: {why}", file=sys.stderr)
        return
    if message := mpi_mismatch(info, req.mpi, req.container_image):
        raise LaunchError(message)


def _check_against_slurm(req: Request) -> None:
    """What sinfo and srun can tell before anything is queued (a request that could never start)."""
    parts = [p.rstrip("*") for p in _sinfo("%P")]
    if req.partition and req.partition not in parts:
        raise LaunchError(f"--partition {req.partition!r} does not exist; partitions here: {', '.join(parts)}")
    part = req.partition or next((p.rstrip("*") for p in _sinfo("%P") if p.endswith("*")), "")
    if part:
        _check_partition(req, part)
    if req.mpi != "none" and shutil.which("srun"):
        _check_mpi_plugin(req.mpi)


def _check_partition(req: Request, part: str) -> None:
    total = sum(int(x) for x in _sinfo("%D", part) if x.isdigit())
    if total and req.nodes > total:
        raise LaunchError(f"--nodes {req.nodes}: partition {part!r} has only {total} nodes")
    limits = [m for m in (slurm_minutes(x) for x in _sinfo("%l", part)) if m is not None]
    if limits and req.time_min > max(limits):
        raise LaunchError(
            f"--time {req.time_min}: partition {part!r} allows at most {max(limits)} minutes "
            "(sinfo -o %l); the job would never start"
        )
    if not req.node_cpus:  # --node-cpus (or the site's) wins: it was checked in validate
        _check_cpus(req, part)
    gpus = [_gres_gpus(x, req.gpu_type) for x in _sinfo("%G", part)]
    if gpus and req.gpus_per_node > max(gpus):
        typed = f" of type {req.gpu_type}" if req.gpu_type else ""
        raise LaunchError(
            f"--gpus-per-node {req.gpu_type + ':' if req.gpu_type else ''}{req.gpus_per_node}: the nodes of "
            f"partition {part!r} have at most {max(gpus)} GPUs{typed} (sinfo -o %G); the job would never start"
        )
    if gpus and max(gpus) and not req.gpus_per_node:
        if req.exclusive:
            raise LaunchError(
                f"--exclusive on partition {part!r}, whose nodes have {max(gpus)} GPUs each, but no "
                f"--gpus-per-node: the job would hold the GPUs and its pods would run on the CPU. Ask for "
                f"them (--gpus-per-node {min(max(gpus), req.tasks_per_node)}), or drop --exclusive"
            )
        print(
            f"note: the nodes of partition {part!r} have {max(gpus)} GPUs each, but the job asks for none "
            f"(--gpus-per-node): its pods run on the CPU",
            file=sys.stderr,
        )


def _check_cpus(req: Request, part: str) -> None:
    """CPUs per pod against the partition's nodes (sinfo: CPUs and threads per core; physical
    cores when the job asks for one thread per core): derived for a GPU job that gave none,
    refused when they cannot fit (request.fit_cpus)."""
    nodes = []
    for line in _sinfo("%c %Z", part):
        f = [int(re.sub(r"[^0-9]", "", x) or 0) for x in line.split()]
        if f and f[0]:
            nodes.append(f[0] // max(1, f[1]) if len(f) > 1 and threads_per_core_one(req) else f[0])
    if not nodes:
        return
    one = threads_per_core_one(req)
    where = f"sinfo -o %c{' / %Z: physical cores, one thread per core' if one else ''}, partition {part!r}"
    if req.cpus_per_task or not req.gpus_per_node:
        fit_cpus(req, max(nodes), where)  # refused only when no node of the partition fits
    elif note := fit_cpus(req, min(nodes), where):  # derived: so that every node of the partition fits
        print(f"note: {note}", file=sys.stderr)


def _check_mpi_plugin(mpi: str) -> None:
    try:
        out = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr  # "MPI plugin types are...", one per line; "...available: pmix_v4"
        plugins = (
            (
                {ln.strip() for ln in text.splitlines() if re.fullmatch(r"[a-z0-9_]+", ln.strip())}
                | set(re.findall(r"\bpmix_v[0-9]+\b", text))
            )
            if out.returncode == 0
            else set()
        )
    except (OSError, subprocess.TimeoutExpired):
        plugins = set()
    if plugins and not any(p == mpi or p.startswith(mpi + "_") for p in plugins):
        raise LaunchError(
            f"--mpi {mpi}: this Slurm has no such MPI plugin (srun --mpi=list: "
            f"{', '.join(sorted(plugins))}); use the one that matches the MPI of mpi4py"
        )


# ------------------------------------------------------------------------------------------
# What runs in each Slurm task
# ------------------------------------------------------------------------------------------
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
    try:
        cpus = _cpu_list(os.sched_getaffinity(0))
    except AttributeError:
        cpus = "?"
    e = os.environ
    pkg = Path(__file__).resolve().parents[1]
    return (
        f"podracer task {e.get('SLURM_PROCID', '?')} (local {e.get('SLURM_LOCALID', '?')}) on "
        f"{e.get('SLURMD_NODENAME', os.uname().nodename)}: code {pkg} (revision {git_revision()}), "
        f"SLURM_CPUS_PER_TASK={e.get('SLURM_CPUS_PER_TASK', '')}, CPUs {cpus}, "
        f"CUDA_VISIBLE_DEVICES={e.get('CUDA_VISIBLE_DEVICES', '')}, "
        f"HDF5_USE_FILE_LOCKING={e.get('HDF5_USE_FILE_LOCKING', '')}"
    )


def requeue(run_dir: str) -> None:
    """Rank 0 of a stopped job: ``scontrol requeue`` it, if Slurm still runs it. (A scancel also
    stops the ranks (SIGTERM) with checkpoints, but Slurm already marked the job CANCELLED, and a
    requeue would bring a finished job back to life; a job at its time limit (TIMEOUT) or
    requeued by Slurm itself is Slurm's to restart or not.)"""
    job = job_id()
    if job == "local":
        return
    st = slurm_job_state(job)
    if st is None or st.state == "RUNNING":
        subprocess.run(["scontrol", "requeue", job], check=False, timeout=60)
    else:
        print(
            f"job {job} is {st.state}: not requeued; run the same job again to resume from {run_dir}",
            file=sys.stderr,
            flush=True,
        )


class RankProgram:
    """One pod rank of a submitit job: trains, and on a warning signal checkpoints and requeues.
    ``part``: ``i/J`` when the job is part i of a pool of J jobs (--pods-per-job)."""

    def __init__(self, job_file: str, overrides: list[str], run_dir: str, part: str = "0/1"):
        self.job_file, self.overrides, self.run_dir, self.part = job_file, list(overrides), run_dir, part

    def __call__(self) -> dict[str, Any]:
        print(launch_line(), file=sys.stderr, flush=True)
        from podracer_hpc.files.rundir import PoolPart
        from podracer_hpc.rank.program import train

        result = train(
            load_config(self.job_file, self.overrides), self.run_dir, part=PoolPart.parse(getattr(self, "part", "0/1"))
        )
        if result.complete:
            return result.summary
        # Stopped by Slurm's warning: every rank has checkpointed. Rank 0 requeues the job; the
        # others wait for that (srun --kill-on-bad-exit would otherwise end rank 0 first), then all
        # leave without a result so the submitter keeps waiting for the requeued run.
        if result.rank == 0:
            requeue(self.run_dir)
        result.wait_for_all()
        raise SystemExit(EXIT_REQUEUE)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """submitit's hook (a signal before training started): resubmit as is; the run dir resumes."""
        return submitit.helpers.DelayedSubmission(
            RankProgram(self.job_file, self.overrides, self.run_dir, getattr(self, "part", "0/1"))
        )


# ------------------------------------------------------------------------------------------
# The sbatch script
# ------------------------------------------------------------------------------------------
def _rank_setup(req: Request, snap: Snapshot | None) -> list[str]:
    """The batch script's lines before srun: the environment every rank inherits."""
    q = shlex.quote
    # A warning signal to the whole job (`scancel --signal=USR2 --full`, a site's preemption that
    # signals everything) reaches this batch shell too: without a trap bash dies of it, the job
    # ends FAILED and cannot be requeued. Trapped, the shell waits for srun while the
    # ranks checkpoint and rank 0 requeues. (srun resets the disposition and relays the signal.)
    # (A trap's command runs only once srun has ended, after the requeue has killed this shell: no echo.)
    lines = [
        "trap : USR1 USR2  # a warning signal to the whole job (scancel --full) must not end this shell",
        "export PYTHONUNBUFFERED=1",
        # every rank imports the same modules: none may write __pycache__ into the shared snapshot/venv
        "export PYTHONDONTWRITEBYTECODE=1",
    ]
    if req.modules:
        lines.append(f"module load {req.modules}  # the site's modules (--site: PODRACER_MODULES)")
    if snap is not None:
        lines += [
            f"export PYTHONPATH={q(str(snap.path))}${{PYTHONPATH:+:$PYTHONPATH}}",
            "export PYTHONSAFEPATH=1  # the snapshot, not a checkout in the working directory",
            f"export PODRACER_CODE={q(str(snap.path))}",
            f"export PODRACER_GIT_REVISION={q(snap.revision)}",
        ]
    if req.cpus_per_task:
        # Slurm 22.05-23.02: srun does not inherit sbatch's --cpus-per-task (it is also on the srun line)
        lines += [f"export SRUN_CPUS_PER_TASK={req.cpus_per_task}", f"export OMP_NUM_THREADS={req.cpus_per_task}"]
    lines.append(
        f"export PODRACER_GPUS={req.gpus_per_node}  # per node; pods fail without a GPU they asked for"
        if req.gpus_per_node
        else "export PODRACER_GPUS=0  # no GPU asked for (even if --exclusive holds some)"
    )
    if req.gpus_per_node and req.gpu_bind == "per-task":
        lines.append("export PODRACER_GPU_BIND=per-task  # each pod checks it sees exactly one GPU")
    lock = HDF5_LOCKING.get(req.hdf5_locking.lower(), "") if req.hdf5_locking else ""
    lines.append(
        f"export HDF5_USE_FILE_LOCKING={lock}"
        if lock
        else "export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-BEST_EFFORT}  # Lustre without flock"
    )
    if req.container_image:
        # the compile-cache variables the job itself set, recorded before srun enters the image:
        # each pod restores them, and the node-local caches replace what the image's ENV set
        # (pyxis applies an image's ENV over the job's)
        lines.append(record_line())
    lines.append(
        f"export PODRACER_CACHE_DIR={q(req.cache_dir)}"
        if req.cache_dir
        else "export PODRACER_CACHE_DIR=${PODRACER_CACHE_DIR:-/tmp/podracer-cache-${USER:-$(id -un)}}"
    )
    if snap is not None:
        lines.append(f'echo "podracer: job $SLURM_JOB_ID runs code {snap.path} (revision {snap.revision})"')
    return lines


def parameters(req: Request, cfg: Config, snap: Snapshot | None = None) -> dict[str, Any]:
    """submitit's parameters for the request: from each option's declared sbatch name, plus the
    srun line, the signal that checkpoints, the requeue and the ranks' environment."""
    import dataclasses

    srun = ["--kill-on-bad-exit=1"] + ([] if req.mpi == "none" else [f"--mpi={req.mpi}"])
    if req.cpus_per_task:
        srun.append(f"--cpus-per-task={req.cpus_per_task}")
    if req.gpus_per_node and req.gpu_bind == "per-task":
        # One GPU per pod, next to the pod's CPUs. --gpus-per-task alone implies --gpu-bind=per_task:1,
        # which hands out GPUs in task order whatever the task's CPUs, while srun's default
        # distribution (block:cyclic) spreads each task's CPUs over both sockets of a DGX: about half
        # the pods would run on the other socket from their GPU. block:block gives each task
        # consecutive cores of one socket (tasks 0-3 on socket 0, 4-7 on socket 1 of a DGX
        # H100/H200/B200: 8 x 14 of its 2 x 56 cores), and single:1 binds it to one GPU of that
        # socket's (gres.conf Cores=). closest would bind all of them (four), and the pod's one-GPU
        # check would refuse it.
        srun += ["--gpus-per-task=1", "--gpu-bind=single:1", "--distribution=block:block"]
    if req.container_image and req.container_runtime == "pyxis":
        base = str(run_dir_for(req, cfg))
        mounts = ",".join(m for m in (f"{base}:{base}", req.container_mounts) if m)
        srun += [
            f"--container-image={req.container_image}",
            f"--container-mounts={mounts}",
            f"--container-workdir={base}",
        ]
    srun += parse_srun(req.srun)
    extra: dict[str, Any] = {"requeue": True}
    if sys.version_info < (3, 11):  # no PYTHONSAFEPATH: a checkout in the working directory would come first
        extra["chdir"] = str(run_dir_for(req, cfg))
    extra.update(parse_sbatch(req.sbatch))
    params: dict[str, Any] = {
        "job_name": req.job_name or f"podracer-{cfg.name}",
        "signal_delay_s": min(req.signal_delay_s, max(10, req.time_min * 60 // 3)),
        # A rank that dies ends the step, instead of leaving the others waiting in a collective.
        "srun_args": srun,
        "additional_parameters": extra,
        "setup": _rank_setup(req, snap),
        "wckey": None,  # submitit's default is --wckey=submitit, which sites that enforce wckeys reject
    }
    for f in dataclasses.fields(Request):
        name, value = f.metadata["sbatch"], getattr(req, f.name)
        if not name or name in ("job_name", "array") or not value:
            continue
        params[name] = value.upper() if name in ("mem", "mail_type") else value
    if req.gpus_per_node and req.gpu_type:  # typed GPUs: --gpus-per-node=h100:8, still one bound per pod
        params["gpus_per_node"] = f"{req.gpu_type}:{req.gpus_per_node}"
    if req.jobs > 1:  # a pool of several jobs: each job is its own world of --pods-per-job pods
        params["nodes"] = req.job_nodes
    return params


def rank_python(req: Request, cfg: Config) -> str:
    """The command that runs a rank's Python: this interpreter, or the container's ``python3``
    (pyxis: srun enters the image; charliecloud: ``ch-run`` enters it here, with the run
    directory and the extra mounts bound at their own paths)."""
    if not req.container_image:
        return shlex.quote(sys.executable)
    if req.container_runtime == "pyxis":
        return "python3"
    base = str(run_dir_for(req, cfg))
    binds = [f"{base}:{base}"] + [m for m in req.container_mounts.split(",") if m]
    return " ".join(
        [
            "ch-run",
            *sum((["-b", shlex.quote(b)] for b in binds), []),
            "--cd",
            shlex.quote(base),
            shlex.quote(req.container_image),
            "--",
            "python3",
        ]
    )


def sbatch_text(req: Request, cfg: Config) -> str:
    """The sbatch script submitit will submit for this request (shown by --dry-run; the code
    snapshot is named, not written)."""
    if _make_sbatch_string is None:
        raise LaunchError(
            f"this submitit ({submitit.__version__}) has no _make_sbatch_string, which --dry-run uses to "
            "show the script: install a submitit the project supports (pyproject: >=1.5,<2)"
        )
    base = run_dir_for(req, cfg)
    folder = RunDir(base).slurm_folder
    snap = plan_snapshot(base, req.job_file) if req.snapshot else None
    params = parameters(req, cfg, snap)
    if (req.array and req.array == list(range(len(req.array)))) or req.jobs > 1:
        params["map_count"] = len(req.array) or req.jobs
    python = rank_python(req, cfg)
    return _make_sbatch_string(
        command=f"{python} -u -m submitit.core._submit {shlex.quote(str(folder))}", folder=folder, **params
    )


def submit(
    req: Request, cfg: Config, parts: list[int] | None = None, snapshot: Snapshot | None = None
) -> tuple[list[Any], list[Path], Snapshot | None, list[Any]]:
    """Submit the request's job (or array; ``parts``: those parts of a pool of several jobs, as
    one array); returns submitit's jobs, their run dirs, the snapshot and each run dir's summary
    signature from before the submission (RunDir.summary_signature). ``snapshot``: run this code
    snapshot (a retry runs the code its first submission ran) instead of taking one."""
    base = run_dir_for(req, cfg)
    snap = snapshot
    job_file = str(Path(req.job_file).resolve())
    if snap is not None:
        job_file = str(snap.job_file)
    elif req.snapshot:
        try:
            snap = make_snapshot(plan_snapshot(base, req.job_file))
        except OSError as e:
            raise LaunchError(f"cannot write the code snapshot in {RunDir(base).code_dir}: {e}") from e
        job_file = str(snap.job_file)
    try:
        ex = submitit.SlurmExecutor(folder=RunDir(base).slurm_folder, max_num_timeout=30, python=rank_python(req, cfg))
    except OSError as e:
        raise LaunchError(
            f"cannot create the job's log folder in {base}: {e}; choose a --run-dir you can write to"
        ) from e
    params = parameters(req, cfg, snap)
    ex.update_parameters(**params)
    calls, dirs = [], []
    if parts is not None:  # a pool of several jobs: one run directory, each job its part of the pods
        for g in parts:
            calls.append(RankProgram(job_file, list(req.overrides), str(base), f"{g}/{req.jobs}"))
            dirs.append(base)
    else:
        for t in req.array or [None]:
            sets, d = task_overrides(req, cfg, t)
            calls.append(RankProgram(job_file, sets, str(d)))
            dirs.append(d)
    stale = [RunDir(d).summary_signature() for d in dirs]
    try:
        if len(calls) > 1 and (parts is not None or req.array == list(range(len(req.array)))):
            with ex.batch():  # one array: Slurm's index is the task's (or the part's: parts start at 0)
                jobs = [ex.submit(c) for c in calls]
        else:  # one job each: submitit numbers an array from 0, and --array 1,3,5 must run tasks 1, 3 and 5
            jobs = [ex.submit(c) for c in calls]
    except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError) as e:
        raise LaunchError(f"sbatch refused the job: {str(e).strip() or type(e).__name__}") from e
    return jobs, dirs, snap, stale


def submit_script(args: list[str], env: dict[str, str] | None = None) -> str:
    """``sbatch --parsable ARGS`` (a template script and its arguments); returns the job id."""
    try:
        out = subprocess.run(
            ["sbatch", "--parsable", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **(env or {})},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"sbatch {' '.join(args)}: {e}") from None
    if out.returncode != 0:
        raise LaunchError(f"sbatch refused {' '.join(args)}: {(out.stderr or out.stdout).strip()}")
    return out.stdout.strip().split(";")[0]


# ------------------------------------------------------------------------------------------
# What Slurm says about a job
# ------------------------------------------------------------------------------------------
def job_state(job_id: str) -> str:
    """The job's state name ("" when Slurm no longer knows it)."""
    st = slurm_job_state(job_id)
    return st.state if st else "UNKNOWN"
