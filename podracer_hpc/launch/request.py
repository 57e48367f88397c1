"""What ``podracer submit`` is asked for: every option declared once, with its doc.

Each field of :class:`Request` carries, in its metadata, the flag ``podracer submit`` shows, the
one-line doc, the check of its value, and (for Slurm) the sbatch option it sets. The argparse
(:func:`add_arguments`), the request built from the command line (:func:`from_args`), the checks
(:func:`validate`), the sbatch parameters (``slurm.parameters``) and the sbatch options that
``--sbatch`` must refuse (:func:`own_sbatch`) are all derived from these declarations.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from podracer_hpc.config import Config, job_file
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.launch.errors import LaunchError
from podracer_hpc.launch.watch import slurm_poll_s

__all__ = [
    "ACTIONS",
    "Request",
    "add_arguments",
    "check_fields",
    "fit_cpus",
    "from_args",
    "gpu_sbatch_refusal",
    "own_sbatch",
    "parse_array",
    "parse_sbatch",
    "parse_srun",
    "run_dir_for",
    "slurm_minutes",
    "task_overrides",
    "threads_per_core_one",
]

MAIL_TYPES = {
    "NONE",
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "ALL",
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
}
HDF5_LOCKING = {"best-effort": "BEST_EFFORT", "true": "TRUE", "false": "FALSE"}
# sbatch options that the launcher sets itself (--sbatch may not), beyond those of the options below
LAUNCHER_SBATCH = {
    "output": "",
    "error": "",
    "open-mode": "",
    "signal": "",
    "requeue": "",
    "ntasks": "--nodes and --tasks-per-node",
    "gpus-per-task": "--gpus-per-node (one bound GPU per pod)",
}
# sbatch/srun GPU options that would bypass the one-bound-GPU-per-pod binding: refused with what to use
GPU_OPTIONS = ("gres", "gpus", "gpus-per-socket", "gpu-bind", "ntasks-per-gpu", "cpus-per-gpu")
# pods at or above which a start from a shared filesystem's interpreter is warned about
LARGE_JOB_RANKS = 64


def _min(n: int) -> Callable[[Any], str]:
    return lambda v: "" if v >= n else f"must be >= {n}, got {v}"


def _no_spaces(v: str) -> str:
    return "no spaces" if v and re.search(r"\s", v) else ""


def _mem(v: str) -> str:
    ok = not v or re.fullmatch(r"[0-9]+[KMGT]?B?", v.upper())
    return "" if ok else "expected a size per node such as 64G, 500M or 0 (all of the node's)"


def _gpu_type(v: str) -> str:
    return "" if not v or re.fullmatch(r"[A-Za-z0-9_.-]+", v) else "expected a GRES type name such as h100"


def _gpus_arg(text: str) -> tuple[str, int]:
    """``--gpus-per-node``: ``8`` or a typed ``h100:8`` -> (type, count)."""
    m = re.fullmatch(r"(?:([A-Za-z0-9_.-]+):)?([0-9]+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a count (8) or TYPE:COUNT (h100:8)")
    return m.group(1) or "", int(m.group(2))


def _mail(v: str) -> str:
    bad = [t for t in v.upper().split(",") if t and t not in MAIL_TYPES]
    return f"{', '.join(bad)} unknown; use {', '.join(sorted(MAIL_TYPES))}" if bad else ""


def _time_arg(text: str) -> int:
    """``--time``: minutes (``90``) or Slurm's syntax (``1:30:00``, ``2-00:00:00``, ``45:30``), in minutes."""
    minutes = slurm_minutes(text)
    if minutes is None or not re.fullmatch(r"[0-9]+(-[0-9]+(:[0-9]+){0,2})?|[0-9]+(:[0-9]+){1,2}", text.strip()):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected minutes (90) or Slurm's time syntax (1:30:00, "
            "2-00:00:00, 45:30); a pod job needs a finite limit"
        )
    return minutes


