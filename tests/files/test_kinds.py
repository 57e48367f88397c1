"""files/kinds.py: what kind of file a path is, from its name, its place and a peek at its bytes;
damaged only when name and place say what it is and its bytes cannot be that."""

import json
import os
from pathlib import Path

import torch

from podracer_hpc.files import safeio
from podracer_hpc.files.kinds import SIDECAR_FORMAT, STATE_FORMAT, STATE_KINDS, identify, wrong_kind
from podracer_hpc.pod import STATE_KIND
from podracer_hpc.pool import leaderboard


def test_the_words_it_looks_for_are_the_writers_words():
    assert STATE_FORMAT == safeio.FORMAT and STATE_KINDS[STATE_KIND] == "checkpoint"
    assert STATE_KINDS[leaderboard.ENTRY_KIND] == "entry" and SIDECAR_FORMAT == leaderboard.SIDECAR_FORMAT


def make_run(root: Path) -> Path:
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "config.yaml").write_text("seed: 0\nenv:\n  name: pendulum\n")
    safeio.save(run / "checkpoints" / "rank0.safetensors", {"x": torch.zeros(3)}, {"rank": 0}, STATE_KIND)
    (run / "logs" / "q_rank0.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    (run / "summary.json").write_text(json.dumps({"pods": 1, "env_steps": 8, "best_return": -1.0}))
    return run


def test_each_kind_is_told_apart(tmp_path):
    run = make_run(tmp_path)
    (tmp_path / "policy.onnx").write_bytes(b"\x08\x07")
    (tmp_path / "other.json").write_text('{"a": 1}')
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "foreign.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    want = {
        run: "run",
        run / "config.yaml": "config",
        run / "checkpoints" / "rank0.safetensors": "checkpoint",
        run / "logs" / "q_rank0.h5": "log",
        run / "summary.json": "summary",
        run / "logs": "folder",
        tmp_path / "policy.onnx": "exported",
        tmp_path / "other.json": "unknown",
        tmp_path / "list.yaml": "unknown",
        tmp_path / "foreign.safetensors": "unknown",
        tmp_path / "nope": "missing",
        tmp_path: "directory",
    }
    for path, kind in want.items():
        found = identify(path)
        assert found.kind == kind and not found.damaged, (path, found)
    assert identify(run / "summary.json").run == run and identify(tmp_path / "other.json").run is None


def test_damaged_only_where_name_and_place_say_what_it_is(tmp_path):
    run = make_run(tmp_path)
    ck = run / "checkpoints" / "rank0.safetensors"
    cut = run / "checkpoints" / "rank1.safetensors"
    cut.write_bytes(ck.read_bytes()[:20])  # its header cut short
    garbage = run / "checkpoints" / "rank2.prev"
    garbage.write_bytes(b"zzzz" * 40)
    for p in (cut, garbage):
        found = identify(p)
        assert found.kind == "checkpoint" and found.damaged, found
    stray = tmp_path / "x.safetensors"
    stray.write_bytes(b"zzzz" * 40)
    assert identify(stray).kind == "unknown" and not identify(stray).damaged


def test_a_fifo_is_named_without_being_opened(tmp_path):
    fifo = tmp_path / "f.safetensors"
    os.mkfifo(fifo)
    found = identify(fifo)  # would block forever if it were opened for reading
    assert found.kind == "special" and "FIFO" in found.label


def test_the_message_names_the_kind_and_what_to_pass(tmp_path):
    run = make_run(tmp_path)
    msg = wrong_kind(identify(run / "config.yaml"), ("checkpoint", "entry", "run"))
    assert msg.startswith(f"{run / 'config.yaml'} is a run's config file")
    assert "pass a checkpoint" in msg and f"its run directory is {run}" in msg
    msg = wrong_kind(identify(run), ("checkpoint", "entry"))
    assert "is a run directory" in msg and str(run / "checkpoints" / "rank0.safetensors") in msg
    assert wrong_kind(identify(run), ("run",)) is None
    before = sorted(p.name for p in tmp_path.rglob("*"))
    identify(run / "summary.json")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
