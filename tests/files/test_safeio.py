"""files/safeio.py's reader: a state file is read only if it is a regular file of exactly the size
its header declares, and only if that fits in memory; checksums and kinds are still checked."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest
import torch

from podracer_hpc.files import safeio
from podracer_hpc.files.safeio import StateFileError


def _state(tmp_path: Path) -> Path:
    p = tmp_path / "rank0.safetensors"
    safeio.save(p, {"w": torch.arange(6.0).reshape(2, 3)}, {"env_steps": 7}, kind="pod-state")
    return p


def test_a_good_file_loads(tmp_path: Path):
    tensors, meta, version = safeio.load(_state(tmp_path), "pod-state")
    assert torch.equal(tensors["w"], torch.arange(6.0).reshape(2, 3))
    assert meta == {"env_steps": 7} and version == 1


def test_padding_after_the_declared_end_is_refused(tmp_path: Path):
    p = _state(tmp_path)
    with open(p, "ab") as f:
        f.write(b"\0" * 100)
    with pytest.raises(StateFileError, match="header declares"):
        safeio.load(p, "pod-state")


def test_a_truncated_file_is_refused(tmp_path: Path):
    p = _state(tmp_path)
    p.write_bytes(p.read_bytes()[:-5])
    with pytest.raises(StateFileError, match="truncated"):
        safeio.load(p, "pod-state")


def test_a_sparse_20_gb_file_is_refused_at_once(tmp_path: Path):
    p = tmp_path / "rank0.safetensors"
    with open(p, "wb") as f:
        f.truncate(20 << 30)
    t = time.monotonic()
    with pytest.raises(StateFileError, match="not a state file|not a readable"):
        safeio.load(p, "pod-state")
    assert time.monotonic() - t < 2


def test_a_consistent_header_larger_than_memory_is_refused_before_reading(tmp_path: Path):
    """A header that declares more tensor bytes than the host has free, on a sparse file of exactly
    that size: refused by size, never read (reading it would allocate that much)."""
    free = safeio.available_memory()
    if free is None:
        pytest.skip("no /proc/meminfo")
    n = 2 * free
    header = json.dumps({"x": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
    p = tmp_path / "huge.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + n)
    t = time.monotonic()
    with pytest.raises(StateFileError, match="more than the .* bytes of memory available"):
        safeio.load(p, "pod-state")
    assert time.monotonic() - t < 2


def test_a_fifo_and_a_link_to_dev_zero_are_refused(tmp_path: Path):
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    t = time.monotonic()
    with pytest.raises(StateFileError, match="FIFO"):
        safeio.load(fifo, "pod-state")
    zero = tmp_path / "zero.safetensors"
    zero.symlink_to("/dev/zero")
    with pytest.raises(StateFileError, match="character device"):
        safeio.load(zero, "pod-state")
    assert time.monotonic() - t < 2


def test_a_header_nested_too_deep_is_corrupt(tmp_path: Path):
    header = b"[" * 100_000 + b"]" * 100_000
    p = tmp_path / "deep.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(StateFileError, match="corrupt"):
        safeio.load(p, "pod-state")
    with pytest.raises(StateFileError, match="corrupt"):
        safeio.loads(p.read_bytes(), "pod-state")


def test_missing_and_directory_paths_say_so(tmp_path: Path):
    with pytest.raises(StateFileError, match="no such state file"):
        safeio.load(tmp_path / "none.safetensors", "pod-state")
    with pytest.raises(StateFileError, match="is a directory"):
        safeio.load(tmp_path, "pod-state")
