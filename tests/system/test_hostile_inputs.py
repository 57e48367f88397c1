"""Hostile files and full disks (fuzz and chaos): every case ends in exit 2 within seconds, with a
message and no traceback, or in the documented fallback (a bad file skipped with a warning); no
good file is lost. Real processes, real files, a real tmpfs and a real mpiexec where they exist.

- files that never end or block: a FIFO or a link to /dev/zero in a leaderboard, a sparse 20 GB
  checkpoint, JSON nested 200k deep;
- job files and settings: a YAML alias bomb, intervals below one batch, min_interval_s 1e308;
- full disks: a write past a file-size limit (any user) and a full tmpfs under a 2-rank mpiexec
  (root): every rank exits 2 within seconds, and the run resumes once there is space again.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import mpiexec_or_skip

from podracer_hpc.files.h5log import read_log
from podracer_hpc.files.records import read_records

REPO = Path(__file__).resolve().parents[2]
FAST = ["env.num_envs=64", "agent.rollout_steps=16", "eval.episodes=4", "threads=1", "log.progress_interval_s=0"]
QUICK_S = 60  # "within seconds": the command's own start (python, torch) included, on a loaded CI machine


def sets(*extra: str) -> list[str]:
    return sum((["--set", s] for s in (*FAST, *extra)), [])


def env() -> dict:
    e = {**os.environ, "PYTHONUNBUFFERED": "1"}
    e.pop("PODRACER_COMM", None)
    return e


def podracer(*args: str, timeout: float = QUICK_S, **kw) -> tuple[subprocess.CompletedProcess, float]:
    """Run `podracer ARGS`; returns the result and the seconds it took (a hang fails the test)."""
    t = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env(),
        **kw,
    )
    return r, time.monotonic() - t


def refused(r: subprocess.CompletedProcess, *fragments: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    for f in fragments:
        assert f in r.stderr, r.stderr[-3000:]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished one-pod tournament run: a checkpoint, a log, leaderboard entries."""
    d = tmp_path_factory.mktemp("hostile") / "run"
    r, _ = podracer(
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(d),
        "--quiet",
        *sets("total_env_steps=4096", "tournament.interval_env_steps=2048", "eval.final_episodes=4"),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert list((d / "leaderboard" / "entries").glob("*.json"))
    return d


def copy_of(run: Path, tmp_path: Path) -> Path:
    c = tmp_path / "run"
    shutil.copytree(run, c)
    return c


def digests(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file() and not p.is_symlink()}


# --- files that never end or block ---------------------------------------------------------


@pytest.mark.parametrize("planted", ["fifo sidecar", "dev-zero sidecar", "deep sidecar"])
def test_a_planted_sidecar_is_skipped_by_status_and_evaluate(run, tmp_path, planted):
    """A FIFO blocked every reader of the leaderboard; a link to /dev/zero read to MemoryError; a
    sidecar nested 200k deep was a RecursionError on every later start. Now each is skipped with
    a warning naming it, and the good files are untouched."""
    d = copy_of(run, tmp_path)
    bad = d / "leaderboard" / "entries" / "planted-0-0-0123456789ab.json"
    if planted == "fifo sidecar":
        os.mkfifo(bad)
    elif planted == "dev-zero sidecar":
        bad.symlink_to("/dev/zero")
    else:
        bad.write_text("[" * 200_000 + "]" * 200_000)
    before = digests(d)
    r, took = podracer("status", str(d))
    assert r.returncode == 0 and took < QUICK_S and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "leaderboard" in r.stdout
    r, took = podracer("evaluate", str(d), "--episodes", "2", "--top", "1", timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["results"]
    assert "planted-0-0-0123456789ab.json" in r.stderr
    after = digests(d)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing good was touched


@pytest.mark.parametrize("planted", ["fifo", "dev-zero", "sparse 20 GB"])
def test_a_checkpoint_that_never_ends_is_refused_at_once(tmp_path, planted):
    ck = tmp_path / "rank0.safetensors"
    if planted == "fifo":
        os.mkfifo(ck)
    elif planted == "dev-zero":
        ck.symlink_to("/dev/zero")
    else:
        with open(ck, "wb") as f:
            f.truncate(20 << 30)
    r, took = podracer("evaluate", str(ck), "--episodes", "2")
    refused(r, str(ck))
    assert took < QUICK_S
    assert {"fifo": "FIFO", "dev-zero": "character device", "sparse 20 GB": "it is corrupt"}[planted] in r.stderr


def test_an_entry_whose_tensors_are_dev_zero_is_refused_and_the_next_one_taken(run, tmp_path):
    d = copy_of(run, tmp_path)
    entries = sorted((d / "leaderboard" / "entries").glob("*.safetensors"))
    for e in entries:
        e.unlink()
        e.symlink_to("/dev/zero")
    r, took = podracer("evaluate", str(entries[0]), "--episodes", "2")
    refused(r, "character device")
    assert took < QUICK_S
    r, _ = podracer("evaluate", str(d), "--episodes", "2", "--top", "4", timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])["results"]
    assert [x["agent"] for x in rows] == ["rank 0 checkpoint"] and "skipped: " in r.stderr


# --- job files and settings ---------------------------------------------------------------


def _bomb() -> str:
    lines = ["x0: &x0 [1,1,1,1,1,1,1,1,1,1]"]
    lines += [f"x{i}: &x{i} [" + ",".join([f"*x{i - 1}"] * 10) + "]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", ["train", "config", "submit"])
def test_a_yaml_alias_bomb_ends_in_exit_2_within_seconds(tmp_path, command):
    job = tmp_path / "bomb.yaml"
    job.write_text(_bomb())
    assert job.stat().st_size < 1024
    extra = {
        "train": ["--run-dir", str(tmp_path / "r")],
        "config": [],
        "submit": ["--executor", "local", "--dry-run", "--run-dir", str(tmp_path / "r")],
    }[command]
    r, took = podracer(command, str(job), *extra)
    refused(r, "alias bomb")
    assert took < QUICK_S and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "setting, needle",
    [
        ("tournament.min_interval_s=1e308", "tournament.min_interval_s must be in"),
        ("tournament.interval_env_steps=100", "must be at least one update's env steps"),
    ],
)
def test_settings_that_would_hang_or_overflow_are_refused(tmp_path, setting, needle):
    r, took = podracer(
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(tmp_path / "r"),
        *sets(setting, "tournament.mode=elegantrl"),
    )
    refused(r, needle)
    assert took < QUICK_S