def opt(
    default: Any,
    doc: str,
    flag: str = "",
    *,
    check: Callable[[Any], str] | None = None,
    sbatch: str = "",
    choices: tuple[str, ...] = (),
    metavar: str | None = None,
    cli: str = "value",
    parse: Callable[[str], Any] | None = None,
) -> Any:
    """One ``podracer submit`` option: a Request field with its flag (``""``: no flag), its doc, a
    check (returns "" or what is wrong), the sbatch option it sets (``sbatch``: submitit's name of
    it) and how argparse reads it (``cli``: value | flag (true when given) | inverted (false when
    given) | append | none)."""
    meta = {
        "doc": doc,
        "flag": flag,
        "check": check,
        "sbatch": sbatch,
        "choices": choices,
        "metavar": metavar,
        "cli": cli,
        "parse": parse,
    }
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Request:
    """What ``podracer submit`` was asked for (the resolved, validated form)."""

    job_file: str = opt("", "job file, e.g. jobs/quickstart.yaml", cli="none")
    overrides: list[str] = opt(
        [], "override a config key (dotted), repeatable", "--set", cli="append", metavar="KEY=VALUE"
    )
    executor: str = opt(
        "local",
        "local: mpiexec here; slurm: submitit (auto: slurm when sbatch exists)",
        "--executor",
        choices=("local", "slurm"),
    )
    nodes: int = opt(
        1,
        "nodes (one MPI world over all of them, unless --pods-per-job splits the pool into jobs)",
        "--nodes",
        check=_min(1),
        sbatch="nodes",
    )
    tasks_per_node: int = opt(
        1, "pod ranks per node (one per GPU)", "--tasks-per-node", check=_min(1), sbatch="ntasks_per_node"
    )
    gpus_per_node: int = opt(
        0,
        "GPUs per node, N or TYPE:N (h100:8); one bound GPU per pod",
        "--gpus-per-node",
        check=_min(0),
        sbatch="gpus_per_node",
        metavar="[TYPE:]N",
        parse=_gpus_arg,
    )
    gpu_type: str = opt("", "the GRES type of --gpus-per-node TYPE:N (h100); '' = any", cli="none", check=_gpu_type)
    pods_per_job: int = opt(
        0,
        "run the pool of --nodes x --tasks-per-node pods as several jobs of this many pods each "
        "(each its own MPI world and failure domain, requeued alone; one run directory and "
        "leaderboard); 0 = one job",
        "--pods-per-job",
        check=_min(0),
        metavar="M",
    )
    array: list[int] = opt(
        [],
        "job array: N (tasks 0..N-1), A-B or A,B,C tasks (run dirs task<i>), at most P at once "
        "(A[%P]); ids other than 0..N-1 go as one job each (submitit numbers an array from 0)",
        "--array",
        metavar="A[%P]",
        sbatch="array",
    )
    array_parallelism: int = opt(0, "the %P throttle of --array; 0 = no limit", cli="none", sbatch="array_parallelism")
    partition: str = opt("", "Slurm partition", "--partition", check=_no_spaces, sbatch="partition")
    account: str = opt("", "Slurm account", "--account", check=_no_spaces, sbatch="account")
    time_min: int = opt(
        60,
        "time limit: minutes, or Slurm's syntax (1:30:00, 2-00:00:00)",
        "--time",
        check=_min(1),
        sbatch="time",
        metavar="TIME",
        parse=_time_arg,
    )
    mpi: str = opt(
        "pmix",
        "srun --mpi plugin matching the MPI of mpi4py: pmix (default; a site's Open MPI/HPC-X, as "
        "slurm_templates/site.sh), pmi2 (the PyPI mpich wheel of .venv, MPICH, MVAPICH)",
        "--mpi",
        choices=("pmix", "pmi2", "none"),
    )
    run_dir: str = opt("", "default runs/<name>; array task i uses <run-dir>/task<i>", "--run-dir")
    shared_leaderboard: bool = opt(
        True,
        "array tasks get a leaderboard each (default: one shared, so later tasks join)",
        "--separate-leaderboards",
        cli="inverted",
    )
    signal_delay_s: int = opt(90, "seconds before the time limit that Slurm sends the warning signal", cli="none")
    cpus_per_task: int = opt(
        0,
        "CPUs per pod (sbatch and srun; a pod's torch threads follow it); default Slurm's, one",
        "--cpus-per-task",
        check=_min(0),
        sbatch="cpus_per_task",
        metavar="N",
    )
    node_cpus: int = opt(
        0,
        "CPUs per node that the job's tasks can have, as Slurm counts them (DGX H100/H200/B200: 112 "
        "cores; 224 with hyper-threads, unless --sbatch hint=nomultithread); a GPU job's --cpus-per-task "
        "defaults to N / --tasks-per-node; default: sinfo's, where Slurm is here",
        "--node-cpus",
        check=_min(0),
        metavar="N",
    )
    mem: str = opt("", "memory per node, sbatch syntax: 64G, 0 = all of it", "--mem", check=_mem, sbatch="mem")
    exclusive: bool = opt(False, "whole nodes (no other jobs on them)", "--exclusive", sbatch="exclusive", cli="flag")
    qos: str = opt("", "Slurm quality of service", "--qos", check=_no_spaces, sbatch="qos")
    constraint: str = opt(
        "", "node features, sbatch syntax (e.g. h100)", "--constraint", check=_no_spaces, sbatch="constraint"
    )
    exclude: str = opt(
        "",
        "nodes the job must not run on, sbatch syntax (n12,n[40-41]); --retries adds a failed part's node",
        "--exclude",
        check=_no_spaces,
        sbatch="exclude",
        metavar="NODES",
    )
    job_name: str = opt("", "default podracer-<config name>", "--job-name", check=_no_spaces, sbatch="job_name")
    mail_type: str = opt("", "e.g. END,FAIL", "--mail-type", check=_mail, sbatch="mail_type")
    mail_user: str = opt("", "where Slurm mails", "--mail-user", check=_no_spaces, sbatch="mail_user")
    dependency: str = opt("", "e.g. afterok:12345", "--dependency", check=_no_spaces, sbatch="dependency")
    sbatch: list[str] = opt(
        [],
        "any other sbatch option, repeatable: --sbatch reservation=dgx --sbatch "
        "hint=nomultithread (a bare KEY is a flag); no wckey is sent unless given here",
        "--sbatch",
        cli="append",
        metavar="KEY=VALUE",
    )
    gpu_bind: str = opt(
        "per-task",
        "per-task (default): srun --gpus-per-task=1 --gpu-bind=single:1 --distribution=block:block, "
        "each pod sees and checks its one GPU, on the NUMA node of its CPUs; none: each pod sees the "
        "node's GPUs and takes GPU <local rank>",
        "--gpu-bind",
        choices=("per-task", "none"),
    )
    hdf5_locking: str = opt(
        "",
        "HDF5_USE_FILE_LOCKING of the ranks (default: the environment's, else best-effort, "
        "which works on Lustre mounted without flock)",
        "--hdf5-locking",
        choices=("", "best-effort", "true", "false"),
    )
    cache_dir: str = opt(
        "",
        "per-node compile caches (Warp kernels, torch.compile) go under DIR/<host>; default "
        "/tmp/podracer-cache-$USER on each node",
        "--cache-dir",
    )
    container_image: str = opt(
        "",
        "run every rank in this container image (pyxis: an enroot .sqsh or docker://...; "
        "charliecloud: an image directory or .sqsh); the run directory is mounted at its own "
        "path",
        "--container-image",
        check=_no_spaces,
        metavar="IMAGE",
    )
    container_mounts: str = opt(
        "",
        "more bind mounts for the container, SRC:DST[,SRC:DST...]",
        "--container-mounts",
        check=_no_spaces,
        metavar="MOUNTS",
    )
    container_runtime: str = opt(
        "pyxis",
        "pyxis (srun --container-image, enroot), or charliecloud (ch-run IMAGE -- "
        "python3, unprivileged, for sites without pyxis)",
        "--container-runtime",
        choices=("pyxis", "charliecloud"),
    )
    srun: list[str] = opt(
        [],
        "any other srun option for the ranks, repeatable: --srun cpu-bind=cores --srun "
        "network=... (a bare KEY is a flag)",
        "--srun",
        cli="append",
        metavar="KEY=VALUE",
    )
    modules: str = opt("", "environment modules the batch script loads before srun (module load ...)", cli="none")
    site: str = opt(
        "",
        "a site file (slurm_templates/site.sh syntax, the templates' own): its partition, account, "
        "QoS, CPUs, memory, MPI, modules, sbatch and srun extras and container, under the options "
        "given here",
        "--site",
        metavar="FILE",
    )
    snapshot: bool = opt(
        True,
        "run the live checkout instead of a copy of the code made at submission (a requeue "
        "then runs whatever is checked out at that moment)",
        "--no-snapshot",
        cli="inverted",
    )

    @property
    def ranks(self) -> int:
        """Pods of the whole pool (all its jobs)."""
        return self.nodes * self.tasks_per_node

    @property
    def jobs(self) -> int:
        """Jobs the pool runs as (--pods-per-job; 1 = one MPI world)."""
        return self.ranks // self.pods_per_job if self.pods_per_job else 1

    @property
    def job_ranks(self) -> int:
        """Pods (MPI ranks) of one job."""
        return self.ranks // self.jobs

    @property
    def job_nodes(self) -> int:
        """Nodes of one job."""
        return self.nodes // self.jobs


