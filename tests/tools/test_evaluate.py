"""`podracer evaluate PATH`: a checkpoint, a leaderboard entry, a run directory, and
files it must refuse (exit 2, a message, no traceback). Agents play the same start states, so a
run's verdict is reproduced exactly by the seed and episode count its summary names."""

import json
import subprocess
import sys

import pytest
from helpers import REPO, mpiexec_or_skip, run_cli

from podracer_hpc.files import safeio

SETS = [
    "total_env_steps=8192",
    "env.num_envs=64",
    "agent.rollout_steps=16",
    "eval.episodes=4",
    "eval.interval_env_steps=4096",
    "tournament.interval_env_steps=4096",
    "threads=1",
    "log.progress_interval_s=0",
    "eval.final_episodes=12",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-pod quickstart tournament under a real mpiexec: checkpoints, entries, a verdict."""
    d = tmp_path_factory.mktemp("evaluate") / "run"
    cmd = [
        mpiexec_or_skip(),
        "-n",
        "2",
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(d),
        "--quiet",
        *sum((["--set", s] for s in SETS), []),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return d


def results(r: subprocess.CompletedProcess) -> list[dict]:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])["results"]


@pytest.mark.mpi
def test_a_run_directory_reproduces_its_verdict_on_the_same_start_states(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = results(
        run_cli(
            "evaluate",
            str(run_dir),
            "--episodes",
            str(summary["final_episodes"]),
            "--seed",
            str(summary["final_eval_seed"]),
            "--top",
            "2",
        )
    )
    ranks = [x for x in rows if x["agent"].endswith("checkpoint")]
    entries = [x for x in rows if x["agent"].startswith("entry ")]
    assert [x["agent"] for x in ranks] == ["rank 0 checkpoint", "rank 1 checkpoint"] and len(entries) == 2
    best = max(ranks, key=lambda x: x["return_mean"])
    assert best["agent"] == f"rank {summary['best_pod']} checkpoint"
    assert best["return_mean"] == summary["best_return"] and best["ci95"] == summary["best_return_ci95"]  # bit for bit
    assert all(x["episodes"] == 12 and x["seed"] == summary["final_eval_seed"] for x in rows)
    assert all(x["ci95"][0] < x["return_mean"] < x["ci95"][1] for x in rows)
    assert "95% interval" in run_cli("evaluate", str(run_dir), "--episodes", "3").stdout  # the table


@pytest.mark.mpi
def test_a_checkpoint_and_an_entry_on_chosen_start_states(run_dir):
    ck = run_dir / "checkpoints" / "rank0.safetensors"
    a = results(run_cli("evaluate", str(ck), "--episodes", "5", "--seed", "3"))
    assert len(a) == 1 and a[0]["episodes"] == 5 and a[0]["seed"] == 3 and a[0]["task"] == "pendulum"
    assert results(run_cli("evaluate", str(ck), "--episodes", "5", "--seed", "3")) == a  # deterministic
    assert (
        results(run_cli("evaluate", str(ck), "--episodes", "5", "--seed", "4"))[0]["return_mean"] != a[0]["return_mean"]
    )
    entry = sorted((run_dir / "leaderboard" / "entries").glob("*.safetensors"))[0]
    for path in (entry, entry.with_suffix(".json")):  # the tensors or the sidecar
        (e,) = results(run_cli("evaluate", str(path), "--episodes", "5", "--seed", "3"))
        assert e["agent"] == f"entry {entry.stem}" and e["episodes"] == 5


@pytest.mark.parametrize("what", ["foreign", "damaged", "empty dir", "missing", "trading", "bad episodes"])
def test_what_cannot_be_evaluated_exits_2_with_a_message(tmp_path, run_dir, what):
    ck = run_dir / "checkpoints" / "rank0.safetensors"
    args, needle = [], ""
    if what == "foreign":
        (tmp_path / "x.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
        args, needle = [str(tmp_path / "x.safetensors")], "not one written by podracer-hpc"
    elif what == "damaged":
        blob = bytearray(ck.read_bytes())
        blob[-5] ^= 0xFF
        (tmp_path / "d.safetensors").write_bytes(bytes(blob))
        args, needle = [str(tmp_path / "d.safetensors")], "checksum mismatch"
    elif what == "empty dir":
        args, needle = [str(tmp_path)], "holds no checkpoints"
    elif what == "missing":
        args, needle = [str(tmp_path / "nope")], "no such file or directory"
    elif what == "trading":
        tensors, meta, _ = safeio.load(ck, "pod-state")
        meta["config"]["env"]["name"] = "stock_trading"
        safeio.save(tmp_path / "t.safetensors", tensors, meta, "pod-state")
        args, needle = [str(tmp_path / "t.safetensors")], "podracer backtest"
    else:
        args, needle = [str(ck), "--episodes", "0"], "--episodes must be in"
    r = run_cli("evaluate", *args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def _tree(root):
    return {
        str(p.relative_to(root)): (p.lstat().st_ino, p.lstat().st_mode, p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.mpi
def test_a_run_directory_with_bad_agents_is_evaluated_past_them_and_never_written(tmp_path, run_dir):
    """A damaged checkpoint and an edited entry are reported and skipped, the rest evaluated; nothing
    in the run directory or its leaderboard is renamed or created (read-only, or another user's, alike)."""
    import os
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    ck = copy / "checkpoints" / "rank1.safetensors"
    blob = bytearray(ck.read_bytes())
    blob[-5] ^= 0xFF
    ck.write_bytes(bytes(blob))
    sidecar = sorted((copy / "leaderboard" / "entries").glob("*.json"))[0]
    d = json.loads(sidecar.read_text())
    d["score"] = 1e9  # edited: its own digest no longer matches
    sidecar.write_text(json.dumps(d))
    os.chmod(copy / "leaderboard", 0o777)  # a writer would warn to chmod it; a reader does not
    before = _tree(copy)
    r = run_cli("evaluate", str(copy), "--episodes", "2", "--top", "4")
    assert r.returncode == 0 and "Traceback" not in r.stderr and "chmod" not in r.stderr, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    agents = [x["agent"] for x in out["results"]]
    assert "rank 0 checkpoint" in agents and "rank 1 checkpoint" not in agents
    assert f"entry {sidecar.stem}" not in agents and any(a.startswith("entry ") for a in agents)
    assert len(out["skipped"]) == 2 and "skipped: " in r.stderr
    assert any("rank1.safetensors" in s and "checksum mismatch" in s for s in out["skipped"])
    assert any(sidecar.stem in s and "left in place" in s for s in out["skipped"])
    assert _tree(copy) == before  # no quarantine rename, nothing created
    # a run directory without a leaderboard: none is made by reading it
    shutil.rmtree(copy / "leaderboard")
    r = run_cli("evaluate", str(copy), "--episodes", "2")
    assert r.returncode == 0, r.stderr
    assert not (copy / "leaderboard").exists()


@pytest.mark.mpi
def test_a_stored_ten_million_step_episode_is_cut_by_max_steps_with_a_note(tmp_path, run_dir):
    """A checkpoint whose config says env.max_episode_steps 10,000,000 (pendulum never ends an
    episode itself): `evaluate --episodes 2` ends within seconds at the default cap, and says so."""
    import time

    tensors, meta, _ = safeio.load(run_dir / "checkpoints" / "rank0.safetensors", "pod-state")
    meta["config"]["env"]["max_episode_steps"] = 10_000_000
    long = tmp_path / "long.safetensors"
    safeio.save(long, tensors, meta, "pod-state")
    t = time.monotonic()
    r = run_cli("evaluate", str(long), "--episodes", "2", timeout=120)
    assert time.monotonic() - t < 90
    (row,) = results(r)
    assert row["episodes"] == 2 and "cut after 10,000 steps (--max-steps)" in r.stderr, r.stderr
    short = run_cli("evaluate", str(long), "--episodes", "2", "--max-steps", "200")
    assert "cut after 200 steps" in short.stderr
    plain = run_cli("evaluate", str(run_dir / "checkpoints" / "rank0.safetensors"), "--episodes", "2")
    assert results(short)[0]["return_mean"] == results(plain)[0]["return_mean"]  # pendulum's own 200 steps
    assert "--max-steps" not in plain.stderr
    bad = run_cli("evaluate", str(long), "--max-steps", "0")
    assert bad.returncode == 2 and "--max-steps must be in" in bad.stderr


@pytest.mark.mpi
def test_a_bad_file_in_a_run_directory_is_skipped_with_a_warning(tmp_path, run_dir):
    """A run directory copied with one checkpoint damaged and a FIFO planted as an entry: the other
    agents are still evaluated; the bad ones are named on stderr, nothing hangs."""
    import os
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    ck = copy / "checkpoints" / "rank1.safetensors"
    ck.write_bytes(ck.read_bytes()[:-10])
    os.mkfifo(copy / "leaderboard" / "entries" / "planted-0-0-000000000000.json")
    r = run_cli("evaluate", str(copy), "--episodes", "2", "--top", "1", timeout=120)
    rows = results(r)
    assert [x["agent"] for x in rows][0] == "rank 0 checkpoint" and len(rows) == 2, r.stderr
    assert "skipped" in r.stderr and "rank1.safetensors" in r.stderr
    assert "FIFO" in r.stderr and "Traceback" not in r.stderr
