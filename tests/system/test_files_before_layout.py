"""Files written before the package's modules moved into folders still load after the move: a
pod checkpoint resumes and trains on into a state of today's shape, and a leaderboard entry loads
(checksum verified) and evaluates when the reader accepts unkeyed entries. (Bit-equality with an
unbroken run of today's code held on the day of the move under load, not on an idle machine:
docs/decisions.md, "Open".)

The fixture (tests/fixtures/run-before-layout/) is a one-pod quickstart run stopped after 6
updates by the code of the flat layout; nothing in a checkpoint or an entry names a module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from helpers import REPO, run_cli

from podracer_hpc.files import safeio
from podracer_hpc.files.rundir import EXIT_REQUEUE
from podracer_hpc.pool.leaderboard import Leaderboard

FIXTURE = REPO / "tests" / "fixtures" / "run-before-layout"
ENTRY = "local-0-0-8c052bcd2126"
SETTINGS = [
    "--set",
    "total_env_steps=16384",
    "--set",
    "env.num_envs=64",
    "--set",
    "eval.interval_env_steps=4096",
    "--set",
    "tournament.interval_env_steps=4096",
    "--set",
    "eval.episodes=2",
]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    tensors, _meta, _extra = safeio.load(run / "checkpoints" / "rank0.safetensors", "pod-state")
    return tensors


def test_a_checkpoint_from_before_the_move_resumes_as_an_unbroken_run(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(FIXTURE, old)
    # its leaderboard's entry was written before entries were keyed: the job accepts it (its own)
    r = run_cli(
        "train",
        str(old / "config.yaml"),
        "--run-dir",
        str(old),
        "--set",
        "tournament.accept_unkeyed=true",
        "--stop-after-updates",
        "1",
        "--quiet",
    )
    assert r.returncode == EXIT_REQUEUE and "resuming from" in r.stderr, r.stderr
    # 7 updates: before the round at 8,192 env steps, where the old, unkeyed entry and a fresh run's
    # keyed one would be judged apart
    assert json.loads(r.stdout.splitlines()[-1])["env_steps"] == 7 * 64 * 16
    fresh = tmp_path / "fresh"
    r = run_cli(
        "train", "jobs/quickstart.yaml", "--run-dir", str(fresh), *SETTINGS, "--stop-after-updates", "7", "--quiet"
    )
    assert r.returncode == EXIT_REQUEUE, r.stderr
    a, b = _weights(old), _weights(fresh)
    assert a.keys() == b.keys()  # the same state, key for key, as a run of today's code writes
    assert all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)
    assert all(bool(torch.isfinite(a[k]).all()) for k in a if a[k].is_floating_point())


def test_a_leaderboard_entry_from_before_the_move_loads_and_evaluates(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    # written before entries were keyed (no hmac): read only when asked for (docs/security.md)
    tensors, meta = Leaderboard(run / "leaderboard", accept_unkeyed=True).load(ENTRY)
    assert tensors and meta["pod"] == 0 and meta["env_steps"] == 4096, meta
    path = str(run / "leaderboard" / "entries" / f"{ENTRY}.safetensors")
    r = run_cli("evaluate", path, "--episodes", "2")
    assert r.returncode == 2 and "--accept-unkeyed" in r.stderr, r.stderr
    r = run_cli("evaluate", path, "--episodes", "2", "--accept-unkeyed")
    assert r.returncode == 0, r.stderr
    assert ENTRY in r.stdout
