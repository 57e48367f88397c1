"""The per-node compile caches of a pod: Warp's kernels (MuJoCo Warp), torch.compile's Inductor,
Triton and the CUDA driver's JIT, pointed at ``$PODRACER_CACHE_DIR/<host>/`` at each pod's start.

No torch here: the launcher reads :data:`CACHE_VARS` (the batch script records which of them the
job set, :data:`JOB_CACHE_VARS`) without importing it. Inside a container the node-local caches
win over the image's ENV (pyxis applies an image's ENV over the job's), and Warp's node-local
cache is seeded from kernels baked into the image (``$PODRACER_IMAGE_CACHE/warp``,
container/bake_warp.py).
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import MutableMapping
from pathlib import Path

__all__ = [
    "CACHE_VARS",
    "IMAGE_CACHE",
    "JOB_CACHE_VARS",
    "JOB_VALUE",
    "node_caches",
    "node_name",
    "record_line",
    "seed_warp_cache",
]

CACHE_VARS = {  # variable -> subdirectory
    "WARP_CACHE_PATH": "warp",  # NVIDIA Warp's kernel cache (MuJoCo Warp)
    "TORCHINDUCTOR_CACHE_DIR": "inductor",  # torch.compile
    "TRITON_CACHE_DIR": "triton",
    "CUDA_CACHE_PATH": "cuda",  # the driver's JIT cache of PTX
}


JOB_CACHE_VARS = "PODRACER_JOB_CACHE_VARS"  # the batch script's record: which of CACHE_VARS the job set
JOB_VALUE = "PODRACER_JOB_"  # + a variable's name: the job's own value, recorded before srun
IMAGE_CACHE = "PODRACER_IMAGE_CACHE"  # a podracer image's own caches (read-only; Warp kernels baked in)


def node_name() -> str:
    """This node's short host name (``node7`` for ``node7.cluster.example``): the directory of its
    caches under ``$PODRACER_CACHE_DIR``, and the host a pod's start line and heartbeat name."""
    return socket.gethostname().split(".")[0]


def record_line() -> str:
    """The batch script's line (bash, before srun enters any image) that records which cache
    variables the job set, and their values: ``PODRACER_JOB_CACHE_VARS`` (the names) and
    ``PODRACER_JOB_<VAR>`` (each value)."""
    names = " ".join(CACHE_VARS)
    return (
        f'{JOB_CACHE_VARS}=; for v in {names}; do if [ -n "${{!v:-}}" ]; then '
        f'export "{JOB_VALUE}$v=${{!v}}"; {JOB_CACHE_VARS}+="$v "; fi; done; export {JOB_CACHE_VARS}'
    )


def node_caches(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Point the compile caches at ``$PODRACER_CACHE_DIR/<host>/...``. Without ``PODRACER_CACHE_DIR``
    nothing changes (each tool's default: ~/.cache). Kernel caches in ``$HOME`` on a shared
    filesystem are written by every rank of every node at once; a node-local directory (the
    launchers' default, /tmp) or one per host avoids that.

    The job's own setting wins; a container image's does not. pyxis applies an image's ENV over
    the job's, so an image's ``WARP_CACHE_PATH`` would beat the node-local cache (and Warp rebuild
    its kernels at every container start) or replace the job's own value. So the pod does not rely
    on the environment's precedence: where the batch script recorded the job's settings before
    srun (:func:`record_line`: ``PODRACER_JOB_CACHE_VARS``, ``PODRACER_JOB_<VAR>``), each variable
    is the job's recorded value, else the node-local directory, whatever the image set. Without
    that record (``podracer mpirun``, a template), a variable already set wins unless it lies under
    ``$PODRACER_IMAGE_CACHE`` (the image's own). Then Warp's node-local cache is seeded from the
    kernels baked into the image (:func:`seed_warp_cache`)."""
    env = os.environ if environ is None else environ
    base = env.get("PODRACER_CACHE_DIR", "").strip()
    if not base:
        return {}
    root = Path(os.path.expandvars(os.path.expanduser(base))) / node_name()
    image = env.get(IMAGE_CACHE, "").strip()
    recorded = env.get(JOB_CACHE_VARS)
    set_now = {}
    for var, sub in CACHE_VARS.items():
        if recorded is not None:
            want = env.get(JOB_VALUE + var) if var in recorded.split() else None
        else:
            value = env.get(var, "")
            want = value if value and not (image and _under(value, image)) else None
        if want is None:
            want = set_now[var] = str(root / sub)
        env[var] = want
    if image and env["WARP_CACHE_PATH"] == set_now.get("WARP_CACHE_PATH"):
        seed_warp_cache(Path(image) / "warp", Path(env["WARP_CACHE_PATH"]))
    return set_now


def _under(path: str, root: str) -> bool:
    p, r = os.path.normpath(path), os.path.normpath(root)
    return p == r or p.startswith(r.rstrip("/") + "/")


def seed_warp_cache(baked: Path, cache: Path) -> int:
    """Copy each kernel directory the image baked (``wp_*`` under ``baked``, or under its Warp
    version directory, ``baked/1.19.0/wp_*``: Warp keeps ``$WARP_CACHE_PATH/<version>/``) that
    ``cache`` lacks, to the same place under ``cache``; returns how many. Each is copied to a
    private name and renamed into place, so pods of a node starting together never see half a
    kernel (the first rename wins, the others are dropped)."""
    if not baked.is_dir():
        return 0
    copied = 0
    for src in sorted(baked.iterdir()):
        if src.is_dir() and not src.name.startswith("wp_"):  # a version directory
            copied += seed_warp_cache(src, cache / src.name)
            continue
        dest = cache / src.name
        if not src.is_dir() or dest.exists():
            continue
        tmp = cache / f".{src.name}.seed{os.getpid()}"
        try:
            cache.mkdir(parents=True, exist_ok=True)
            shutil.copytree(src, tmp, dirs_exist_ok=True)
            os.rename(tmp, dest)
            copied += 1
        except OSError:  # another pod's rename came first, or the cache is not writable: Warp compiles
            shutil.rmtree(tmp, ignore_errors=True)
    return copied