# What podracer submit does with the request (not part of it): declared here beside the options.
ACTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "--dry-run",
        dict(
            action="store_true",
            help="print the sbatch script (with its srun line) and the resolved "
            "config; submit nothing; needs no Slurm (checks against the cluster only where sinfo exists)",
        ),
    ),
    (
        "--wait",
        dict(
            action="store_true",
            help="show progress until the job ends (requeues included), then its summary; "
            "exit 0 only when it completed its training, 1 when it failed, was cancelled or vanished, 75 when "
            "a local run was stopped with checkpoints",
        ),
    ),
    (
        "--retries",
        dict(
            type=int,
            default=0,
            metavar="K",
            help="with --wait (Slurm): resubmit a part (or the job) that failed, hung or was ended by the "
            "system, from its checkpoints, up to K times, excluding the node that failed; a part you "
            "cancelled is not retried; each retry is a row of <run>/retries.jsonl. A pool submitted "
            "without --wait: podracer resume RUN_DIR --retries K",
        ),
    ),
    (
        "--poll-slurm",
        dict(
            type=float,
            default=slurm_poll_s(),
            metavar="SECONDS",
            help="--wait asks Slurm at most this often (default $PODRACER_SLURM_POLL_S or 30: slurmctld serves "
            "every user of the cluster)",
        ),
    ),
    (
        "--timeout",
        dict(
            type=float,
            default=0,
            help="seconds --wait waits at most (default: as long as the job is queued or running)",
        ),
    ),
)


