"""files/bounded.py: run files are read only when regular and within a bound; JSON nested too deep
and YAML alias bombs are refused as corrupt, quickly and without allocating what they claim."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podracer_hpc.files.bounded import (
    MAX_YAML_NODES,
    RunFileError,
    loads_json,
    loads_yaml,
    read_bounded,
    read_json,
    read_yaml,
)

# 9 levels of 10 aliases over a list of 10: 10**10 nodes once copied out, 370 bytes written
BOMB = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join(["*" + chr(97 + i)] * 10) + "]\n" for i in range(9)
)


def test_a_regular_file_within_its_bound_is_read(tmp_path: Path):
    p = tmp_path / "x.json"
    p.write_text('{"a": [1, 2]}')
    assert read_json(p) == {"a": [1, 2]}
    assert read_bounded(p, 13) == b'{"a": [1, 2]}'


def test_a_file_over_its_bound_is_refused_before_reading(tmp_path: Path):
    p = tmp_path / "big.json"
    with open(p, "wb") as f:  # sparse: 20 GB claimed, nothing on disk
        f.truncate(20 << 30)
    t = time.monotonic()
    with pytest.raises(RunFileError, match="more than a JSON file can be"):
        read_json(p)
    assert time.monotonic() - t < 2


def test_a_fifo_is_refused_at_once(tmp_path: Path):
    p = tmp_path / "fifo.json"
    os.mkfifo(p)
    t = time.monotonic()
    with pytest.raises(RunFileError, match="a FIFO"):
        read_json(p)
    assert time.monotonic() - t < 2


def test_a_link_to_dev_zero_is_refused(tmp_path: Path):
    p = tmp_path / "zero.json"
    p.symlink_to("/dev/zero")
    with pytest.raises(RunFileError, match="character device"):
        read_bounded(p, 1 << 30)


def test_a_directory_and_a_missing_file_keep_their_os_errors(tmp_path: Path):
    with pytest.raises(IsADirectoryError):
        read_json(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "none.json")


def test_json_nested_200k_deep_is_corrupt_not_a_recursion_error(tmp_path: Path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(RunFileError, match="nested too deep"):
        read_json(p)
    with pytest.raises(RunFileError, match="not valid JSON"):
        loads_json(b"{nope")


def test_a_yaml_alias_bomb_is_refused_within_seconds():
    assert len(BOMB) < 400
    t = time.monotonic()
    with pytest.raises(RunFileError, match="alias bomb"):
        loads_yaml(BOMB)
    assert time.monotonic() - t < 5


def test_a_self_referencing_yaml_alias_is_refused():
    with pytest.raises(RunFileError, match="alias"):
        loads_yaml("a: &a [1, *a]\n")


def test_ordinary_anchors_and_merges_still_load():
    text = "base: &base {lr: 0.001, gamma: 0.99}\nppo:\n  <<: *base\n  lr: 0.003\nsac: *base\n"
    assert loads_yaml(text) == {
        "base": {"lr": 0.001, "gamma": 0.99},
        "ppo": {"lr": 0.003, "gamma": 0.99},
        "sac": {"lr": 0.001, "gamma": 0.99},
    }
    wide = "a: &a [" + ",".join(["1"] * 100) + "]\nb: [" + ",".join(["*a"] * 50) + "]\n"
    assert len(loads_yaml(wide)["b"]) == 50  # 5,000 nodes: under MAX_YAML_NODES
    assert MAX_YAML_NODES >= 5_100


def test_yaml_files_are_bounded_and_text(tmp_path: Path):
    p = tmp_path / "job.yaml"
    p.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(RunFileError, match="not a text file"):
        read_yaml(p)
    p.write_text("x: " + "y" * 100)
    with pytest.raises(RunFileError, match="more than"):
        read_yaml(p, limit=50)


def test_a_bomb_does_not_allocate_what_it_would_expand_to(tmp_path: Path):
    """In a process whose address space is capped at 1 GiB, the bomb is refused, not a MemoryError."""
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({1 << 30}, {1 << 30}))\n"
        "from podracer_hpc.files.bounded import RunFileError, loads_yaml\n"
        "try:\n    loads_yaml(sys.stdin.read())\nexcept RunFileError:\n    print('refused')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], input=BOMB, capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert r.stdout.strip() == "refused", r.stderr[-2000:]
