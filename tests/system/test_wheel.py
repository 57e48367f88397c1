"""The package as a user installs it: a wheel built from the checkout, installed in a
fresh venv outside it, runs `podracer config`, a local `podracer submit` of a shipped job, and
`podracer study --dry-run` (or refuses with the documented message); the wheel carries jobs/,
slurm_templates/ and baselines/ (setup.py) and no top-level `analysis` package.

The fresh venv gets the wheel, and mpich + mpi4py (their libmpi must sit in the venv: mpi4py looks
for it there); the other dependencies (torch, h5py, ...) it reads from this test's environment
through a .pth file, so the test downloads nothing: what it checks is podracer-hpc's packaging,
not pip's."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# one worker builds the wheel once for both tests (two module fixtures on two xdist workers
# raced in one build/ directory: "File exists: build/bdist.../podracer_hpc-0.1.0.dist-info")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]
SKIP = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "runs", "*.egg-info", "__pycache__", ".pytest_cache")


def sh(*cmd: str, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("PODRACER_COMM", "PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**e, **(env or {})})


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    # built from a copy: setuptools builds in the source tree's build/, where a checkout's stale
    # build/lib could put modules it no longer has into the wheel
    src = work / "src"
    shutil.copytree(REPO, src, ignore=SKIP)
    r = sh(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(work / "dist"),
        str(src),
        cwd=work,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = (work / "dist").glob("podracer_hpc-*.whl")
    r = sh(sys.executable, "-m", "venv", str(work / "venv"), cwd=work)
    assert r.returncode == 0, r.stderr
    py = work / "venv" / "bin" / "python"
    r = sh(
        str(py),
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        str(wheel),
        f"mpich=={version('mpich')}",
        f"mpi4py=={version('mpi4py')}",
        cwd=work,
    )
    assert r.returncode == 0, r.stderr
    sp = Path(sh(str(py), "-c", "import site; print(site.getsitepackages()[0])", cwd=work).stdout.strip())
    (sp / "podracer-test-deps.pth").write_text(site.getsitepackages()[0] + "\n")  # torch & co. from here, after
    return work, wheel


def test_the_wheel_ships_the_jobs_templates_and_baseline_but_no_top_level_analysis(venv):
    _, wheel = venv
    names = zipfile.ZipFile(wheel).namelist()
    for f in (
        "podracer_hpc/_shipped/jobs/quickstart.yaml",
        "podracer_hpc/_shipped/slurm_templates/submit.sh",
        "podracer_hpc/_shipped/baselines/rllib/train.py",
        "podracer_hpc/report/aggregate.py",
    ):
        assert f in names, f
    assert not [n for n in names if n.startswith("analysis/")]


def test_an_installed_wheel_runs_config_submit_and_study(venv, tmp_path):
    work, _ = venv
    bin_ = work / "venv" / "bin"
    r = sh(
        str(bin_ / "python"),
        "-c",
        "import podracer_hpc, importlib.util as u; print(podracer_hpc.__file__); print(u.find_spec('analysis'))",
        cwd=tmp_path,
    )
    assert r.stdout.split() == [
        str(next((work / "venv" / "lib").glob("python3*/site-packages")) / "podracer_hpc" / "__init__.py"),
        "None",
    ], r.stdout + r.stderr
    r = sh(str(bin_ / "podracer"), "config", cwd=tmp_path)
    assert r.returncode == 0 and "tournament.margin_se" in r.stdout, r.stderr
    r = sh(
        str(bin_ / "podracer"),
        "submit",
        "jobs/quickstart.yaml",
        "--executor",
        "local",
        "--tasks-per-node",
        "2",
        "--wait",
        "--timeout",
        "240",
        "--set",
        "total_env_steps=8192",
        "--set",
        "env.num_envs=64",
        "--set",
        "eval.final_episodes=4",
        "--set",
        "threads=1",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["pods"] == 2 and summary["env_steps"] == 2 * 8192 and (tmp_path / "runs" / "quickstart").is_dir()
    r = sh(
        str(bin_ / "podracer"),
        "study",
        "jobs/studies/pendulum_scaling.yaml",
        "--executor",
        "local",
        "--dry-run",
        cwd=tmp_path,
    )
    # the study's RLlib system needs .venv-rllib, which only a checkout's set-up makes: the dry run plans
    # without it and says so; the run itself is the documented refusal
    assert r.returncode == 0 and "skipped here: system rllib" in r.stdout and ".venv-rllib" in r.stdout, r.stdout
    assert "Traceback" not in r.stderr
