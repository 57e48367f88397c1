"""One writer per run directory (files/rundir.py: take_lock): a second writer is refused with exit 2
naming the first, whose files stay byte-equal while it finishes normally; a dead writer's lock is
taken over (also when its pid was reused); a world of ranks is one writer; pools of several jobs
lock per part; run directories and logs are group-private whatever the umask; a killed write's
temporary files are swept at resume.

Writers are real processes (``podracer train``, ``podracer submit --executor local``, a real
mpiexec world); the lock is a real flock on a real file.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, mpiexec_or_skip, run_cli, wait_for

from podracer_hpc.files.rundir import (
    PoolPart,
    RunDir,
    RunDirLocked,
    describe_owner,
    lock_owner,
    make_dirs,
    owner_alive,
    process_alive,
    process_start,
    take_lock,
)

FAST = ["env.num_envs=64", "agent.rollout_steps=16", "eval.episodes=4", "threads=1", "log.progress_interval_s=0"]


def sets(*extra: str) -> list[str]:
    return sum((["--set", s] for s in (*FAST, *extra)), [])


def env(**extra: str) -> dict:
    e = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    e.pop("PODRACER_COMM", None)
    return e


def train_cmd(run: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/pendulum.yaml",
        "--run-dir",
        str(run),
        *sets(*extra),
    ]


def train_rows(run: Path) -> int:
    from podracer_hpc.files.h5log import read_log

    try:
        return len(read_log(run / "logs" / "pendulum_rank0.h5")["train"]["update"])
    except Exception:  # noqa: BLE001  (not there yet, or caught mid-flush)
        return 0


def tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every file and folder under ``root``: its inode and bytes (None for a folder)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_ino, p.read_bytes() if p.is_file() else None)
    return out


# --------------------------------------------------------------------------- the pieces


def test_a_live_lock_refuses_and_a_released_one_is_free(tmp_path):
    rd = RunDir(tmp_path / "r")
    lock, note = take_lock(rd, PoolPart(), range(1))
    assert note == "" and rd.lock_file().exists()
    rec = lock_owner(rd.lock_file())
    assert rec["pid"] == os.getpid() and rec["host"] and rec["start"] == process_start(os.getpid())
    assert owner_alive(rec) is True
    # a second taker in the same process holds another open file: the flock refuses it
    with pytest.raises(RunDirLocked, match=rf"pid {os.getpid()}.*delete {rd.lock_file()}"):
        take_lock(rd, PoolPart(), range(1))
    lock.release()
    assert not rd.lock_file().exists()
    again, note = take_lock(rd, PoolPart(), range(1))
    assert note == ""
    again.release()


def test_a_dead_owner_is_taken_over_and_a_reused_pid_is_not_its_owner(tmp_path):
    rd = RunDir(tmp_path / "r")
    make_dirs(rd.root)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    rec = {"host": os.uname().nodename, "pid": dead.pid, "start": "x:1", "since": time.time() - 60, "job": "local"}
    rd.lock_file().write_text(json.dumps(rec))
    lock, note = take_lock(rd, PoolPart(), range(1))
    assert f"pid {dead.pid}" in note and "gone" in note
    lock.release()
    # a live process, but not the one that took the lock (its pid was reused: another start time)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        real = process_start(sleeper.pid)
        assert real and process_alive(sleeper.pid, real) and not process_alive(sleeper.pid, real + "0")
        rd.lock_file().write_text(json.dumps({**rec, "pid": sleeper.pid, "start": real + "0"}))
        lock, note = take_lock(rd, PoolPart(), range(1))
        assert "gone" in note
        lock.release()
        # the same live process without a flock (a filesystem without one): refused by pid and start time
        rd.lock_file().write_text(json.dumps({**rec, "pid": sleeper.pid, "start": real}))
        with pytest.raises(RunDirLocked, match=f"pid {sleeper.pid}"):
            take_lock(rd, PoolPart(), range(1))
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_requeued_slurm_job_takes_over_its_own_earlier_run_from_another_host(tmp_path):
    rd = RunDir(tmp_path / "r")
    make_dirs(rd.root)
    rec = {"host": "node-gone", "pid": 4242, "start": "b:1", "since": 1.0, "job": "777", "restart": "0"}
    rd.lock_file().write_text(json.dumps(rec))
    assert owner_alive(rec) is None  # another host: only the flock or Slurm can tell
    lock, note = take_lock(rd, PoolPart(), range(1), environ={"SLURM_JOB_ID": "777", "SLURM_RESTART_COUNT": "1"})
    assert "node-gone pid 4242 (job 777)" in note
    assert lock_owner(rd.lock_file())["restart"] == "1"
    lock.release()


def test_parts_of_a_pool_lock_their_own_pods_and_exclude_a_whole_run(tmp_path):
    rd = RunDir(tmp_path / "r")
    a, _ = take_lock(rd, PoolPart(0, 2), range(0, 2))
    b, _ = take_lock(rd, PoolPart(1, 2), range(2, 4))  # another part: its own writer
    assert {p.name for p in rd.root.iterdir()} == {"writer-part0.lock", "writer-part1.lock"}
    assert all(rd.is_lock(p.name) for p in rd.root.iterdir())
    with pytest.raises(RunDirLocked, match="part 0/2"):
        take_lock(rd, PoolPart(), range(4))  # a whole run would write the parts' pods
    a.release()
    b.release()
    whole, _ = take_lock(rd, PoolPart(), range(4))
    with pytest.raises(RunDirLocked):
        take_lock(rd, PoolPart(1, 2), range(2, 4))
    whole.release()


def test_describe_owner_names_host_pid_job_and_since():
    text = describe_owner({"host": "n1", "pid": 12, "job": "55", "part": "1/2", "since": time.time() - 300})
    assert text.startswith("n1 pid 12 (job 55, part 1/2), writing since ") and "(5 min ago)" in text


def test_run_directories_and_logs_are_group_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        make_dirs(tmp_path / "a" / "b")
        from podracer_hpc.files.h5log import H5Writer

        w = H5Writer(tmp_path / "a" / "logs" / "x_rank0.h5", {})
        w.close()
        from podracer_hpc.files.atomic import atomic_write_bytes

        atomic_write_bytes(tmp_path / "a" / "checkpoints" / "rank0.safetensors", b"x")
    finally:
        os.umask(old)
    for d in ("a", "a/b", "a/logs", "a/checkpoints"):
        assert stat.S_IMODE((tmp_path / d).stat().st_mode) == 0o750, d
    for f in ("a/logs/x_rank0.h5", "a/checkpoints/rank0.safetensors"):
        assert stat.S_IMODE((tmp_path / f).stat().st_mode) == 0o640, f


def test_debris_is_only_what_killed_writes_of_these_pods_left_before_the_writer(tmp_path):
    rd = RunDir(tmp_path)
    old = [
        rd.checkpoints_dir / ".rank0.safetensors.0123456789ab.tmp",
        rd.checkpoints_dir / "rank1.prev.tmp",
        rd.pods_dir / ".pod0.json.aaaaaaaaaaaa.tmp",
        rd.logs_dir / ".pendulum_rank1.h5.recover.tmp",
    ]
    keep = [
        rd.checkpoints_dir / ".rank2.safetensors.0123456789ab.tmp",  # another writer's pod
        rd.checkpoints_dir / "rank0.safetensors",  # no temporary
    ]
    for p in old + keep:
        make_dirs(p.parent)
        p.write_bytes(b"x")
        os.utime(p, (time.time() - 100, time.time() - 100))
    young = rd.checkpoints_dir / ".rank1.safetensors.ffffffffffff.tmp"  # written since the writer started
    young.write_bytes(b"x")
    assert rd.debris(range(2), before=time.time() - 10) == sorted(old)


# --------------------------------------------------------------------------- real writers


def test_a_second_train_into_a_live_run_is_refused_and_the_first_finishes_untouched(tmp_path):
    d = tmp_path / "r"
    extra = ("total_env_steps=32768", "eval.interval_env_steps=8192", "log.checkpoint_interval_s=0.2")
    first = subprocess.Popen(
        train_cmd(d, *extra),
        cwd=REPO,
        env=env(PODRACER_INJECT_SLOW="0:4"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: train_rows(d) >= 3 or first.poll() is not None, 240, "3 updates of the first writer")
        assert first.poll() is None, first.communicate()[1]
        first.send_signal(signal.SIGSTOP)  # frozen mid-run: whatever changes now is the second writer's doing
        time.sleep(0.5)
        before = tree(d)
        assert "writer.lock" in before
        second = subprocess.run(train_cmd(d, *extra), cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
        after = tree(d)
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.returncode == 2, second.stderr
    assert "Traceback" not in second.stderr
    assert f"pid {first.pid}" in second.stderr and "writing since" in second.stderr
    assert "another --run-dir" in second.stderr and "kill -USR2" in second.stderr
    assert after == before  # nothing created, renamed, rewritten: the log was not taken for a killed writer's
    out, err = first.communicate(timeout=400)
    assert first.returncode == 0, err
    assert "left open by a killed writer" not in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["env_steps"] == 32768
    from podracer_hpc.files.h5log import read_log

    u = list(read_log(d / "logs" / "pendulum_rank0.h5")["train"]["update"])
    assert u == list(range(1, 33)), u  # every update once, in order
    assert not (d / "writer.lock").exists()  # released at the end
    assert not list((d / "logs").glob("*.unclean"))


def test_a_killed_writer_s_lock_and_temporary_files_are_taken_over_at_resume(tmp_path):
    d = tmp_path / "r"
    extra = ("total_env_steps=16384", "log.checkpoint_interval_s=0.2")
    first = subprocess.Popen(
        train_cmd(d, *extra), cwd=REPO, env=env(PODRACER_INJECT_SLOW="0:4"), stdout=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: train_rows(d) >= 3 or first.poll() is not None, 240, "3 updates")
        assert first.poll() is None
        first.kill()
        first.wait(30)
    finally:
        first.kill()
    assert lock_owner(d / "writer.lock")["pid"] == first.pid  # left behind by the kill
    junk = d / "checkpoints" / ".rank0.safetensors.0123456789ab.tmp"  # as a write killed mid-way leaves it
    junk.write_bytes(b"\0" * 4096)
    r = subprocess.run(train_cmd(d, *extra), cwd=REPO, env=env(), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr
    assert f"took over the writer lock of {os.uname().nodename} pid {first.pid}" in r.stderr
    assert "removed 1 temporary file(s)" in r.stderr and not junk.exists()
    assert "resuming from" in r.stderr
    assert not (d / "writer.lock").exists()


@pytest.mark.mpi
def test_a_world_of_ranks_is_refused_on_every_rank_without_a_hang(tmp_path):
    mpiexec = mpiexec_or_skip()
    rd = RunDir(tmp_path / "r")
    lock, _ = take_lock(rd, PoolPart(), range(1))  # this test process is the live writer
    try:
        before = tree(rd.root)
        r = subprocess.run(
            [mpiexec, "-n", "2", *train_cmd(rd.root, "total_env_steps=4096")],
            cwd=REPO,
            env=env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
        assert r.stderr.count(f"pid {os.getpid()}") == 2, r.stderr  # both ranks say who writes
        assert "Traceback" not in r.stderr
        assert tree(rd.root) == before
    finally:
        lock.release()


def test_submit_local_refuses_a_run_directory_a_live_process_writes(tmp_path):
    mpiexec_or_skip()
    rd = RunDir(tmp_path / "r")
    lock, _ = take_lock(rd, PoolPart(), range(1))
    try:
        before = tree(rd.root)
        r = run_cli("submit", "jobs/pendulum.yaml", "--executor", "local", "--run-dir", str(rd.root), timeout=120)
        assert r.returncode == 2, r.stderr
        assert f"pid {os.getpid()}" in r.stderr and "Traceback" not in r.stderr
        assert tree(rd.root) == before  # no launch.log, nothing started
    finally:
        lock.release()