def _options() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(Request) if f.metadata["cli"] != "none"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``podracer submit``'s arguments, from the declarations."""
    p.add_argument("config", help=Request.__dataclass_fields__["job_file"].metadata["doc"])
    for f in _options():
        m = {**f.metadata, "doc": f.metadata["doc"].replace("%", "%%")}  # argparse formats help with %
        dest = f"opt_{f.name}"
        if m["cli"] == "flag":
            p.add_argument(m["flag"], dest=dest, action="store_true", help=m["doc"])
        elif m["cli"] == "inverted":
            p.add_argument(m["flag"], dest=dest, action="store_false", help=m["doc"])
        elif m["cli"] == "append":
            p.add_argument(m["flag"], dest=dest, action="append", default=[], metavar=m["metavar"], help=m["doc"])
        else:
            kind = m["parse"] or (int if isinstance(f.default, int) and not isinstance(f.default, bool) else str)
            choices = ("auto", *m["choices"]) if f.name == "executor" else (m["choices"] or None)
            default = "auto" if f.name == "executor" else "" if f.name == "array" else f.default
            p.add_argument(
                m["flag"],
                dest=dest,
                type=kind,
                default=default,
                choices=choices,
                metavar=m["metavar"] or (None if choices else m["flag"].lstrip("-").upper()),
                help=m["doc"],
            )
    for flag, kw in ACTIONS:
        p.add_argument(flag, **kw)


