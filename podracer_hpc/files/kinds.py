"""What kind of podracer-hpc file a path is: the one place that answers it, for the tools that
take a path (``podracer evaluate``, ``export``, ``backtest``, ``status``) and must say "this is a
config file; pass a checkpoint, an entry or a run directory" instead of reading it as something
it is not (and advising to delete a good file).

:func:`identify` looks cheaply: the file's name, its place in a run directory (``rundir.py``) and
a peek at its first bytes through the bounded readers (``bounded.py``): the HDF5 signature (no
h5py here), a zip archive's names, a safetensors header's ``format`` and ``kind``, a JSON
document's fields, a YAML document. It never creates, renames or writes anything. A file is
called damaged (:attr:`FileKind.damaged`) only when its name and place say what it is and its
bytes cannot be that: only then may a reader's message advise to restore or delete it.
:func:`wrong_kind` turns a kind a tool does not take into its message.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from podracer_hpc.files.bounded import RunFileError, loads_json, open_regular, read_json, read_slice, read_yaml
from podracer_hpc.files.rundir import RunDir

__all__ = ["ACCEPT", "FileKind", "identify", "wrong_kind"]

# What the writers put in their files (pod.STATE_KIND, leaderboard.ENTRY_KIND and SIDECAR_FORMAT,
# safeio.FORMAT; tests/files/test_kinds.py checks they still agree): files/ imports nothing above it.
STATE_FORMAT = "podracer-hpc"
STATE_KINDS = {"pod-state": "checkpoint", "leaderboard-entry": "entry"}
SIDECAR_FORMAT = "podracer-hpc-leaderboard"
EXPORTED_META = "podracer.json"  # the extra file of an exported TorchScript policy
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
PEEK_BYTES = 1 << 20  # a state file's header (config and counters) is kilobytes
RECORD_FOLDERS = {"pods": "a pod's record", "rounds": "a round's listing", "heartbeats": "a pod's heartbeat"}
RUN_FOLDERS = ("checkpoints", "logs", "pods", "rounds", "heartbeats", "parts", "leaderboard", "slurm", "code")

# What each kind is called in a message, and what a tool asks for (ACCEPT's words)
LABELS = {
    "config": "a config file",
    "log": "an HDF5 log",
    "summary": "a run summary",
    "checkpoint": "a pod checkpoint",
    "entry": "a leaderboard entry",
    "exported": "an exported policy",
    "run": "a run directory",
    "leaderboard": "a leaderboard directory",
    "folder": "a folder of a run directory",
    "record": "a run record",
    "directory": "a directory that holds no run",
    "special": "not a regular file",
    "unknown": "a file podracer-hpc did not write",
    "missing": "nothing (no such file or directory)",
}
ACCEPT = {
    "checkpoint": "a checkpoint (<run>/checkpoints/rank<r>.safetensors)",
    "entry": "a leaderboard entry (<leaderboard>/entries/<id>.safetensors)",
    "exported": "an exported policy (podracer export policy)",
    "run": "a run directory (podracer train --run-dir)",
}


@dataclass(frozen=True)
class FileKind:
    """What a path is: ``kind`` (a key of LABELS), ``label`` (its words in a message), ``run`` (the
    run directory it belongs to, if it sits in one) and ``damaged`` (why its bytes cannot be what
    its name and place say; "" when they can)."""

    path: Path
    kind: str
    label: str
    run: Path | None = None
    damaged: str = ""


def identify(path: str | os.PathLike) -> FileKind:
    """The kind of ``path`` (see the module doc); reads at most a header's worth, writes nothing."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return FileKind(path, "missing", LABELS["missing"])
    except OSError as e:
        return FileKind(path, "special", f"unreadable ({e.strerror})")
    if stat.S_ISDIR(st.st_mode):
        return _directory(path)
    run = _run_of(path)
    if not stat.S_ISREG(st.st_mode):
        return FileKind(path, "special", f"{LABELS['special']} ({_special(st.st_mode)})", run)
    try:
        fd = open_regular(path)
    except (OSError, RunFileError) as e:
        return FileKind(path, "special", f"unreadable ({e})", run)
    try:
        head = read_slice(fd, 0, 16)
        if head.startswith(HDF5_SIGNATURE):
            return _log(path, run)
        if head.startswith(b"PK\x03\x04"):
            return _archive(path, run)
        if len(head) >= 9 and head[8:9] == b"{":
            (n,) = struct.unpack("<Q", head[:8])
            return _state(path, run, read_slice(fd, 8, min(n, PEEK_BYTES)) if n <= PEEK_BYTES else b"")
    finally:
        os.close(fd)
    return _by_name(path, run, head)


def _special(mode: int) -> str:
    for test, what in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return what
    return "a socket" if stat.S_ISSOCK(mode) else "not a file"


def wrong_kind(found: FileKind, accepts: tuple[str, ...]) -> str | None:
    """The message for a path a tool does not take (None when it takes it): what the path is and
    what to pass, with the run directory or checkpoint to pass where the path sits in a run."""
    if found.kind in accepts:
        return None
    want = [ACCEPT[k] for k in accepts]
    said = want[0] if len(want) == 1 else ", ".join(want[:-1]) + " or " + want[-1]
    hint = ""
    if found.run is not None:
        ckpts = [RunDir(found.run).checkpoint_path(r) for r in RunDir(found.run).checkpoint_pods()]
        if "run" in accepts and found.run != found.path:
            hint = f"; its run directory is {found.run}"
        elif "checkpoint" in accepts and ckpts:
            hint = (
                f"; this run's checkpoints: {', '.join(str(c) for c in ckpts[:2])}{', ...' if len(ckpts) > 2 else ''}"
            )
    if found.kind == "missing":
        return f"{found.path}: no such file or directory; pass {said}"
    return f"{found.path} is {found.label}; pass {said}{hint}"


