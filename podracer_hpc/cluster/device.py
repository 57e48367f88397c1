"""Where a pod runs: its GPU (bound by Slurm, checked here), its CPU threads, its start line.

Called once per rank at start-up, before the pod's env is built:

- :func:`resolve_device` turns ``device`` (``auto`` | ``cuda`` | ``cuda:N`` | ``cpu``) into the
  rank's ``torch.device``, sets it (``torch.cuda.set_device``), and checks that the rank has
  exactly the GPU it should have: one GPU per pod, bound by Slurm (``srun --gpus-per-task=1``:
  each task's ``CUDA_VISIBLE_DEVICES`` lists one GPU), or, when the node's GPUs are all visible,
  GPU ``local rank`` of them, with never two pods of a node on one GPU. A job that asked for GPUs,
  or ``device: cuda``, on a torch without CUDA fails here, before any training, with how to
  install the CUDA build (:class:`DeviceError`). It also points the compile caches (Warp
  kernels, torch.compile/Triton, CUDA JIT) at a per-node directory (:func:`podracer_hpc.cluster.caches.node_caches`).
- :func:`set_cpu_threads` sets torch's CPU threads from the allocation (``SLURM_CPUS_PER_TASK``,
  ``OMP_NUM_THREADS``, the affinity mask), and on a node that is not the pod's alone (no CPU
  binding, nothing set) only as many as are idle: OpenMP threads that spin-wait for a
  descheduled partner turned a busy node into a 25-50x slowdown (bench/HISTORY.md, "A pod on a
  node it does not have to itself").
- :func:`start_line` is the one line every pod prints: rank, host, device (GPU name, or CPU and
  threads), where it runs (its GPU's NUMA node, its CPU list and their NUMA nodes, from /sys, and
  a warning when they differ), env backend, torch and CUDA versions, code revision.

Launchers (``podracer submit``, slurm_templates/) export ``PODRACER_GIT_REVISION`` (the code
snapshot's revision, :func:`code_revision`) and ``PODRACER_CACHE_DIR``.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping

import torch

from podracer_hpc.cluster.caches import node_caches
from podracer_hpc.files.rundir import git_revision as code_revision  # one owner of the run's provenance

__all__ = [
    "DeviceError",
    "SHARED",
    "resolve_device",
    "set_cpu_threads",
    "cpu_threads",
    "Threads",
    "start_line",
    "cpu_list",
    "describe_device",
    "gpu_numa_node",
    "numa_nodes_of",
    "placement",
    "code_revision",
    "gpus_requested",
    "CUDA_INSTALL_HINT",
]

CUDA_INSTALL_HINT = (
    "install a CUDA build of torch: with pip, `pip install torch --index-url https://download.pytorch.org/whl/cu126` "
    "(pick the cuXYZ your driver supports: nvidia-smi); with conda, `CONDA_OVERRIDE_CUDA=12.6 conda env create -f "
    "environment.yml` (a login node without a GPU otherwise gets the CPU build; docs/slurm-templates.md)"
)


class DeviceError(RuntimeError):
    """The pod cannot have the device it needs; the message says why and what to do."""


# ------------------------------------------------------------------------------------------
# GPUs
# ------------------------------------------------------------------------------------------
def _visible(environ: Mapping[str, str]) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list (None when unset: every GPU of the node is visible)."""
    v = environ.get("CUDA_VISIBLE_DEVICES")
    if v is None:
        return None
    return [x.strip() for x in v.split(",") if x.strip() and x.strip() != "-1"] if v.strip() else []


def _count(v: str) -> int | None:
    n = v.strip().rsplit(":", 1)[-1]  # "h100:8" form
    return int(n) if n.isdigit() else None


def gpus_requested(environ: Mapping[str, str] | None = None) -> str:
    """Why this process should have a GPU, or "" when nothing asked for one.

    What the job asked for decides: the launchers' ``PODRACER_GPUS`` (GPUs per node), else
    Slurm's ``SLURM_GPUS_PER_NODE``/``_PER_TASK``/``SLURM_GPUS`` (``--gpus-per-node=0`` is a no);
    only when none of these is set, GPUs the job holds anyway (``--gres=gpu:N``: ``SLURM_GPUS_ON_NODE``,
    ``SLURM_STEP_GPUS``, ``SLURM_JOB_GPUS``). An ``--exclusive`` job that asked for no GPU holds the
    node's GPUs too: that is not a request.
    """
    env = os.environ if environ is None else environ
    if _count(env.get("PODRACER_GPUS", "")) is not None:
        return f"PODRACER_GPUS={env['PODRACER_GPUS']}" if _count(env["PODRACER_GPUS"]) else ""
    asked = [
        (k, env[k])
        for k in ("SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_GPUS")
        if _count(env.get(k, "")) is not None
    ]
    if asked:
        return next((f"{k}={v}" for k, v in asked if _count(v)), "")
    if _count(env.get("SLURM_GPUS_ON_NODE", "")):
        return f"SLURM_GPUS_ON_NODE={env['SLURM_GPUS_ON_NODE']}"
    for k in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if env.get(k, "").strip():
            return f"{k}={env[k]}"
    return ""