def from_args(args: argparse.Namespace, slurm_here: bool) -> Request:
    """The request an argparse namespace of :func:`add_arguments` describes (``auto`` resolved)."""
    kw: dict[str, Any] = {"job_file": str(job_file(args.config))}  # jobs/... from a wheel: its shipped copy
    for f in _options():
        kw[f.name] = getattr(args, f"opt_{f.name}")
    if kw["executor"] == "auto":
        kw["executor"] = "slurm" if slurm_here else "local"
    kw["array"], kw["array_parallelism"] = parse_array(kw["array"]) if kw["array"] else ([], 0)
    if isinstance(kw["gpus_per_node"], tuple):  # --gpus-per-node [TYPE:]N
        kw["gpu_type"], kw["gpus_per_node"] = kw["gpus_per_node"]
    if kw["site"]:
        from podracer_hpc.launch.site import apply_site

        kw = apply_site(
            kw,
            kw["site"],
            {f.name: [] if f.default is dataclasses.MISSING else f.default for f in dataclasses.fields(Request)},
        )
    return Request(**kw)


def own_sbatch() -> dict[str, str]:
    """sbatch option -> the submit option to use instead ("" : set by the launcher itself)."""
    out = {
        f.metadata["sbatch"].replace("_", "-"): f.metadata["flag"]
        for f in dataclasses.fields(Request)
        if f.metadata["sbatch"] and f.metadata["flag"]
    }
    return {**out, **LAUNCHER_SBATCH}


def parse_array(spec: str) -> tuple[list[int], int]:
    """``"3"`` -> [0, 1, 2]; ``"0-4%2"`` -> ([0..4], 2); ``"1,3,5"`` -> [1, 3, 5]."""
    m = re.fullmatch(r"([0-9,\-]+)(?:%([0-9]+))?", spec.strip())
    if not m:
        raise LaunchError(f"--array {spec!r}: expected N, A-B or A,B,C, optionally followed by %P")
    body, par = m.group(1), int(m.group(2) or 0)
    if m.group(2) is not None and par < 1:
        raise LaunchError(f"--array {spec!r}: a throttle of %0 would run nothing; give %P >= 1, or no %P for no limit")
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


def _option_items(items: list[str], flag: str, own: dict[str, str], example: str) -> list[tuple[str, Any]]:
    """``KEY=VALUE`` (or a bare ``KEY``: a flag) items of a pass-through option (``flag``) ->
    ``[(key, value or True)]``; refuses what is not a long option name and the keys in ``own``
    (-> the submit option to use instead; "": set by the launcher itself)."""
    out = []
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().lstrip("-").replace("_", "-").lower()
        if not re.fullmatch(r"[a-z][a-z0-9-]+", key):
            raise LaunchError(
                f"{flag} {item!r}: expected a long {flag[2:]} option name, KEY=VALUE or KEY (e.g. {example})"
            )
        if key in own:
            use = own[key]
            raise LaunchError(
                f"{flag} {item!r}: "
                + (
                    f"use podracer submit {use} instead"
                    if use
                    else f"--{key} is set by podracer submit itself (logs in the run dir, the signal that "
                    "checkpoints, requeue, the ranks' MPI world)"
                )
            )
        out.append((key, value if eq else True))
    return out


