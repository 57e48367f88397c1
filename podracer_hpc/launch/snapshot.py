"""The code a submitted job runs: a frozen copy of the package and the job file in the run
directory, so that a requeue days later runs the same code whatever the checkout holds then."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from podracer_hpc.files.rundir import RunDir, git_revision

__all__ = ["Snapshot", "make_snapshot", "plan_snapshot"]

PACKAGE = Path(__file__).resolve().parents[1]  # podracer_hpc/


@dataclass
class Snapshot:
    """The frozen code of a submission: ``<run dir>/code/<id>/`` holds ``podracer_hpc/`` (the
    package that submitted, dirty or not), the job file (its own name: the run's default name is
    the file's stem) and ``SNAPSHOT.json`` (revision, dirty flag, where it came from). ``id`` is a
    digest of all of them, so a resubmission of unchanged code reuses it. The ranks import the
    package from here (``PYTHONPATH``, with ``PYTHONSAFEPATH=1`` so that a checkout in the
    working directory does not come first)."""

    path: Path
    id: str
    revision: str
    dirty: bool
    source: Path
    files: list[Path]
    job_text: bytes
    job_name: str

    @property
    def job_file(self) -> Path:
        return self.path / self.job_name


def _package_files(pkg: Path) -> list[Path]:
    return sorted(
        p
        for p in pkg.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and p.suffix not in (".pyc", ".pyo")
        and not p.name.startswith(".nfs")
    )


def plan_snapshot(base: Path, job_file: str) -> Snapshot:
    """The snapshot this submission will run (computed; nothing is written)."""
    files = _package_files(PACKAGE)
    job_text = Path(job_file).read_bytes()
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(PACKAGE)).encode() + b"\0" + f.read_bytes() + b"\0")
    job_name = Path(job_file).name
    h.update(job_name.encode() + b"\0" + job_text)
    revision = git_revision({})
    sid = h.hexdigest()[:12]
    return Snapshot(
        RunDir(base).code_dir / sid, sid, revision, revision.endswith("-dirty"), PACKAGE, files, job_text, job_name
    )


def make_snapshot(snap: Snapshot) -> Snapshot:
    """Write the snapshot (once: an existing one with this id is the same code) atomically."""
    if (snap.path / "SNAPSHOT.json").is_file():
        return snap
    tmp = snap.path.parent / f".{snap.id}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for f in snap.files:
        dest = tmp / "podracer_hpc" / f.relative_to(snap.source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    (tmp / snap.job_name).write_bytes(snap.job_text)
    meta = {
        "revision": snap.revision,
        "dirty": snap.dirty,
        "id": snap.id,
        "source": str(snap.source),
        "files": len(snap.files),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (tmp / "SNAPSHOT.json").write_text(json.dumps(meta, indent=2) + "\n")
    try:
        os.rename(tmp, snap.path)
    except OSError:  # another submission wrote the same snapshot first
        shutil.rmtree(tmp, ignore_errors=True)
        if not (snap.path / "SNAPSHOT.json").is_file():
            raise
    return snap