def _local(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """This process's rank and rank count on its node, as the launcher says (None: unknown)."""
    for r, s in (
        ("SLURM_LOCALID", None),
        ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ):
        if environ.get(r, "").isdigit():
            size = environ.get(s, "") if s else ""
            if not s:  # Slurm: "8" or "8(x4)" or "2,1"
                node = environ.get("SLURM_STEP_TASKS_PER_NODE", environ.get("SLURM_TASKS_PER_NODE", ""))
                nid = int(environ.get("SLURM_NODEID", "0") or 0)
                counts: list[int] = []
                for part in node.split(","):
                    n, _, rep = part.partition("(x")
                    if n.isdigit():
                        counts += [int(n)] * (int(rep.rstrip(")")) if rep.rstrip(")").isdigit() else 1)
                size = str(counts[nid]) if nid < len(counts) else ""
            return int(environ[r]), int(size) if size.isdigit() else None
    return None, None


SHARED = "cuda:shared"  # device setting: pods share GPUs on purpose (no one-GPU-per-pod check)


def resolve_device(
    spec: str,
    local_rank: int = 0,
    local_size: int | None = None,
    allgather: Callable[[Any], list[Any]] | None = None,
    environ: MutableMapping[str, str] | None = None,
) -> torch.device:
    """The rank's device for ``device: spec``; sets it and checks the GPU binding.

    ``auto``: a GPU when one is visible (and an error when the job asked for GPUs but torch cannot
    use one), else the CPU. ``cuda``: a GPU or an error. ``cuda:N``: exactly that GPU, no binding
    check (the user chose). ``cuda:shared``: the opt-in for pods that share GPUs on purpose (a
    scaling study of several pods on one GPU): GPU ``local_rank % count``, no one-GPU-per-pod
    check. ``cpu``: the CPU, whatever was allocated.
    ``local_rank``/``local_size``: this rank on its node (``Comm.local_rank``/``local_size``;
    ``local_size`` defaults to what the launcher's variables say). ``allgather`` (``Comm.allgather``,
    optional, then every rank must call): the ranks compare GPU UUIDs, so that no two pods of a
    node share a GPU, and a rank's error fails every rank with the same message instead of
    leaving the others waiting. Also sets up the per-node compile caches
    (:func:`podracer_hpc.cluster.caches.node_caches`).
    Raises :class:`DeviceError` with what to do.
    """
    env = os.environ if environ is None else environ
    node_caches(env)
    err, dev = "", torch.device("cpu")
    try:
        dev = _pick(spec, local_rank, local_size, env)
    except DeviceError as e:
        err = str(e)
    if allgather is not None:
        mine = (socket.gethostname(), _gpu_uuid(dev.index) if dev.type == "cuda" else "", err)
        everyone = allgather(mine)
        if err:
            raise DeviceError(err)
        bad = [(r, h, e) for r, (h, _, e) in enumerate(everyone) if e]
        if bad:
            r, h, e = bad[0]
            raise DeviceError(f"rank {r} on {h}: {e}")
        if mine[1] and spec != SHARED:
            same = [r for r, (h, u, _) in enumerate(everyone) if h == mine[0] and u == mine[1]]
            if len(same) > 1:
                raise DeviceError(
                    f"ranks {same} on {mine[0]} share one GPU ({mine[1]}): one GPU per pod; ask for "
                    "--gpus-per-node = --tasks-per-node and bind them (srun --gpus-per-task=1); to share GPUs on "
                    "purpose: --set device=cuda:shared"
                )
    elif err:
        raise DeviceError(err)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def _pick(spec: str, local_rank: int, local_size: int | None, env: Mapping[str, str]) -> torch.device:
    spec = (spec or "auto").strip()
    if spec == "cpu":
        return torch.device("cpu")
    shared = spec == SHARED
    if shared:
        spec = "cuda"
    if not (spec in ("auto", "cuda") or spec.startswith("cuda:")):
        return torch.device(spec)  # mps, xpu, ...: torch says whether it exists
    asked = gpus_requested(env)
    want = spec.startswith("cuda") or bool(asked)
    why = f"device={spec!r}" if spec.startswith("cuda") else f"the job asked for GPUs ({asked})"
    if torch.version.cuda is None:
        if want:
            raise DeviceError(
                f"{why}, but this torch ({torch.__version__}) is a CPU-only build; {CUDA_INSTALL_HINT}; "
                "or train on the CPU: --set device=cpu"
            )
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if want:
            raise DeviceError(
                f"{why}, but torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU on "
                f"{socket.gethostname()} (CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}): "
                f"check `nvidia-smi` there, that the driver supports CUDA {torch.version.cuda}, and "
                "that the job asked for GPUs (--gpus-per-node)"
            )
        return torch.device("cpu")
    count = torch.cuda.device_count()
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if spec.startswith("cuda:"):
        idx = int(spec.split(":", 1)[1])
        if idx >= count:
            raise DeviceError(f"device={spec!r}, but {count} GPU(s) are visible here (CUDA_VISIBLE_DEVICES={vis!r})")
        return torch.device("cuda", idx)
    if shared:  # several pods on one GPU, asked for: round-robin over the visible GPUs
        return torch.device("cuda", local_rank % count)
    _, launcher_size = _local(env)
    local_size = local_size or launcher_size
    if env.get("PODRACER_GPU_BIND", "") == "per-task" and count != 1:
        raise DeviceError(
            f"each pod should see exactly one GPU (srun --gpus-per-task=1), but this one sees {count} "
            f"(CUDA_VISIBLE_DEVICES={vis!r}): Slurm did not bind the GPUs; check the site's gres.conf, or "
            "submit with --gpu-bind none (each pod then takes GPU <local rank> of the node's)"
        )
    if count == 1:
        return torch.device("cuda", 0)
    if local_size is not None and local_size > count:
        raise DeviceError(
            f"{local_size} pods on {socket.gethostname()} but {count} GPUs visible: two pods would "
            "share a GPU; ask for one GPU per pod (--gpus-per-node = --tasks-per-node), or share them on "
            "purpose: --set device=cuda:shared"
        )
    return torch.device("cuda", local_rank % count)


def _gpu_uuid(idx: int) -> str:
    try:
        return str(torch.cuda.get_device_properties(idx).uuid)
    except Exception:  # older torch: no uuid; the PCI bus id is as good
        try:
            return torch.cuda.get_device_properties(idx).name + f"#{idx}"
        except Exception:
            return f"cuda:{idx}"


def cpu_list(cpus: set[int] | list[int]) -> str:
    """{0, 1, 2, 5} -> ``"0-2,5"`` (the kernel's cpulist syntax)."""
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


def _parse_cpu_list(text: str) -> set[int]:
    """``"0-2,5"`` -> {0, 1, 2, 5}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        if a.strip().isdigit():
            out.update(range(int(a), int(b if b.strip().isdigit() else a) + 1))
    return out


def numa_nodes_of(cpus: set[int], sys_root: str | os.PathLike = "/sys") -> list[int]:
    """The NUMA nodes that ``cpus`` lie on (``/sys/devices/system/node/node*/cpulist``; [] where
    the machine does not tell)."""
    found = []
    for d in sorted(Path(sys_root, "devices", "system", "node").glob("node[0-9]*")):
        try:
            if _parse_cpu_list((d / "cpulist").read_text()) & cpus:
                found.append(int(d.name[4:]))
        except (OSError, ValueError):
            continue
    return sorted(found)


def gpu_numa_node(pci_bus_id: str, sys_root: str | os.PathLike = "/sys") -> int | None:
    """The NUMA node of the GPU at PCI address ``pci_bus_id`` (``0000:1b:00.0``), from
    ``/sys/bus/pci/devices/<id>/numa_node``; None where unknown (-1: a machine without NUMA)."""
    try:
        node = int(Path(sys_root, "bus", "pci", "devices", pci_bus_id.lower(), "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _pci_bus_id(idx: int) -> str:
    """The PCI address of CUDA device ``idx`` (``0000:1b:00.0``); "" where torch does not say."""
    p = torch.cuda.get_device_properties(idx)
    bus, dev, dom = (getattr(p, k, None) for k in ("pci_bus_id", "pci_device_id", "pci_domain_id"))
    return f"{dom or 0:04x}:{bus:02x}:{dev:02x}.0" if bus is not None and dev is not None else ""


def placement(cpus: set[int], gpu_pci: str = "", sys_root: str | os.PathLike = "/sys") -> tuple[str, str]:
    """Where a pod runs: (`` on CPUs 0-13 (NUMA 0)``, ``NUMA 0``: its GPU's node, "" without a
    GPU or where unknown); the CPUs' part ends with a warning when they are not on the GPU's node
    (its threads would reach the GPU across the sockets' link)."""
    nodes = numa_nodes_of(cpus, sys_root) if cpus else []
    where = f" on CPUs {cpu_list(cpus)}" if cpus else ""
    if nodes:
        where += f" (NUMA {','.join(map(str, nodes))})"
    gpu_node = gpu_numa_node(gpu_pci, sys_root) if gpu_pci else None
    if gpu_node is None:
        return where, ""
    if nodes and gpu_node not in nodes:
        where += f", not on its GPU's NUMA node {gpu_node}: bind pods next to their GPU (podracer submit's default)"
    return where, f"NUMA {gpu_node}"


def describe_device(
    device: torch.device | str,
    threads: int | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    cpus: set[int] | None = None,
    gpu_pci: str | None = None,
    sys_root: str | os.PathLike = "/sys",
) -> str:
    """``GPU NVIDIA H100 80GB HBM3 (cuda:0, CUDA_VISIBLE_DEVICES=3, NUMA 0), 14 CPU threads on CPUs
    0-13 (NUMA 0)`` or ``CPU x86_64, 16 threads on CPUs 0-15 (NUMA 0)``. ``cpus``: the pod's
    affinity (default: this process's); ``gpu_pci``: its GPU's PCI address (default: torch's);
    ``sys_root``: where the machine's topology is read (``/sys``)."""
    env = os.environ if environ is None else environ
    device = torch.device(device)
    vis = env.get("CUDA_VISIBLE_DEVICES")
    cpus = _affinity() if cpus is None else cpus
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(idx)
        on_cpus, gpu_node = placement(cpus, _pci_bus_id(idx) if gpu_pci is None else gpu_pci, sys_root)
        where = ", ".join(
            [f"cuda:{idx}"] + ([f"CUDA_VISIBLE_DEVICES={vis}"] if vis is not None else []) + [gpu_node] * bool(gpu_node)
        )
        n = f", {threads} CPU thread{'s' * (threads != 1)}" if threads else ", CPU threads"
        return f"GPU {name} ({where}){n}{on_cpus}"
    if device.type == "cpu":
        n = threads or torch.get_num_threads()
        text = f"CPU {platform.machine() or platform.processor() or ''}".rstrip() + f", {n} thread{'s' * (n != 1)}"
        text += placement(cpus, "", sys_root)[0]
        if vis:
            text += f" (GPUs visible but unused: CUDA_VISIBLE_DEVICES={vis})"
        return text
    return str(device)


# ------------------------------------------------------------------------------------------
# CPU threads
# ------------------------------------------------------------------------------------------
@dataclass
class Threads:
    """The CPU threads chosen for a pod, and why."""

    n: int
    why: str


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def _cpu_times(cpus: set[int]) -> dict[int, tuple[int, int]]:
    """(idle, total) jiffies of each CPU in ``cpus``, from /proc/stat ({} where unreadable)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        name, *vals = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in vals[:8]] + [0] * max(0, 8 - len(vals))
        out[int(name[3:])] = (v[3] + v[4], sum(v))
    return out


def idle_cpus(cpus: set[int] | None = None, seconds: float = 0.3) -> float | None:
    """How many of ``cpus`` (default: this process's) were idle over the next ``seconds``
    (/proc/stat); None where that cannot be read."""
    cpus = cpus or _affinity()
    a = _cpu_times(cpus)
    if not a:
        return None
    time.sleep(seconds)
    b = _cpu_times(cpus)
    idle = 0.0
    for c, (i0, t0) in a.items():
        if c in b and b[c][1] > t0:
            idle += (b[c][0] - i0) / (b[c][1] - t0)
    return idle


def cpu_threads(
    threads: int = 0,
    ranks_on_node: int = 1,
    environ: Mapping[str, str] | None = None,
    probe: Callable[[set[int]], float | None] = idle_cpus,
) -> Threads:
    """torch CPU threads for one pod: ``threads`` if set, else from the allocation.

    In order: ``SLURM_CPUS_PER_TASK`` (what Slurm gave the task, at most the CPUs it may run on);
    ``OMP_NUM_THREADS``; the CPUs of the affinity mask when the process is bound (Slurm's task
    binding, taskset). Else the node's CPUs are nobody's in particular (a workstation, a login or
    shared node): the pod takes its share of the node's CPUs (``ranks_on_node`` ranks), and no more
    than are idle now (``probe``): OpenMP threads that outnumber the free CPUs spin-wait for
    descheduled partners, a 25x slowdown measured on a busy node (bench/HISTORY.md), where one
    thread loses only its fair share.
    """
    env = os.environ if environ is None else environ
    if threads:
        return Threads(max(1, threads), "threads setting")
    mask = _affinity()
    node = os.cpu_count() or len(mask)
    cpt = env.get("SLURM_CPUS_PER_TASK", "")
    omp = env.get("OMP_NUM_THREADS", "")
    if cpt.isdigit() and int(cpt) > 0:
        return Threads(max(1, min(len(mask), int(cpt))), f"SLURM_CPUS_PER_TASK={cpt}, {len(mask)} CPUs in the mask")
    if omp.isdigit() and int(omp) > 0:
        return Threads(int(omp), f"OMP_NUM_THREADS={omp}")
    if len(mask) < node:
        return Threads(len(mask), f"bound to {len(mask)} of the node's {node} CPUs")
    share = max(1, len(mask) // max(1, ranks_on_node))
    why = f"{share} of {len(mask)} CPUs ({ranks_on_node} pod(s) on the node, none bound)"
    if share > 1:
        idle = probe(mask)
        if idle is not None:
            free = max(1, int(idle / max(1, ranks_on_node) + 0.25))
            if free < share:
                return Threads(free, f"{why}; only {idle:.1f} CPUs idle: a shared node")
            why += f"; {idle:.1f} idle"
    return Threads(share, why)


_last_threads: Threads | None = None


def set_cpu_threads(threads: int = 0, ranks_on_node: int = 1, environ: Mapping[str, str] | None = None) -> int:
    """Set torch's CPU threads for one pod (:func:`cpu_threads`); returns the count."""
    global _last_threads
    choice = cpu_threads(threads, ranks_on_node, environ)
    torch.set_num_threads(choice.n)
    _last_threads = choice
    return choice.n


def threads_reason() -> str:
    """Why :func:`set_cpu_threads` chose what it chose last ("" before it ran)."""
    return _last_threads.why if _last_threads else ""


# ------------------------------------------------------------------------------------------
# Code revision and the start line
# ------------------------------------------------------------------------------------------
def start_line(
    rank: int,
    host: str,
    device: torch.device | str,
    threads: int,
    backend: str,
    *,
    world_size: int | None = None,
    local_rank: int | None = None,
    revision: str | None = None,
    environ: Mapping[str, str] | None = None,
    cpus: set[int] | None = None,
    gpu_pci: str | None = None,
    sys_root: str | os.PathLike = "/sys",
) -> str:
    """The one line a pod prints at start-up, e.g.

    ``pod 3/32 on dgx017 (local 3): GPU NVIDIA H100 80GB HBM3 (cuda:0, CUDA_VISIBLE_DEVICES=3,
    NUMA 0), 14 CPU threads on CPUs 42-55 (NUMA 0) | env backend warp | torch 2.5.1+cu124, CUDA
    12.4 | code 85cb676``

    ``pod 0/1 on laptop: CPU x86_64, 2 threads on CPUs 0-1 (NUMA 0) | env backend torch | torch
    2.13.0+cpu, CUDA none (CPU-only build) | code 85cb676-dirty``

    (The GPU's NUMA node and the CPUs' are read from ``sys_root``; see :func:`describe_device`.)
    """
    who = f"pod {rank}" + (f"/{world_size}" if world_size else "") + f" on {host}"
    if local_rank is not None:
        who += f" (local {local_rank})"
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CUDA none (CPU-only build)"
    rev = revision if revision is not None else code_revision(environ)
    return (
        f"{who}: {describe_device(device, threads, environ, cpus=cpus, gpu_pci=gpu_pci, sys_root=sys_root)} | "
        f"env backend {backend} | "
        f"torch {torch.__version__}, {cuda} | code {rev}"
    )
