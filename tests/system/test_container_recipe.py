"""The container recipe (container/, `make container`, docs/slurm-templates.md "Containers").

Fast checks only, no build: the Makefile targets parse (`make -n`), the scripts parse (`bash -n`),
the requirement list holds what the image must hold, every COPY source of the Containerfile is in
the build context that .dockerignore leaves, and the quickstart refuses clearly without an image.
The build itself (7-20 minutes cold on 2 shared cores, podman and root) is not part of CI; with
PODRACER_CONTAINER_TEST=1 and a built image, the last test runs the in-container quickstart.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTAINER = REPO / "container"
sys.path.insert(0, str(CONTAINER))
from requirements import requirements  # noqa: E402


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_targets_parse() -> None:
    proc = subprocess.run(
        ["make", "-n", "container", "container-gpu", "container-quickstart"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert "bash container/build.sh" in proc.stdout and "bash container/quickstart.sh" in proc.stdout, proc.stdout
    assert "PODRACER_CONTAINER_VARIANT=gpu" in proc.stdout, proc.stdout


def test_scripts_parse_as_bash() -> None:
    for f in ("build.sh", "quickstart.sh"):
        proc = subprocess.run(["bash", "-n", str(CONTAINER / f)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{f}: {proc.stderr}"


def test_requirements_hold_what_the_image_must() -> None:
    names = {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0].lower() for r in requirements()}
    for need in (
        "torch",
        "mpi4py",
        "h5py",
        "gymnasium",
        "mujoco",
        "envpool",
        "warp-lang",
        "mujoco-warp",
        "mpich",
        "safetensors",
        "pyyaml",
        "submitit",
    ):
        assert need in names, need
    assert requirements()[0] == "torch==2.13.0" and "gymnasium[mujoco]>=1.0" in requirements()
    # an NGC base keeps its own CUDA torch: no torch line at all
    assert not any(r.startswith("torch") for r in requirements(torch="", extras="mujoco"))
    assert not any(r.startswith("warp-lang") for r in requirements(extras="mujoco"))
    with pytest.raises(SystemExit, match="no extra 'gpu'"):
        requirements(extras="mujoco,gpu")


def _ignored(rel: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last matching pattern wins (a ! pattern re-includes)."""
    ignored = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        parts = rel.split("/")
        hit = any(
            fnmatch.fnmatch("/".join(parts[:i]), pat) or fnmatch.fnmatch("/".join(parts[:i]), pat.replace("**/", ""))
            for i in range(1, len(parts) + 1)
        )
        if hit:
            ignored = not neg
    return ignored


def test_containerfile_copies_only_what_the_context_has() -> None:
    text = (CONTAINER / "Containerfile").read_text()
    assert re.search(r"^ARG BASE=\S+\nFROM \$\{BASE\}$", text, re.M), "the base image must be a build argument"
    patterns = [
        ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]
    sources = [src for line in re.findall(r"^COPY (.+)$", text, re.M) for src in line.split()[:-1]]
    assert "podracer_hpc" in sources and "jobs" in sources and "pyproject.toml" in sources, sources
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: not in the checkout"
        assert not _ignored(src, patterns), f"COPY {src}: .dockerignore leaves it out of the build context"
    for big in ("build/container/wheels", "build/container-gpu/wheels", ".venv", "runs", "tests"):
        assert _ignored(big, patterns), f"{big} would be sent as build context"


def test_an_unknown_variant_is_refused_before_anything_is_built(tmp_path) -> None:
    proc = subprocess.run(
        ["bash", str(CONTAINER / "build.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "PODRACER_CONTAINER_VARIANT": "cuda", "PODRACER_CONTAINER_DIR": str(tmp_path)},
        timeout=30,
    )
    assert proc.returncode == 2 and "PODRACER_CONTAINER_VARIANT=cuda: use cpu or gpu" in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())


def test_quickstart_without_an_image_says_how_to_make_one(tmp_path) -> None:
    env = {**os.environ, "PODRACER_CONTAINER_DIR": str(tmp_path)}
    proc = subprocess.run(
        ["bash", str(CONTAINER / "quickstart.sh")], capture_output=True, text=True, env=env, timeout=30
    )
    assert proc.returncode == 2 and "run `make container` first" in proc.stderr, proc.stderr
    proc = subprocess.run(
        ["bash", str(CONTAINER / "quickstart.sh")],
        capture_output=True,
        text=True,
        env={**env, "PODS": "four"},
        timeout=30,
    )
    assert proc.returncode == 2 and "PODS=four is not a count" in proc.stderr, proc.stderr


@pytest.mark.skipif(
    os.environ.get("PODRACER_CONTAINER_TEST") != "1",
    reason="opt-in: PODRACER_CONTAINER_TEST=1 after `make container` (minutes)",
)
def test_quickstart_in_the_container() -> None:
    image = REPO / "build" / "container" / "podracer"
    if not (image / "usr" / "bin" / "python3").exists():
        pytest.skip("no image: run `make container` first")
    proc = subprocess.run(
        ["bash", str(CONTAINER / "quickstart.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "STEPS": "20480"},
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["pods"] == 4, summary