def parse_sbatch(items: list[str]) -> dict[str, Any]:
    """``--sbatch KEY=VALUE`` (or a bare ``KEY`` for a flag) items -> {key: value}; refuses keys
    that have a submit option of their own or that the launcher must set, and GPUs asked for
    past ``--gpus-per-node`` (:func:`gpu_sbatch_refusal`)."""
    out = dict(_option_items(items, "--sbatch", own_sbatch(), "--sbatch reservation=dgx --sbatch hint=nomultithread"))
    for key, value in out.items():
        if why := gpu_sbatch_refusal(key, value):
            raise LaunchError(why)
    return out


def gpu_sbatch_refusal(key: str, value: Any) -> str:
    """Why ``--sbatch KEY=VALUE`` may not ask for GPUs ("" when it asks for none): GPUs that
    reach the job past ``--gpus-per-node`` are not bound (no srun --gpus-per-task, and
    PODRACER_GPUS=0, so a pod would not even check it has one)."""
    text = "" if value is True else str(value)
    unbound = (
        "GPUs asked for here reach the job unbound (no --gpus-per-task, PODRACER_GPUS=0: each pod sees "
        "every GPU of the node, or none, and nothing checks it)"
    )
    if key == "gres":
        gpus = [g for g in text.split(",") if g.split(":")[0] == "gpu"]
        if not gpus:
            return ""
        m = re.fullmatch(r"gpu(?::([A-Za-z0-9_.-]+))?:([0-9]+)", gpus[0])
        use = (
            f"--gpus-per-node {m.group(1) + ':' if m.group(1) else ''}{m.group(2)}" if m else "--gpus-per-node [TYPE:]N"
        )
        rest = ",".join(g for g in text.split(",") if g not in gpus)
        keep = f"; keep the rest as --sbatch gres={rest}" if rest else ""
        return f"--sbatch gres={text}: use podracer submit {use} instead (one bound GPU per pod): {unbound}{keep}"
    if key == "gpus":
        return (
            f"--sbatch gpus={text}: use podracer submit --gpus-per-node (GPUs per node, e.g. {text} GPUs over "
            f"N nodes is --gpus-per-node {text}/N; TYPE:N for a GPU type) instead: {unbound}"
        )
    if key in GPU_OPTIONS:
        return (
            f"--sbatch {key}{'=' + text if text else ''}: podracer submit binds one GPU to each pod itself "
            "(--gpus-per-node [TYPE:]N, --gpu-bind per-task|none); drop this option"
        )
    return ""


# srun options the launcher sets itself (--srun may not): what to use instead
OWN_SRUN = {
    "kill-on-bad-exit": "",
    "mpi": "--mpi",
    "cpus-per-task": "--cpus-per-task",
    "gpus-per-task": "--gpu-bind",
    "gpus": "--gpus-per-node",
    "gpus-per-node": "--gpus-per-node",
    "ntasks-per-gpu": "--gpus-per-node and --tasks-per-node (one pod per GPU)",
    "container-image": "--container-image",
    "container-mounts": "--container-mounts",
    "container-workdir": "",
    "ntasks": "--nodes and --tasks-per-node",
    "output": "",
    "error": "",
    "unbuffered": "",
}


def parse_srun(items: list[str]) -> list[str]:
    """``--srun KEY=VALUE`` (or a bare ``KEY``) items -> srun's ``--key=value`` arguments; refuses
    what the launcher sets itself."""
    pairs = _option_items(items, "--srun", OWN_SRUN, "--srun cpu-bind=cores --srun network=single_node_vni")
    for k, v in pairs:
        if k == "gpu-bind" and str(v).split(",")[-1].startswith("closest"):
            # closest binds each task to every GPU of its socket (4 of a DGX's 8): srun starts, then every
            # pod fails its one-GPU check (cluster/device.py) after the queue wait
            raise LaunchError(
                f"--srun gpu-bind={v}: each pod would see every GPU near its CPUs (four on a DGX) and "
                "fail its one-GPU check at start; the default --gpu-bind per-task already binds each pod "
                "to one GPU on its own NUMA node (srun --gpu-bind=single:1 --distribution=block:block): "
                "drop this option"
            )
    return [f"--{k}" if v is True else f"--{k}={v}" for k, v in pairs]


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
        h, m, _sec = parts[:3]
    elif len(parts) == 3:
        h, m, _sec = parts
    elif len(parts) == 2:
        h, m, _sec = 0, parts[0], parts[1]
    else:
        h, m = 0, parts[0]
    return d * 1440 + h * 60 + m  # seconds dropped: a limit of 45:30 admits --time 45, not 46