# --- full disks --------------------------------------------------------------------------


def _file_size_limit(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_file_size_limit_during_training_exits_2_and_the_run_resumes(tmp_path):
    """`ulimit -f` (no root needed): the log's write is refused as it is laid out; the pod says
    what to do and exits 2 (no HDF5 traceback); run again without the limit and it completes."""
    d = tmp_path / "r"
    args = ("train", "jobs/pendulum.yaml", "--run-dir", str(d), "--quiet", *sets("total_env_steps=16384"))
    r, took = podracer(*args, timeout=300, preexec_fn=_file_size_limit(80_000))  # a new log is ~92 kB
    refused(r, "run the same command again")
    assert "file-size limit" in r.stderr or "filesystem is full" in r.stderr, r.stderr[-2000:]
    r, _ = podracer(*args, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["env_steps"] == 16384
    assert "Traceback" not in r.stderr


@pytest.fixture
def tmpfs(tmp_path):
    """A real tmpfs (root only); skipped, saying why, where mounting is refused."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def mount(size: str) -> Path:
        opts = f"size={size}"
        if os.path.ismount(mnt):
            r = subprocess.run(["mount", "-o", f"remount,{opts}", str(mnt)], capture_output=True, text=True)
        else:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): needs root in a mount-capable container")
        return mnt

    yield mount
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.mpi
def test_a_full_disk_under_mpiexec_ends_every_rank_with_exit_2_and_resumes(tmpfs):
    """Two ranks on a 100 KiB tmpfs: one rank's log (or checkpoint) write is refused. That rank
    aborted alone and the other waited forever; now the world ends with exit 2 within seconds,
    saying what to do. With space again, the same command resumes and completes."""
    mnt = tmpfs("100k")
    d = mnt / "r"
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
        *sets("total_env_steps=8192", "tournament.interval_env_steps=4096"),
    ]
    t = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO, env=env())
    took = time.monotonic() - t
    refused(r, "No space left on device", "the filesystem is full", "aborting the other 1 ranks (exit 2)")
    assert took < 120, took  # both ranks' start (python, torch, MPI) included
    tmpfs("8m")  # space freed
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((d / "summary.json").read_text())
    assert summary.get("complete", True) and summary["env_steps"] == 2 * 8192
    for rank in (0, 1):
        log = read_log(d / "logs" / f"quickstart_rank{rank}.h5")
        assert len(log["train"]["update"]) == 8  # every update logged once, recovered rows or redone
        assert list(log["train"]["update"]) == list(range(1, 9))


def test_a_round_that_could_not_publish_is_in_the_log_and_the_summary(tmpfs, tmp_path):
    """A full leaderboard filesystem: the rounds go on without their entries, and each such round
    says so in the pod's /tournament row (publish_failed) and in summary.json."""
    mnt = tmpfs("4k")
    d = tmp_path / "r"
    r, _ = podracer(
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(d),
        "--quiet",
        *sets("total_env_steps=6144", "tournament.interval_env_steps=2048", f"tournament.leaderboard_dir={mnt / 'lb'}"),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    records = read_records(read_log(d / "logs" / "quickstart_rank0.h5")["tournament"])
    failed = [x.round for x in records if x.publish_failed]
    assert failed and "could not publish" in r.stderr
    assert json.loads((d / "summary.json").read_text())["publish_failed"] == {"0": len(failed)}
