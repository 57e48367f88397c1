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
old file or the new one, never half a file. Readers (:func:`load`) open only regular files and
read no more than the file's own header declares (:func:`declared_size`): a FIFO, a device, a
sparse 20 GB file or one larger than the memory available are refused before any allocation.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podracer_hpc.files.atomic import atomic_write_bytes  # re-exported: the state files' writer
from podracer_hpc.files.bounded import RunFileError, loads_json, open_regular, read_slice

if TYPE_CHECKING:  # torch and safetensors load where tensors are read or written: a status reader needs neither
    import torch

FORMAT = "podracer-hpc"


class StateFileError(ValueError):
    """A state file is missing, truncated, corrupt, foreign or of the wrong kind."""


MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header


def available_memory() -> int | None:
    """The host's MemAvailable in bytes (None where /proc/meminfo does not say)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def declared_size(head: bytes, source: str) -> int:
    """The whole size of a safetensors file as its header declares it (8 + header + the end of the
    last tensor), from the file's first bytes (``head``: at least the 8-byte length and the
    header it announces). Raises :class:`StateFileError` if the header is unreadable."""
    if len(head) < 8:
        raise StateFileError(f"{source}: {len(head)} bytes, shorter than a safetensors header (truncated or corrupt)")
    (n,) = struct.unpack("<Q", head[:8])
    if n > MAX_HEADER_BYTES or n > len(head) - 8:
        raise StateFileError(
            f"{source}: its header claims {n:,} bytes, but {len(head) - 8:,} follow "
            "(truncated or corrupt, or not a state file)"
        )
    try:
        header = loads_json(head[8 : 8 + n], source)
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (RunFileError, TypeError, KeyError, IndexError, ValueError, AttributeError) as e:
        raise StateFileError(f"{source}: not a readable podracer-hpc state file ({e}); it is corrupt") from None
    return 8 + n + end


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
    header = loads_json(blob[8 : 8 + n], "header")
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
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
    except (ValueError, UnicodeDecodeError) as e:
        raise StateFileError(
            f"{source}: not a readable podracer-hpc state file ({e}). It is truncated or corrupt: "
            "delete it or restore it from a backup; the previous checkpoint (if any) is kept as *.prev."
        ) from None
    md = header.get("__metadata__") or {}
    if not isinstance(md, dict):
        md = {}
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
        meta = loads_json(meta_json, source)
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
    """Read and verify a state file written by :func:`save` (:func:`read_state_bytes` first)."""
    return loads(read_state_bytes(path), kind, source=str(path), device=device)


def read_state_bytes(path: str | os.PathLike, expected_size: int | None = None) -> bytes:
    """The bytes of a state file, read only if it is a regular file of the size its header
    declares (or ``expected_size``, a leaderboard sidecar's word) and that size fits in memory:
    a FIFO, a device, a sparse or padded file is refused before anything is allocated."""
    path = Path(path)
    try:
        fd = open_regular(path, "state file")
    except FileNotFoundError:
        raise StateFileError(f"{path}: no such state file.") from None
    except IsADirectoryError:
        raise StateFileError(f"{path}: is a directory, not a state file; move it away.") from None
    except RunFileError as e:
        raise StateFileError(str(e)) from None
    except OSError as e:
        raise StateFileError(f"{path}: cannot be read ({e.strerror}).") from None
    try:
        size = os.fstat(fd).st_size
        head = read_slice(fd, 0, 8)
        if len(head) == 8:
            n = struct.unpack("<Q", head)[0]
            head += read_slice(fd, 8, min(n, MAX_HEADER_BYTES, size))
        want = declared_size(head, str(path))
        if want != size or (expected_size is not None and expected_size != size):
            raise StateFileError(
                f"{path}: {size:,} bytes, but its header declares {want:,}"
                + (f" and its sidecar {expected_size:,}" if expected_size is not None else "")
                + ": truncated, padded or not a state file. Nothing was loaded; delete it or restore it "
                "(the previous checkpoint, if any, is kept as *.prev)."
            )
        free = available_memory()
        if free is not None and size > free:
            raise StateFileError(
                f"{path}: {size:,} bytes, more than the {free:,} bytes of memory available; "
                "load it on a machine with more memory"
            )
        blob = read_slice(fd, 0, size)
    except OSError as e:
        raise StateFileError(f"{path}: cannot be read ({e.strerror}).") from None
    finally:
        os.close(fd)
    if len(blob) != size:
        raise StateFileError(f"{path}: shrank while it was read (being replaced?); try again")
    return blob