def fit_cpus(req: Request, node_cpus: int, where: str) -> str:
    """CPUs per pod against the node's ``node_cpus`` (as Slurm counts them for this job; ``where``:
    where that number comes from). A GPU job that left ``--cpus-per-task`` unset gets the node's
    share (``node_cpus // tasks_per_node``: each pod the CPUs of its GPU's share of the node; the
    request is changed); a request that asks for more CPUs than a node has is refused with the
    numbers. Returns a note for the user ("" when nothing was derived)."""
    if node_cpus <= 0:
        return ""
    tasks, share = req.tasks_per_node, node_cpus // req.tasks_per_node
    if share < 1:
        raise LaunchError(
            f"--tasks-per-node {tasks}: a node has {node_cpus} CPUs ({where}), fewer than one per pod; "
            f"use --tasks-per-node {node_cpus} or fewer"
        )
    if req.cpus_per_task == 0 and req.gpus_per_node:
        req.cpus_per_task = share
        return (
            f"--cpus-per-task {share} = {node_cpus} CPUs per node ({where}) / --tasks-per-node {tasks}; "
            "give --cpus-per-task to choose"
        )
    want = tasks * max(1, req.cpus_per_task)
    if want > node_cpus:
        raise LaunchError(
            f"--tasks-per-node {tasks} x --cpus-per-task {max(1, req.cpus_per_task)} = {want} CPUs per node, "
            f"but a node has {node_cpus} ({where}): the job would never start. Use --cpus-per-task "
            f"{share} ({node_cpus} / {tasks}), or fewer tasks per node"
        )
    return ""


def threads_per_core_one(req: Request) -> bool:
    """Whether the job asks for one thread per core (``--sbatch hint=nomultithread`` or
    ``threads-per-core=1``): then Slurm's CPUs are the node's physical cores."""
    extra = parse_sbatch(req.sbatch)
    return extra.get("hint") == "nomultithread" or str(extra.get("threads-per-core", "")) == "1"


def check_fields(req: Request) -> None:
    """Each option's own check, then the choices (the message names the flag)."""
    for f in dataclasses.fields(Request):
        m, v = f.metadata, getattr(req, f.name)
        label = m["flag"] or f.name
        if m["check"] is not None and (why := m["check"](v)):
            raise LaunchError(f"{label} {v!r}: {why}" if isinstance(v, str) else f"{label} {why}")
        if m["choices"] and v not in m["choices"] and not (f.name == "hdf5_locking" and v.lower() in m["choices"]):
            named = [c for c in m["choices"] if c]
            raise LaunchError(f"{label} must be {', '.join(named[:-1])} or {named[-1]}, got {v!r}")


def run_dir_for(req: Request, cfg: Config) -> Path:
    """The run directory of a request (absolute)."""
    return Path(req.run_dir or Path("runs") / cfg.name).resolve()


def task_overrides(req: Request, cfg: Config, task: int | None) -> tuple[list[str], Path]:
    """The ``--set`` list and run dir of one (array) task."""
    base = RunDir(run_dir_for(req, cfg))
    sets = list(req.overrides)
    if task is None:
        return sets, base.root
    sets.append(f"seed={cfg.seed + 1000 * task}")
    if req.shared_leaderboard and not cfg.tournament.leaderboard_dir:
        sets.append(f"tournament.leaderboard_dir={base.leaderboard()}")
    return sets, base.task(task)
