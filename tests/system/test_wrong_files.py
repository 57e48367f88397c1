"""A file of the wrong kind given to a tool that reads a path (``podracer evaluate``, ``export
policy``, ``export tensorboard``, ``backtest``, ``status``): exit 2, a message that names what the
file is and what to pass, never advice to delete or restore it, and nothing created or changed
anywhere (a read never makes directories). The files are a real tiny run's (one pod, 4,096 env
steps, ``podracer train``), so every kind is the real thing."""

import os
import shutil
from pathlib import Path

import pytest
from helpers import REPO, run_cli

from podracer_hpc.cli import main as podracer

SETS = [
    "total_env_steps=4096",
    "env.num_envs=64",
    "agent.rollout_steps=16",
    "eval.episodes=2",
    "eval.interval_env_steps=2048",
    "tournament.interval_env_steps=2048",
    "threads=1",
    "eval.final_episodes=2",
]

# what each tool takes (its ACCEPT words), and its command line for a path
TOOLS = {
    "evaluate": (("checkpoint", "entry", "run"), lambda p, out: ["evaluate", p, "--episodes", "1"]),
    "export policy": (("checkpoint", "entry"), lambda p, out: ["export", "policy", p, "--out", str(out / "p.pt")]),
    "export tensorboard": (("run",), lambda p, out: ["export", "tensorboard", p, "--out", str(out / "tb")]),
    "backtest": (("checkpoint", "entry", "exported"), lambda p, out: ["backtest", p]),
    "status": (("run",), lambda p, out: ["status", p]),
}
# what each kind is called in the messages
NAMES = {
    "config": "config file",
    "job": "a config file",
    "log": "an HDF5 log",
    "summary": "a run summary",
    "checkpoint": "a pod checkpoint",
    "entry": "a leaderboard entry",
    "run": "a run directory",
    "record": "a pod's record",
    "folder": "the logs/ folder",
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """``<tmp>/runs/tiny``: a finished one-pod run (checkpoints, an entry, a log, a summary)."""
    root = tmp_path_factory.mktemp("wrong")
    r = run_cli(
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(root / "runs" / "tiny"),
        "--quiet",
        *sum((["--set", s] for s in SETS), []),
    )
    assert r.returncode == 0, r.stderr
    shutil.copy(REPO / "jobs" / "quickstart.yaml", root / "job.yaml")
    return root


def paths(root: Path) -> dict[str, Path]:
    run = root / "runs" / "tiny"
    return {
        "config": run / "config.yaml",
        "job": root / "job.yaml",
        "log": next((run / "logs").glob("*_rank0.h5")),
        "summary": run / "summary.json",
        "checkpoint": run / "checkpoints" / "rank0.safetensors",
        "entry": next((run / "leaderboard" / "entries").glob("*.json")),
        "run": run,
        "record": run / "pods" / "pod0.json",
        "folder": run / "logs",
    }


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its type, size and modification time."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(dirpath) / n
            st = p.lstat()
            out[str(p.relative_to(root))] = (p.is_dir(), st.st_size if not p.is_dir() else 0, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("tool", list(TOOLS))
def test_a_wrong_kind_of_file_is_named_and_nothing_is_created(tree, tool, tmp_path, monkeypatch, capsys):
    accepts, argv = TOOLS[tool]
    monkeypatch.chdir(tree)  # relative leaderboards and outputs would land here
    refused = 0
    for kind, path in paths(tree).items():
        if kind in accepts or (kind == "job" and "config" in accepts):
            continue
        before = snapshot(tree)
        assert podracer(argv(str(path), tmp_path)) == 2, (tool, kind)
        err = capsys.readouterr().err
        assert NAMES[kind] in err and "pass " in err, (tool, kind, err)
        assert "delete" not in err.lower() and "restore" not in err.lower() and "chmod" not in err, (tool, kind, err)
        assert "Traceback" not in err
        if kind not in ("job", "run"):  # a run's file: the message names the run directory or its checkpoint
            assert str(tree / "runs" / "tiny") in err.split("pass ", 1)[1], (tool, kind, err)
        assert snapshot(tree) == before, (tool, kind)
        assert list(tmp_path.iterdir()) == [], (tool, kind)  # no output started
        refused += 1
    assert refused >= 5


def test_the_right_kinds_are_not_refused_as_wrong(tree, tmp_path, monkeypatch, capsys):
    """The kinds a tool takes reach it (a pendulum agent is then refused by backtest for its task,
    not for its kind); the cheap look at a file never says they are something else."""
    monkeypatch.chdir(tree)
    p = paths(tree)
    assert podracer(["evaluate", str(p["entry"]), "--episodes", "1"]) == 0
    assert podracer(["export", "policy", str(p["checkpoint"]), "--out", str(tmp_path / "p.pt")]) == 0
    capsys.readouterr()
    assert podracer(["backtest", str(tmp_path / "p.pt")]) == 2  # an exported policy: read, then its task refused
    assert "not stock_trading" in capsys.readouterr().err
    assert podracer(["status", str(p["run"])]) == 0


def test_a_damaged_checkpoint_still_gets_the_advice_for_a_damaged_checkpoint(tree, tmp_path):
    """Advice to restore is for a file that is that kind and is damaged: a checkpoint cut short
    in its run's checkpoints/ gets it; the same bytes under a name that says nothing do not."""
    run = tmp_path / "run"
    shutil.copytree(tree / "runs" / "tiny", run)
    ck = run / "checkpoints" / "rank0.safetensors"
    ck.write_bytes(ck.read_bytes()[:-100])
    r = run_cli("evaluate", str(ck), "--episodes", "1")
    assert r.returncode == 2 and "restore" in r.stderr and "Traceback" not in r.stderr, r.stderr
    stray = tmp_path / "notes.bin"
    stray.write_bytes(b"\x00\x01garbage" * 50)
    r = run_cli("evaluate", str(stray), "--episodes", "1")
    assert r.returncode == 2 and "did not write" in r.stderr, r.stderr
    assert "delete" not in r.stderr and "restore" not in r.stderr
