"""Safe tensor files: atomic writes, checksums, and loading that never unpickles.

Every state file of podracer-hpc (pod checkpoints, leaderboard entries) is a safetensors
file whose header metadata carries:

- ``format``: always ``"podracer-hpc"`` (a foreign safetensors file is refused),
- ``kind``: what the file holds (``"pod-state"``, ...), checked against what the caller expects,
- ``version``: the layout version of that kind,
- ``meta``: a JSON document (counters, config, hyperparameters, ...),
- ``sha256``: the digest of ``meta`` followed by the raw tensor bytes, so that a flipped bit
  anywhere in the payload is caught before anything is used.

Writers write to a temporary name in the same directory, fsync, then rename: a reader sees the
old file or the new one, never half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podracer_hpc.files.atomic import atomic_write_bytes  # re-exported: the state files' writer

if TYPE_CHECKING:  # torch and safetensors load where tensors are read or written: a status reader needs neither
    import torch

FORMAT = "podracer-hpc"


class StateFileError(ValueError):
    """A state file is missing, truncated, corrupt, foreign or of the wrong kind."""


def _digest(meta_json: str, payload: bytes) -> str:
    h = hashlib.sha256()
    h.update(meta_json.encode())
    h.update(payload)
    return h.hexdigest()


def _split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    """Split a safetensors blob into its JSON header and its tensor payload."""
    if len(blob) < 8:
        raise ValueError(f"file is {len(blob)} bytes, shorter than a safetensors header")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"header claims {n} bytes but only {len(blob) - 8} follow (truncated?)")
    header = json.loads(blob[8 : 8 + n])
    return header, blob[8 + n :]


def dumps(tensors: dict[str, torch.Tensor], meta: dict[str, Any], kind: str, version: int = 1) -> bytes:
    """Serialize tensors and JSON metadata into a checksummed safetensors blob."""
    from safetensors.torch import save as st_save

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    meta_json = json.dumps(meta, sort_keys=True)
    base = {"format": FORMAT, "kind": kind, "version": str(version), "meta": meta_json}
    _, payload = _split(st_save(tensors, metadata=base))
    blob = st_save(tensors, metadata={**base, "sha256": _digest(meta_json, payload)})
    return blob


def loads(
    blob: bytes, kind: str, source: str = "<bytes>", device: str | torch.device = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, Any], int]:
    """Parse and verify a blob written by :func:`dumps`; returns (tensors, meta, version)."""
    try:
        header, payload = _split(blob)
    except (ValueError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StateFileError(
            f"{source}: not a readable podracer-hpc state file ({e}). It is truncated or corrupt: "
            "delete it or restore it from a backup; the previous checkpoint (if any) is kept as *.prev."
        ) from None
    md = header.get("__metadata__") or {}
    if md.get("format") != FORMAT:
        raise StateFileError(
            f"{source}: a safetensors file, but not one written by podracer-hpc (format={md.get('format')!r}). "
            "Refusing to load a foreign file."
        )
    if md.get("kind") != kind:
        raise StateFileError(f"{source}: holds a {md.get('kind')!r}, expected a {kind!r}.")
    meta_json = md.get("meta", "")
    if _digest(meta_json, payload) != md.get("sha256"):
        raise StateFileError(
            f"{source}: checksum mismatch: the file is corrupt (a partial copy or a flipped bit). "
            "Nothing was loaded; delete it or restore it."
        )
    from safetensors.torch import load as st_load

    try:
        tensors = st_load(blob)
        meta = json.loads(meta_json)
    except Exception as e:  # safetensors raises its own error types
        raise StateFileError(f"{source}: corrupt tensor data ({e}).") from None
    if str(device) != "cpu":
        tensors = {k: v.to(device) for k, v in tensors.items()}
    return tensors, meta, int(md.get("version", "0"))


def save(
    path: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    kind: str,
    version: int = 1,
    mode: int = 0o640,
) -> str:
    """Atomically write a state file; returns the sha256 of the whole file."""
    blob = dumps(tensors, meta, kind, version)
    atomic_write_bytes(path, blob, mode=mode)
    return hashlib.sha256(blob).hexdigest()


def load(
    path: str | os.PathLike, kind: str, device: str | torch.device = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, Any], int]:
    """Read and verify a state file written by :func:`save`."""
    path = Path(path)
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise StateFileError(f"{path}: no such state file.") from None
    except IsADirectoryError:
        raise StateFileError(f"{path}: is a directory, not a state file; move it away.") from None
    except OSError as e:
        raise StateFileError(f"{path}: cannot be read ({e.strerror}).") from None
    return loads(blob, kind, source=str(path), device=device)
