"""What a container image says about itself, read at submit time from the image (not from here).

``make container`` / ``make container-gpu`` write ``/opt/podracer/IMAGE.json`` into the image
(container/image_info.py, at build time, with the image's own Python): the ``srun --mpi``
plugin its mpi4py's MPI speaks (``pmi2`` for the PyPI mpich wheel, MPICH, MVAPICH; ``pmix``
for Open MPI / HPC-X), torch's version and CUDA, whether Warp kernels are baked in. The
submitter reads that file before anything is queued, so a ``--mpi`` the image's MPI does not
speak is refused at the login node instead of after the queue wait (each rank would start as its
own world of one).

How it is read, by the image's form (a login node rarely has podman or root, and a .sqsh that
enroot/pyxis run is no OCI image that ``podman inspect`` could read):

- a directory (Charliecloud's ch-run image, an unpacked rootfs): the file itself;
- a squashfs (``.sqsh``/``.squashfs``, enroot/pyxis): ``unsquashfs -cat IMAGE opt/podracer/IMAGE.json``
  (squashfs-tools: no mount, no root, no daemon; the package enroot itself needs);
- anything else (``docker://...``, a registry name, an image without the file): not known; the
  caller says so and does not refuse.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["INFO_PATH", "MPI_PLUGINS", "image_info", "mpi_mismatch"]

INFO_PATH = "opt/podracer/IMAGE.json"  # inside the image's root
MPI_PLUGINS = ("pmix", "pmi2")  # what IMAGE.json's "mpi" may say
SQUASH_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")


def image_info(image: str, timeout: float = 60.0) -> tuple[dict[str, Any] | None, str]:
    """The image's IMAGE.json as a dict, or None and why it could not be read (a sentence)."""
    if "://" in image or not image:
        return None, f"{image or 'no image'} is not a file here (a registry image is read only when a node pulls it)"
    path = Path(image)
    if path.is_dir():
        f = path / INFO_PATH
        if not f.is_file():
            return None, f"the image directory {image} has no /{INFO_PATH} (an image not built by make container)"
        return _parse(f.read_text(errors="replace"), image)
    if not path.is_file():
        return None, f"no image file {image} here"
    if not path.name.endswith(SQUASH_SUFFIXES):
        return None, f"{image} is not a squashfs (.sqsh) or an image directory"
    tool = shutil.which("unsquashfs")
    if tool is None:
        return None, "no unsquashfs here (apt-get install squashfs-tools) to read the image's MPI"
    try:
        out = subprocess.run(
            [tool, "-cat", str(path), INFO_PATH], capture_output=True, text=True, timeout=timeout, errors="replace"
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"unsquashfs -cat {image} failed: {e}"
    if out.returncode != 0 or not out.stdout.strip():
        last = (out.stderr.strip().splitlines() or ["no /" + INFO_PATH])[-1]
        return None, f"the image {image} has no readable /{INFO_PATH} ({last})"
    return _parse(out.stdout, image)


def _parse(text: str, image: str) -> tuple[dict[str, Any] | None, str]:
    try:
        info = json.loads(text)
    except ValueError:
        return None, f"the image {image}'s /{INFO_PATH} is not JSON"
    if not isinstance(info, dict):
        return None, f"the image {image}'s /{INFO_PATH} is not a JSON object"
    return info, ""


def mpi_mismatch(info: dict[str, Any], mpi: str, image: str) -> str:
    """The refusal message when ``--mpi`` is not what the image's MPI speaks ("" when it is, or
    when either side is none/unknown)."""
    speaks = info.get("mpi")
    if mpi not in MPI_PLUGINS or speaks not in MPI_PLUGINS or speaks == mpi:
        return ""
    library = str(info.get("mpi_library") or "its MPI")
    why = {
        "pmi2": "which speaks PMI-1/2 only: under --mpi pmix each rank would start as its own world of one",
        "pmix": "which Slurm starts through PMIx: under --mpi pmi2 MPI_Init would fail or each rank start alone",
    }[speaks]
    return (
        f"--mpi {mpi}, but the image {image} says its mpi4py loads {library} (/{INFO_PATH}: mpi {speaks}), "
        f"{why}. Use --mpi {speaks}, or an image built on the site's MPI "
        f"(docs/slurm-templates.md, 'The image's MPI')"
    )
