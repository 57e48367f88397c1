"""The code a submitted job runs: a frozen copy of the package and the job file in the run
directory, so that a requeue days later runs the same code whatever the checkout holds then.

A snapshot is reused only while its content is what was frozen: ``SNAPSHOT.json`` records the
sha256 of every file's path and bytes (``sha256``), and a submission that finds the snapshot
of its id hashes what the directory holds now. A file changed, added or removed (a planted
``podracer_hpc/__init__.py``) means it is not reused: it is moved aside (``.<id>.mismatch-*``,
kept as evidence) and written afresh, and the submission says so.

The snapshot is compiled when it is written (:func:`compile_snapshot`: ``__pycache__/*.pyc`` of
the submitting Python, published with the sources by the same rename), so ranks that run the
same Python read the bytecode instead of compiling every module at every start, and none writes
one (the batch script sets ``PYTHONDONTWRITEBYTECODE``): no ``__pycache__`` race of hundreds of
ranks on the shared filesystem. Bytecode caches are not part of the content: a reused snapshot's
``__pycache__`` directories are removed and compiled again from the verified sources.
"""

from __future__ import annotations

import compileall
import hashlib
import json
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from podracer_hpc.files.rundir import RunDir, git_revision

__all__ = ["Snapshot", "compile_snapshot", "make_snapshot", "plan_snapshot"]

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
    sha256: str = ""  # of every file's path and bytes (the package's and the job file): what a reuse checks

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


def _content_hash(package: list[tuple[str, bytes]], job_name: str, job_text: bytes) -> str:
    """sha256 of a snapshot's content: each package file's path (relative, posix) and bytes, then the job file."""
    h = hashlib.sha256()
    for rel, data in package:
        h.update(rel.encode() + b"\0" + data + b"\0")
    h.update(job_name.encode() + b"\0" + job_text)
    return h.hexdigest()


def plan_snapshot(base: Path, job_file: str) -> Snapshot:
    """The snapshot this submission will run (computed; nothing is written)."""
    files = _package_files(PACKAGE)
    job_text = Path(job_file).read_bytes()
    job_name = Path(job_file).name
    digest = _content_hash([(f.relative_to(PACKAGE).as_posix(), f.read_bytes()) for f in files], job_name, job_text)
    revision = git_revision({})
    sid = digest[:12]
    return Snapshot(
        RunDir(base).code_dir / sid,
        sid,
        revision,
        revision.endswith("-dirty"),
        PACKAGE,
        files,
        job_text,
        job_name,
        digest,
    )


def held_content(path: Path, job_name: str) -> str | None:
    """The content hash of what snapshot directory ``path`` holds now (None if it holds anything
    but its package, its job file and SNAPSHOT.json, bytecode caches aside)."""
    package = []
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path)
        if "__pycache__" in rel.parts or p.is_dir() and not p.is_symlink():
            continue
        if rel.as_posix() in ("SNAPSHOT.json", job_name):
            continue
        if rel.parts[0] != "podracer_hpc" or p.is_symlink() or not p.is_file():
            return None  # a file beside the package (a .pth, a sitecustomize.py), a link, a device
        package.append((Path(*rel.parts[1:]).as_posix(), p.read_bytes()))
    try:
        return _content_hash(package, job_name, (path / job_name).read_bytes())
    except OSError:
        return None


def _verified(snap: Snapshot) -> bool:
    """Whether the snapshot at ``snap.path`` still holds exactly what it froze (and this submission's code)."""
    try:
        meta = json.loads((snap.path / "SNAPSHOT.json").read_text())
        held = held_content(snap.path, snap.job_name)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and held is not None and held == meta.get("sha256") == snap.sha256


def make_snapshot(snap: Snapshot) -> Snapshot:
    """Write the snapshot atomically, or reuse the one of this id when its content still is this
    code (:func:`held_content`); one that is not is moved aside and written again."""
    if (snap.path / "SNAPSHOT.json").is_file():
        if _verified(snap):
            for cache in sorted(snap.path.rglob("__pycache__")):
                shutil.rmtree(cache, ignore_errors=True)
            compile_snapshot(snap.path)
            return snap
        aside = snap.path.parent / f".{snap.id}.mismatch-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
        try:
            os.rename(snap.path, aside)
        except FileNotFoundError:
            pass  # another submission moved it first
        print(
            f"podracer submit: the code snapshot {snap.path} no longer holds what was frozen (a file was changed, "
            f"added or removed): moved aside to {aside.name} and written again",
            file=sys.stderr,
        )
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
        "sha256": snap.sha256,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (tmp / "SNAPSHOT.json").write_text(json.dumps(meta, indent=2) + "\n")
    compile_snapshot(tmp, snap.path)
    try:
        os.rename(tmp, snap.path)
    except OSError:  # another submission wrote the same snapshot first
        shutil.rmtree(tmp, ignore_errors=True)
        if not (snap.path / "SNAPSHOT.json").is_file():
            raise
    return snap


def compile_snapshot(path: Path, final: Path | None = None) -> bool:
    """Compile the package under ``path`` (``__pycache__/*.pyc`` for this Python, the timestamp
    kind: the sources keep their mtimes); ``final``: where ``path`` will be renamed to, the file
    names the bytecode records (tracebacks). Returns whether every module compiled; a failure
    (a full disk) only costs the ranks a compile, so it is not an error."""
    pkg = path / "podracer_hpc"
    try:
        return bool(
            compileall.compile_dir(
                pkg, ddir=(final or path) / "podracer_hpc", quiet=2, workers=1, force=True, optimize=-1
            )
        )
    except OSError:
        return False