# --------------------------------------------------------------------------------------
def _looks_like_run(d: Path) -> bool:
    r = RunDir(d)
    return r.looks_like_run() or r.summary.is_file() or bool(r.checkpoint_pods())


def _run_of(path: Path) -> Path | None:
    """The run directory ``path`` sits in (its parent, or its parent's parent, or the one above
    a leaderboard's entries), if that looks like a run."""
    for up in list(path.parents)[:3]:
        if _looks_like_run(up):
            return up
    return None


def _directory(path: Path) -> FileKind:
    if _looks_like_run(path):
        return FileKind(path, "run", LABELS["run"], path)
    run = _run_of(path)
    if (path / "entries").is_dir():
        return FileKind(path, "leaderboard", LABELS["leaderboard"], run)
    if path.name == "entries" and path.parent.name == "leaderboard" or run is not None and path.name in RUN_FOLDERS:
        return FileKind(path, "folder", f"the {path.name}/ folder of a run directory", run)
    return FileKind(path, "directory", LABELS["directory"], run)


def _log(path: Path, run: Path | None) -> FileKind:
    named = path.parent.name == "logs" and "_rank" in path.name
    return FileKind(path, "log", LABELS["log"] if named else "an HDF5 file", run)


def _archive(path: Path, run: Path | None) -> FileKind:
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()[:10_000]
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        return FileKind(path, "unknown", f"a damaged zip archive ({e})", run)
    if any(n.endswith("/extra/" + EXPORTED_META) for n in names):
        return FileKind(path, "exported", f"{LABELS['exported']} (TorchScript)", run)
    return FileKind(path, "unknown", "a zip archive podracer-hpc did not write", run)


def _placed(path: Path) -> str:
    """The kind a state file's name and place give it ("" if they give none)."""
    if path.name.startswith("rank") and path.suffix in (".safetensors", ".prev"):
        return "checkpoint"  # in a run's checkpoints/ or a copy of one elsewhere
    if path.parent.name == "entries" and path.suffix == ".safetensors":
        return "entry"
    return ""


def _state(path: Path, run: Path | None, header: bytes) -> FileKind:
    """A file that starts like safetensors: its header's format and kind say what it holds."""
    placed = _placed(path)
    try:
        md = loads_json(header, str(path)).get("__metadata__") or {}
    except (RunFileError, ValueError, AttributeError, UnicodeDecodeError):
        if placed:
            return FileKind(path, placed, LABELS[placed], run, "its header does not parse (truncated or corrupt)")
        return _by_name(path, run, header)
    if md.get("format") != STATE_FORMAT:
        return FileKind(path, "unknown", "a safetensors file, but not one written by podracer-hpc", run)
    kind = STATE_KINDS.get(str(md.get("kind")))
    if kind is None:
        return FileKind(path, "unknown", f"a podracer-hpc state file of an unknown kind ({md.get('kind')!r})", run)
    return FileKind(path, kind, LABELS[kind], run)


def _by_name(path: Path, run: Path | None, head: bytes) -> FileKind:
    """A file whose first bytes are not binary podracer-hpc: JSON, YAML, or what its name says."""
    placed = _placed(path)
    if placed:
        return FileKind(path, placed, LABELS[placed], run, "it does not start like a state file (truncated or corrupt)")
    if path.suffix in (".yaml", ".yml"):
        try:
            doc = read_yaml(path, what="config file")
        except (OSError, ValueError) as e:
            return FileKind(path, "config", f"{LABELS['config']} that does not parse ({e})", run)
        where = "a run's config file (config.yaml)" if run is not None and path == RunDir(run).config else ""
        if isinstance(doc, dict):
            return FileKind(path, "config", where or LABELS["config"], run)
        return FileKind(path, "unknown", "a YAML file that is not a config", run)
    if path.suffix == ".onnx":
        return FileKind(path, "exported", f"{LABELS['exported']} (ONNX)", run)
    if path.suffix == ".json" or head.lstrip()[:1] in (b"{", b"["):
        return _json(path, run)
    return FileKind(path, "unknown", LABELS["unknown"], run)


def _json(path: Path, run: Path | None) -> FileKind:
    try:
        doc = read_json(path)
    except (OSError, ValueError, json.JSONDecodeError):
        doc = None
    if path.parent.name == "entries" and (doc is None or isinstance(doc, dict)):
        if doc is None or doc.get("format") == SIDECAR_FORMAT:
            damaged = "its sidecar (.json) does not parse" if doc is None else ""
            return FileKind(path, "entry", f"{LABELS['entry']} (its .json sidecar)", run, damaged)
    if run is not None and path == RunDir(run).summary:
        return FileKind(path, "summary", f"{LABELS['summary']} (summary.json)", run)
    if isinstance(doc, dict) and {"env_steps", "best_return", "pods"} <= doc.keys():
        return FileKind(path, "summary", f"{LABELS['summary']} (a summary.json)", run)
    if run is not None and path.parent.name in RECORD_FOLDERS:
        return FileKind(path, "record", f"{RECORD_FOLDERS[path.parent.name]} ({path.parent.name}/{path.name})", run)
    if run is not None and path.parent.name == "parts" or path.name == "pool.json":
        return FileKind(path, "record", f"{LABELS['record']} ({path.parent.name}/{path.name})", run)
    if doc is None:
        return FileKind(path, "unknown", "a file that is not JSON podracer-hpc wrote", run)
    return FileKind(path, "unknown", "a JSON file podracer-hpc did not write", run)
