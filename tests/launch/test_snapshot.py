"""The code snapshot (launch/snapshot.py): what it freezes, that it is compiled with the sources
and the ranks load that bytecode and write none, and that a changed snapshot is never reused."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from podracer_hpc import launch

REPO = Path(__file__).resolve().parents[2]


def test_snapshot_freezes_the_package_and_the_job_file(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: snap\n")
    plan = launch.plan_snapshot(tmp_path / "run", str(job))
    assert not plan.path.exists()  # planning writes nothing
    snap = launch.make_snapshot(plan)
    meta = json.loads((snap.path / "SNAPSHOT.json").read_text())
    assert meta["revision"] == snap.revision and meta["dirty"] == snap.revision.endswith("-dirty")
    assert (snap.path / "podracer_hpc" / "launch" / "slurm.py").read_bytes() == (
        Path(launch.__file__).parent / "slurm.py"
    ).read_bytes()
    assert snap.job_file.read_text() == "name: snap\n"
    # compiled with it: every module's bytecode for this Python, naming the snapshot's own path
    sources = list((snap.path / "podracer_hpc").rglob("*.py"))
    assert sources and all(Path(importlib.util.cache_from_source(str(f))).is_file() for f in sources)
    before = sorted(p.relative_to(snap.path) for p in snap.path.rglob("*"))
    assert launch.plan_snapshot(tmp_path / "run", str(job)).id == snap.id  # same code, same snapshot
    job.write_text("name: snap2\n")
    assert launch.plan_snapshot(tmp_path / "run", str(job)).id != snap.id
    # the snapshot runs as the package, with its revision, whatever the working directory holds
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import podracer_hpc, podracer_hpc.cluster.device as d; "
            "print(podracer_hpc.__file__); print(d.code_revision()); print(d.start_line.__code__.co_filename)",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(snap.path), "PYTHONSAFEPATH": "1", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    device_py = snap.path / "podracer_hpc" / "cluster" / "device.py"
    assert out.stdout.split() == [str(snap.path / "podracer_hpc" / "__init__.py"), snap.revision, str(device_py)]
    # the ranks load that bytecode (python -v: "code object from ...pyc") and write nothing
    out = subprocess.run(
        [sys.executable, "-v", "-c", "import podracer_hpc.cluster.device"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(snap.path), "PYTHONSAFEPATH": "1", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert f"code object from '{importlib.util.cache_from_source(str(device_py))}'" in out.stderr
    assert sorted(p.relative_to(snap.path) for p in snap.path.rglob("*")) == before


def test_a_changed_snapshot_is_not_reused(tmp_path, capsys):
    """A snapshot is reused only while it holds what it froze: a planted podracer_hpc/__init__.py,
    or a file added beside the package, never runs; the snapshot is written again and the
    tampered one kept aside."""
    job = tmp_path / "job.yaml"
    job.write_text("name: snap\n")
    snap = launch.make_snapshot(launch.plan_snapshot(tmp_path / "run", str(job)))
    meta = json.loads((snap.path / "SNAPSHOT.json").read_text())
    assert len(meta["sha256"]) == 64 and meta["sha256"].startswith(snap.id)
    init = snap.path / "podracer_hpc" / "__init__.py"
    original = init.read_bytes()
    marker = tmp_path / "marker"
    cache = snap.path / "podracer_hpc" / "__pycache__"
    pyc = importlib.util.cache_from_source(str(init))
    for plant in ("init", "beside", "cache"):
        if plant == "init":
            init.write_bytes(original + f"\nopen({str(marker)!r}, 'w').close()\n".encode())
        elif plant == "beside":
            (snap.path / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
        else:
            Path(pyc).write_bytes(b"planted")
            (cache / "stray.cpython-311.pyc").write_bytes(b"planted")
        again = launch.make_snapshot(launch.plan_snapshot(tmp_path / "run", str(job)))  # the next submit
        assert again.path == snap.path and init.read_bytes() == original
        assert not (snap.path / "sitecustomize.py").exists() and not (cache / "stray.cpython-311.pyc").exists()
        assert Path(pyc).read_bytes() != b"planted" and Path(pyc).stat().st_size > 100  # compiled again
        err = capsys.readouterr().err
        assert ("moved aside" in err) == (plant != "cache"), err  # a cache is not content: only rebuilt
    aside = sorted(p.name for p in snap.path.parent.iterdir() if ".mismatch-" in p.name)
    assert len(aside) == 2 and all(p.startswith(f".{snap.id}.mismatch-") for p in aside)
    out = subprocess.run(
        [sys.executable, "-c", "import podracer_hpc"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(snap.path), "PYTHONSAFEPATH": "1"},
    )
    assert out.returncode == 0 and not marker.exists(), out.stderr
    assert launch.make_snapshot(launch.plan_snapshot(tmp_path / "run", str(job))).path == snap.path  # intact: reused
    assert "moved aside" not in capsys.readouterr().err
