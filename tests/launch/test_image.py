"""The image's MPI, read from the image at submit time (launch/image.py), and a --mpi it does not
speak refused before anything is queued.

The images are real: an image directory (what ch-run runs) and a squashfs made by mksquashfs (what
enroot/pyxis run), each holding /opt/podracer/IMAGE.json as container/image_info.py writes it;
the squashfs is read with unsquashfs, as on a login node. The refusal is checked through the
CLI with an ``sbatch`` on PATH that records whether it was ever called.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from podracer_hpc.launch.image import INFO_PATH, image_info, mpi_mismatch

REPO = Path(__file__).resolve().parents[2]
WHEEL = {"variant": "gpu", "mpi": "pmi2", "mpi_library": "the PyPI mpich wheel (MPICH 5.0.2)", "cuda": "12.8"}
HPCX = {"variant": "gpu", "mpi": "pmix", "mpi_library": "Open MPI v4.1.7rc1 (HPC-X)", "cuda": "12.8"}
needs_squashfs = pytest.mark.skipif(
    shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None,
    reason="no squashfs-tools (apt-get install squashfs-tools)",
)


def image_dir(root: Path, info: dict | None) -> Path:
    (root / "usr" / "bin").mkdir(parents=True)
    if info is not None:
        (root / INFO_PATH).parent.mkdir(parents=True)
        (root / INFO_PATH).write_text(json.dumps(info) + "\n")
    return root


def squash(tmp: Path, info: dict | None, name: str = "img") -> Path:
    src = image_dir(tmp / f"{name}-root", info)
    out = tmp / f"{name}.sqsh"
    subprocess.run(["mksquashfs", str(src), str(out), "-noappend", "-quiet", "-no-progress"], check=True)
    return out


def test_a_directory_image_says_its_mpi(tmp_path):
    info, why = image_info(str(image_dir(tmp_path / "d", WHEEL)))
    assert info == WHEEL and why == ""
    info, why = image_info(str(image_dir(tmp_path / "bare", None)))
    assert info is None and f"no /{INFO_PATH}" in why


@needs_squashfs
def test_a_squashfs_image_is_read_without_mounting_it(tmp_path):
    info, why = image_info(str(squash(tmp_path, HPCX)))
    assert info == HPCX and why == ""
    info, why = image_info(str(squash(tmp_path, None, "old")))
    assert info is None and "no readable" in why


def test_what_cannot_be_read_here_says_why(tmp_path):
    assert "registry image" in image_info("docker://nvcr.io#nvidia/pytorch:25.01-py3")[1]
    assert "no image file" in image_info(str(tmp_path / "missing.sqsh"))[1]
    (tmp_path / "x.tar").write_text("x")
    assert "not a squashfs" in image_info(str(tmp_path / "x.tar"))[1]
    bad = image_dir(tmp_path / "bad", None)
    (bad / INFO_PATH).parent.mkdir(parents=True)
    (bad / INFO_PATH).write_text("{not json")
    assert "not JSON" in image_info(str(bad))[1]


def test_mismatch_rule():
    assert "PMI-1/2 only" in mpi_mismatch(WHEEL, "pmix", "img.sqsh") and "Use --mpi pmi2" in mpi_mismatch(
        WHEEL, "pmix", "img.sqsh"
    )
    assert "Use --mpi pmix" in mpi_mismatch(HPCX, "pmi2", "img.sqsh")
    assert mpi_mismatch(WHEEL, "pmi2", "i") == mpi_mismatch(HPCX, "pmix", "i") == ""
    assert mpi_mismatch(WHEEL, "none", "i") == mpi_mismatch({"mpi": "?"}, "pmix", "i") == ""


def _submit(tmp: Path, image: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``podracer submit --executor slurm`` with a stand-in sbatch on PATH that records each call."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    called = tmp / "sbatch-called"
    for tool in ("sbatch", "sinfo", "srun", "squeue", "scontrol"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "$0 $*" >>{called}\nexit 1\n')
        (bin_dir / tool).chmod(0o755)
    squashfs_dir = Path(shutil.which("unsquashfs") or "/usr/bin/unsquashfs").parent
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "submit", "jobs/quickstart.yaml", "--executor", "slurm"]
        + ["--container-image", str(image), "--run-dir", str(tmp / "run"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PATH": f"{bin_dir}:{squashfs_dir}:/usr/bin:/bin"},
    )
    return r, called


@needs_squashfs
def test_a_pmix_submit_of_a_pmi2_image_is_refused_before_queueing(tmp_path):
    """The default --mpi pmix with the PyPI-mpich image: exit 2, the image and its MPI named, no
    sbatch (nor sinfo) ever called; the dry run refuses too. --mpi pmi2 passes the dry run."""
    image = squash(tmp_path, WHEEL)
    for extra in ((), ("--dry-run",)):
        r, called = _submit(tmp_path, image, *extra)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "--mpi pmix, but the image" in r.stderr and "PyPI mpich wheel" in r.stderr, r.stderr
        assert "Use --mpi pmi2" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not called.exists(), called.read_text()
    r, _ = _submit(tmp_path, image, "--mpi", "pmi2", "--dry-run")
    assert r.returncode == 0 and "--mpi=pmi2" in r.stdout and "--container-image=" in r.stdout, r.stderr


@needs_squashfs
def test_a_pmi2_submit_of_a_pmix_image_is_refused_and_an_unreadable_image_noted(tmp_path):
    r, _ = _submit(tmp_path, squash(tmp_path, HPCX), "--mpi", "pmi2", "--dry-run")
    assert r.returncode == 2 and "Open MPI" in r.stderr and "Use --mpi pmix" in r.stderr, r.stderr
    r, _ = _submit(tmp_path, squash(tmp_path, None, "old"), "--mpi", "pmix", "--dry-run")
    assert r.returncode == 0 and "the image's MPI is not checked against --mpi pmix" in r.stderr, r.stderr
