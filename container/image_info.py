"""Write the image's /opt/podracer/IMAGE.json at build time (run inside the image by the Containerfile).

    python3 container/image_info.py [--variant cpu|gpu] [--mpi auto|pmix|pmi2] [--out PATH]

What the submitter reads before queueing (podracer_hpc/launch/image.py): ``mpi``, the srun --mpi
plugin this image's mpi4py needs, found from the MPI library mpi4py loads here (the PyPI mpich
wheel, MPICH, MVAPICH, Intel MPI: pmi2; Open MPI, HPC-X: pmix), or given (``--mpi``, the build
arg IMAGE_MPI); ``mpi_library`` (its version string's first line); torch's version and CUDA;
``warp_kernels`` (kernel directories baked under PODRACER_IMAGE_CACHE/warp). One JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from podracer_hpc.cluster.mpich import pypi_mpich
from podracer_hpc.launch.image import INFO_PATH, MPI_PLUGINS

WARP_DIR = Path("/opt/podracer/cache/warp")


def mpi_of_image() -> tuple[str, str]:
    """(plugin, library) of the MPI that mpi4py loads in this image."""
    if pypi_mpich():
        from importlib.metadata import version

        return "pmi2", f"the PyPI mpich wheel (MPICH {version('mpich')})"
    import mpi4py

    mpi4py.rc.initialize = False  # MPI_Get_library_version needs no MPI_Init
    from mpi4py import MPI

    library = MPI.Get_library_version().strip().splitlines()[0]
    return ("pmix" if "Open MPI" in library else "pmi2"), library


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variant", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--mpi", default="auto", choices=("auto", *MPI_PLUGINS))
    p.add_argument("--out", type=Path, default=Path("/") / INFO_PATH)
    args = p.parse_args()
    import torch

    plugin, library = mpi_of_image()
    if args.mpi != "auto":
        plugin = args.mpi
    kernels = sorted(d.name for d in WARP_DIR.rglob("wp_*") if d.is_dir()) if WARP_DIR.is_dir() else []
    info = {
        "variant": args.variant,
        "mpi": plugin,
        "mpi_library": library,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "warp_kernels": len(kernels),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(info) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
