"""`podracer status`: the pods and leaderboard of a run, read while it trains and after it ended."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import mpiexec_or_skip

import podracer_hpc.pool.leaderboard  # noqa: F401  (imported now: the live check below should not wait for torch)
from podracer_hpc.files.h5log import read_log
from podracer_hpc.files.live import StatusError
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.tools.status import render, status

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\s*(?P<rank>\d+)\s+(?P<seed>\d+)\s+(?P<rounds>\d+|-)\s+(?P<steps>[\d,]+)")


def pod_rows(text: str) -> dict[int, str]:
    return {int(m["rank"]): line for line in text.splitlines() if (m := ROW.match(line))}


def evals(line: str) -> list[float]:
    """A row's last and peak evaluation cells (the numbers with one decimal)."""
    return [float(t) for t in line.split() if re.fullmatch(r"-?\d+\.\d", t)]


def _has_rows(run: Path) -> bool:
    logs = sorted((run / "logs").glob("*_rank*.h5")) if (run / "logs").is_dir() else []
    if len(logs) < 2:
        return False
    try:
        return all(len(read_log(p)["eval"]["env_steps"]) > 0 for p in logs)
    except Exception:  # noqa: BLE001 - a file still being created
        return False


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A 2-pod tournament: the status table while it trains, then the run, finished."""
    run = tmp_path_factory.mktemp("status") / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PODRACER_COMM", None)
    sets = [
        "total_env_steps=204800",
        "tournament.interval_env_steps=25600",
        "eval.interval_env_steps=25600",
        "eval.episodes=5",
        "log.progress_interval_s=0",
    ]
    proc = subprocess.Popen(
        [
            mpiexec_or_skip(),
            "-n",
            "2",
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "train",
            "jobs/quickstart.yaml",
            "--run-dir",
            str(run),
            "--quiet",
            *sum((["--set", s] for s in sets), []),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _has_rows(run):  # the first evaluation (a tournament round) is flushed at once
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no log rows after 120 s"
            time.sleep(0.1)
        text = render(run)
        running = proc.poll() is None
        watched = io.StringIO()
        result: dict = {}
        watcher = threading.Thread(target=lambda: result.setdefault("rc", status(run, watch=0.3, out=watched)))
        watcher.start()
        out, err = proc.communicate(timeout=240)
        watcher.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    return {
        "run": run,
        "live_text": text,
        "was_running": running,
        "watched": watched.getvalue(),
        "watch_rc": result.get("rc"),
        "watch_alive": watcher.is_alive(),
    }


def test_status_reads_a_run_while_it_trains(live):
    text = live["live_text"]
    assert live["was_running"], "the run ended before the status was read: raise total_env_steps"
    header = text.splitlines()[0]
    assert "running" in header and "2 pods" in header and "tournament elegantrl" in header
    rows = pod_rows(text)
    assert sorted(rows) == [0, 1]
    for rank, line in rows.items():
        steps = int(ROW.match(line)["steps"].replace(",", ""))
        assert 0 < steps < 204800, line
        assert ROW.match(line)["rounds"] != "-"
    assert "leaderboard" in text and "summary:" not in text


def test_status_after_the_run_matches_logs_and_summary(live):
    run = live["run"]
    text = render(run)
    summary = json.loads((run / "summary.json").read_text())
    assert "finished" in text.splitlines()[0]
    rows = pod_rows(text)
    assert sorted(rows) == [0, 1]
    for rank, line in rows.items():
        log = read_log(run / "logs" / f"quickstart_rank{rank}.h5")
        m = ROW.match(line)
        assert int(m["steps"].replace(",", "")) == int(log["train"]["env_steps"][-1])
        assert int(m["seed"]) == log["attrs"]["seed"] == rank
        assert int(m["rounds"]) == int(log["tournament"]["round"][-1]) + 1 == summary["rounds"]
        ev = log["eval"]["return_mean"]
        assert f"{ev[-1]:.1f}" in line and f"{np.nanmax(ev):.1f}" in line  # last and best evaluation
        action = str(log["tournament"]["action"][-1])
        assert f"r{summary['rounds'] - 1}: " in line
        assert ("keep" in line) == (action == "keep")
    total = next(line for line in text.splitlines() if line.lstrip().startswith("all "))
    # the "all" row is computed as the pods' cells are: its peak is the pods' best peak (summary's peak_return),
    # never the verdict, which is another measurement (common start states) and has a line of its own
    peaks = {r: evals(line)[1] for r, line in rows.items()}
    assert f"{summary['env_steps']:,}" in total and evals(total)[1] == max(peaks.values())
    assert f"{summary['peak_return']:.1f}" in total and f"peak: pod {max(peaks, key=peaks.get)}" in total
    verdict = next(line for line in text.splitlines() if line.startswith("verdict: "))
    assert f"best_return {summary['best_return']:.1f}" in verdict and f"pod {summary['best_pod']}," in verdict
    assert f"best_return {summary['best_return']:,.1f}" in text and f"rounds {summary['rounds']}" in text
    board = podracer_hpc.pool.leaderboard.Leaderboard(run / "leaderboard").list()
    assert board and board[0].id in text and f"({len(board)} entries" in text


def test_watch_refreshes_until_the_run_ends(live):
    assert not live["watch_alive"] and live["watch_rc"] == 0
    frames = live["watched"].split("\nrun ")
    assert len(frames) >= 2, live["watched"]
    assert "finished" in frames[-1].splitlines()[0] and "summary:" in frames[-1]
    assert all("summary:" not in f for f in frames[:-1])  # printed once more after the summary appeared


def test_status_once_prints_and_returns(live, capsys):
    buf = io.StringIO()
    assert status(live["run"], out=buf) == 0
    once = buf.getvalue()
    assert once.startswith(f"run {live['run']}") and once.count("\nrun ") == 0 and "summary:" in once
    assert sorted(pod_rows(once)) == [0, 1]
    t0 = time.monotonic()
    assert status(live["run"], watch=5, out=buf) == 0  # the run has ended: printed once, no waiting
    assert time.monotonic() - t0 < 4


def test_watch_waits_for_a_run_directory_to_appear(live, tmp_path):
    target = tmp_path / "later"
    buf = io.StringIO()
    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault("rc", status(target, watch=0.1, out=buf)))
    t.start()
    time.sleep(0.3)
    shutil.copytree(live["run"], target)
    t.join(timeout=20)
    assert not t.is_alive() and result["rc"] == 0
    out = buf.getvalue()
    assert "waiting for the run to start" in out and "finished" in out.split("\nrun ")[-1]


def test_logs_without_config_and_an_unreadable_log(live, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(live["run"] / "logs", copy / "logs")  # logs only: the config comes from their attributes
    (copy / "logs" / "quickstart_rank2.h5").write_bytes(b"not an HDF5 file")
    text = render(copy)
    assert "[quickstart: pendulum, 3 pods, tournament elegantrl]  running" in text.splitlines()[0]
    rows = pod_rows(text)
    assert sorted(rows) == [0, 1]
    assert re.search(r"^\s*2\s.*unreadable: quickstart_rank2\.h5", text, re.M)


def test_not_a_run_directory_is_refused_clearly(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert status(tmp_path) == 2
    err = capsys.readouterr().err
    assert "is not a podracer run directory" in err and "config.yaml" in err
    assert status(tmp_path / "notes.txt") == 2
    assert "notes.txt is a file podracer-hpc did not write; pass a run directory" in capsys.readouterr().err
    with pytest.raises(StatusError, match="no such directory") as e:
        render(tmp_path / "missing")
    assert e.value.pending
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "config.yaml").write_text("name: a\n")
    with pytest.raises(StatusError, match="run directories inside it: a") as e:
        render(tmp_path / "runs")
    assert not e.value.pending


# ------------------------------------------------------------------------------------------
# Monitoring at scale: synthetic run directories written through h5log's
# writer, no training.
# ------------------------------------------------------------------------------------------
def _synthetic_run(root: Path, pods: int, rows: int = 5, total: int = 100_000, slurm: dict | None = None) -> Path:
    from podracer_hpc.files.h5log import H5Writer

    cfg = {"name": "big", "total_env_steps": total, "env": {"name": "pendulum"}, "tournament": {"mode": "elegantrl"}}
    for r in range(pods):
        attrs = {"config": cfg, "seed": r, "rank": r, "world_size": pods, "slurm": slurm or {}}
        with H5Writer(root / "logs" / f"big_rank{r}.h5", attrs) as w:
            _append(w, r, 0, rows, total)
    return root


def _append(w, rank: int, start: int, rows: int, total: int) -> None:
    per = total // 5 if rank % 3 == 0 else total // 10  # a third of the pods reach the budget in 5 rows
    for u in range(start, start + rows):
        w.append(
            "train",
            {"update": u, "env_steps": min(total, (u + 1) * per), "wall_s": u + 1.0, "steps_per_s": 1000.0 + rank},
        )
    w.append("eval", {"env_steps": min(total, (start + rows) * per), "return_mean": -1000.0 + 10 * rank + start})
    w.append(
        "tournament",
        {
            "round": start // rows,
            "env_steps": min(total, (start + rows) * per),
            "action": "keep",
            "fitness": -1000.0 + rank,
            "source_kind": "",
            "source_id": "",
            "source_rejected": 0,
        },
    )


def test_status_of_64_pods_fits_a_screen_with_aggregates(tmp_path):
    from podracer_hpc.cluster.jobstate import SlurmJobState

    run = _synthetic_run(
        tmp_path / "run", 64, slurm={"SLURM_JOB_ID": "901", "SLURM_ARRAY_JOB_ID": "900", "SLURM_ARRAY_TASK_ID": "3"}
    )
    (tmp_path / "run" / "logs" / "big_rank7.h5").write_bytes(b"not HDF5")  # one broken log
    asked = []
    text = render(run, slurm=lambda ids: asked.append(ids) or {i: SlurmJobState("RUNNING", "None", 2) for i in ids})
    lines = text.splitlines()
    assert len(lines) <= 40, text
    done = sum(1 for r in range(64) if r % 3 == 0 and r != 7)
    assert f"pods: {63 - done} running, {done} done, 1 unreadable" in text and "unreadable: rank 7" in text
    med = next(line for line in lines if line.strip().startswith("peak eval"))
    assert med.split()[2] == "-1000.0" and med.split()[-2] == "-370.0"  # min and max over pods (ranks 0 and 63)
    assert med.split()[-1] == "63"  # the pods it is over: the readable ones
    rows = pod_rows(text)
    assert list(rows) == [63, 62, 61, 60, 59]  # the top pods by peak evaluation, best first
    assert "top 5 of 64 pods" in text and "--pods" in text
    assert asked == [["900_3"]]  # one scheduler question for the run's job
    assert "slurm job 900_3: RUNNING, requeued 2 times" in text
    every = render(run, pods=True, slurm=lambda ids: {})
    assert sorted(pod_rows(every)) == [r for r in range(64) if r != 7]
    assert re.search(r"^\s*7\s.*unreadable", every, re.M)
    assert sorted(pod_rows(render(run, top_pods=12, slurm=lambda ids: {}))) == list(range(52, 64))


def test_status_cli_flags(tmp_path):
    from helpers import run_cli

    run = _synthetic_run(tmp_path / "run", 20)
    out = run_cli("status", str(run), "--top", "3")
    assert out.returncode == 0, out.stderr
    assert list(pod_rows(out.stdout)) == [19, 18, 17]
    out = run_cli("status", str(run), "--all")
    assert out.returncode == 0 and sorted(pod_rows(out.stdout)) == list(range(20))
    bad = run_cli("status", str(run), "--top", "-1")
    assert bad.returncode == 2 and "--top must be >= 0" in bad.stderr and "Traceback" not in bad.stderr


def test_a_watcher_reads_only_the_rows_appended_since_its_last_poll(tmp_path):
    from podracer_hpc.files.h5log import H5Writer
    from podracer_hpc.files.live import Monitor

    run = _synthetic_run(tmp_path / "run", 4, rows=50)
    m = Monitor(run)
    first = m.poll()
    assert m.rows_read == 4 * (50 + 1 + 1)  # every row once: train, eval, tournament
    assert m.poll() and m.rows_read == 4 * 52  # nothing changed: nothing read (the files are not even opened)
    cfg = {"name": "big", "total_env_steps": 100_000, "env": {"name": "pendulum"}, "tournament": {"mode": "elegantrl"}}
    with H5Writer(run / "logs" / "big_rank2.h5", {"config": cfg, "seed": 2, "rank": 2, "world_size": 4}) as w:
        _append(w, 2, 50, 3, 100_000)
    after = m.poll()
    assert m.rows_read == 4 * 52 + 3 + 1 + 1  # rank 2's five new rows, nothing else
    assert after[2].updates == 52 and after[2].last_eval == -1000.0 + 20 + 50 and after[2].rounds == 50 // 3 + 1
    assert after[2].best_eval == max(first[2].best_eval, after[2].last_eval)
    fresh = Monitor(run).poll()[2]  # the same state as reading the whole log
    assert (fresh.env_steps, fresh.updates, fresh.last_eval, fresh.best_eval, fresh.rounds, fresh.steps_per_s) == (
        after[2].env_steps,
        after[2].updates,
        after[2].last_eval,
        after[2].best_eval,
        after[2].rounds,
        after[2].steps_per_s,
    )
    with H5Writer(run / "logs" / "big_rank2.h5", {}) as w:  # a resume cut the log back: read from the start again
        w.truncate_to({"train": 10, "eval": 1, "tournament": 1})
    cut = m.poll()[2]
    assert cut.updates == 9 and cut.rounds == 1 and cut.last_eval == -980.0


def test_status_asks_slurm_at_most_every_30_s(tmp_path, monkeypatch):
    """A fake scontrol on PATH (the real-cluster tier, tests/slurm, is minutes per job): what is
    checked is that a watcher's refreshes ask once per SLURM_EVERY_S, and what the answer becomes."""
    from podracer_hpc.files.live import Monitor
    from podracer_hpc.tools import status as status_mod

    run = _synthetic_run(tmp_path / "run", 32, slurm={"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"})
    bin_, calls = tmp_path / "bin", tmp_path / "calls"
    bin_.mkdir()
    (bin_ / "scontrol").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        'echo "JobId=77 JobName=big JobState=RUNNING Reason=None Restarts=1 ExitCode=0:0"\n'
    )
    (bin_ / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    m = Monitor(run)
    for _ in range(3):
        text = render(run, monitor=m)
    assert calls.read_text().splitlines() == ["-o show job 77"]  # the answer is kept for 30 s
    assert "slurm job 77: RUNNING, requeued 1 time" in text
    monkeypatch.setattr(status_mod, "SLURM_EVERY_S", 0.0)
    render(run, monitor=m)
    assert calls.read_text().splitlines() == ["-o show job 77"] * 2


def test_progress_lines_come_from_rank_0_with_the_pool_unless_every_rank_is_asked(tmp_path):
    """At 4,096 ranks every rank's progress line was 410 lines/s into one job log."""
    fast = [
        "total_env_steps=8192",
        "env.num_envs=64",
        "agent.rollout_steps=16",
        "eval.interval_env_steps=2048",
        "eval.episodes=3",
        "eval.final_episodes=0",
        "tournament.interval_env_steps=2048",
        "log.progress_interval_s=0.001",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PODRACER_COMM", None)

    def train(run, *extra):
        sets = sum((["--set", s] for s in (*fast, *extra)), [])
        p = subprocess.run(
            [
                mpiexec_or_skip(),
                "-n",
                "2",
                sys.executable,
                "-m",
                "podracer_hpc.cli",
                "train",
                "jobs/quickstart.yaml",
                "--run-dir",
                str(run),
                *sets,
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr
        return [line for line in p.stderr.splitlines() if "ETA" in line]

    lines = train(tmp_path / "a")
    assert lines and all(line.startswith("[quickstart r0]") for line in lines)
    assert any(
        re.search(r"\| pool at round \d+: 2 pods, fitness median -?\d+\.\d, best -?\d+\.\d \(pod [01]\)", line)
        for line in lines
    )
    every = train(tmp_path / "b", "log.progress_all_ranks=true")
    assert {line.split("]")[0] for line in every} == {"[quickstart r0", "[quickstart r1"}


# ------------------------------------------------------------------------------------------
# What the run directory says about how pods ended, and a reader that never writes
# ------------------------------------------------------------------------------------------
def _pool_of_two_parts(root: Path, total: int = 100_000) -> Path:
    """A pool of 2 jobs x 2 pods: part 0 trained its budget and ended (records, summary), part 1's
    pods logged 6 updates and checkpointed at update 3 (what a SIGKILL mid-run leaves)."""
    import torch

    from podracer_hpc.files import safeio
    from podracer_hpc.files.h5log import H5Writer
    from podracer_hpc.files.summary import write_record

    rd = RunDir(root)
    cfg = {"name": "pool", "total_env_steps": total, "env": {"name": "pendulum"}, "tournament": {"mode": "none"}}
    for r in range(4):
        attrs = {"config": cfg, "seed": r, "rank": r, "world_size": 2, "pool_size": 4, "pool_part": f"{r // 2}/2"}
        steps = total // 6 if r < 2 else total // 12
        with H5Writer(rd.log(r).with_name(f"pool_rank{r}.h5"), attrs) as w:
            for u in range(1, 7):
                w.append(
                    "train", {"update": u, "env_steps": min(total, u * steps), "wall_s": float(u), "steps_per_s": 1.0}
                )
        safeio.save(rd.checkpoint_path(r), {"x": torch.zeros(1)}, {"updates": 6 if r < 2 else 3}, "pod-state")
        if r < 2:
            write_record(rd, r, {"state": "done", "env_steps": total})
    rd.summary.write_text(json.dumps({"complete": False, "pods": 4, "pods_missing": [2, 3]}))
    return root


def test_a_killed_part_of_a_pool_is_reported_killed_not_stopped(tmp_path):
    from podracer_hpc.files.rundir import PoolPart, take_lock

    run = _pool_of_two_parts(tmp_path / "run")
    rd = RunDir(run)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    rd.lock_file(PoolPart(1, 2)).write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid, "start": "x"}))
    text = render(run)
    head = text.splitlines()[0]
    assert "killed: pods 2, 3 killed (resumes from update 3)" in head and "run the same command again" in head, head
    assert "stopped early (checkpointed" not in text
    assert "pods: 2 done, 2 killed" in text
    # no lock left at all once the run's summary exists: gone too
    rd.lock_file(PoolPart(1, 2)).unlink()
    assert "pods: 2 done, 2 killed" in render(run)
    # part 1 written now by a live process: its pods run, the summary is only the pool's so far
    lock, _ = take_lock(rd, PoolPart(1, 2), range(2, 4))
    try:
        text = render(run)
    finally:
        lock.release()
    assert "pods: 2 running, 2 done" in text and "killed:" not in text and "2 killed" not in text
    assert "running (the summary so far" in text.splitlines()[0]


def _tree(root: Path) -> dict:
    return {
        str(p.relative_to(root)): (p.lstat().st_ino, p.lstat().st_mode, p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def read_only_view(tmp_path):
    """A read-only bind mount of a directory (root in a mount-capable container; skipped, saying why,
    elsewhere): any write through it fails with EROFS, whoever the user, as on a run directory of
    another user or a read-only filesystem."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    mounted = []

    def view(src: Path) -> Path:
        for cmd in (["mount", "--bind", str(src), str(mnt)], ["mount", "-o", "remount,bind,ro", str(mnt)]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot make a read-only bind mount here ({r.stderr.strip()})")
            mounted.append(mnt)
        assert subprocess.run(["touch", str(mnt / "probe")], capture_output=True).returncode != 0
        return mnt

    yield view
    if mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_status_writes_nothing_and_reads_a_read_only_run(tmp_path, read_only_view):
    """A corrupt leaderboard entry is reported, not quarantined (no rename); no entries folder is made."""
    run = _pool_of_two_parts(tmp_path / "run")
    cfg = {"name": "pool", "total_env_steps": 100_000, "env": {"name": "pendulum"}, "tournament": {"mode": "pbt"}}
    (run / "config.yaml").write_text(json.dumps(cfg))
    entries = run / "leaderboard" / "entries"
    entries.mkdir(parents=True)
    os.chmod(run / "leaderboard", 0o777)  # world-accessible: a writer would warn to chmod it; a reader does not
    bad = {"format": "podracer-hpc-leaderboard", "version": 2, "id": "x-0-0-0123456789ab", "sidecar_sha256": "0" * 64}
    (entries / "x-0-0-0123456789ab.json").write_text(json.dumps(bad))
    before = _tree(run)
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "status", str(run)], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr and "chmod" not in r.stderr, r.stderr
    assert _tree(run) == before  # nothing renamed, created or rewritten
    ro = read_only_view(run)
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "status", str(ro)], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "pods: 2 done, 2" in r.stdout and "leaderboard" in r.stdout
    # a run without a leaderboard yet: no leaderboard/entries is made by reading it
    shutil.rmtree(run / "leaderboard")
    assert status(run, out=io.StringIO()) == 0
    assert not (run / "leaderboard").exists()


def test_status_per_part_reads_aggregates_and_ends_a_part_only_with_its_own_job(tmp_path, monkeypatch):
    """A pool of 2 parts x 2 pods: part 0 ended (its final aggregate, summary.json written,
    "complete": false); part 1 still runs (its aggregate, its job RUNNING). Part 1's pods must
    count as running, not stopped; a part 2 with no record yet names its job and nodes; the logs
    are not opened when the aggregates cover every pod."""
    import json as json_

    from podracer_hpc.cluster.jobstate import SlurmJobState
    from podracer_hpc.files import heartbeat, live
    from podracer_hpc.files.live import Monitor
    from podracer_hpc.files.rundir import RunDir

    monkeypatch.setattr(live, "AGGREGATES_FROM", 6)  # what a pool of thousands does, at 6 pods
    run = tmp_path / "pool"
    rd = RunDir(run)
    run.mkdir()
    rd.config.write_text(json_.dumps({"name": "p", "total_env_steps": 1000, "env": {"name": "pendulum"}}))
    rd.pool_file.write_text(
        json_.dumps(
            {
                "jobs": 3,
                "pods_per_job": 2,
                "parts": {str(k): {"executor": "slurm", "job": str(50 + k)} for k in range(3)},
            }
        )
    )
    (run / "logs").mkdir()
    for pod in range(6):
        (run / "logs" / f"p_rank{pod}.h5").write_bytes(b"not a log: must not be read while aggregates cover it")

    def beat(pod, steps, state):
        return {
            "pod": pod,
            "rank": pod % 2,
            "part": pod // 2,
            "host": f"n{pod // 2}",
            "t": time.time(),
            "env_steps": steps,
            "update": steps // 100,
            "state": state,
            "seed": pod,
            "algo": "ppo",
        }

    heartbeat.write_aggregate(
        rd,
        0,
        {
            "job": "50",
            "pool_size": 6,
            "state": "stopped",
            "hosts": ["n0"],
            "pods": [beat(0, 1000, "done"), beat(1, 400, "stopped")],
        },
    )
    heartbeat.write_aggregate(
        rd,
        1,
        {
            "job": "51",
            "pool_size": 6,
            "state": "running",
            "hosts": ["n1"],
            "pods": [beat(2, 500, "running"), beat(3, 600, "running")],
        },
    )
    heartbeat.write_aggregate(
        rd,
        2,
        {
            "job": "52",
            "pool_size": 6,
            "state": "running",
            "hosts": ["n2"],
            "pods": [beat(4, 500, "running"), beat(5, 600, "running")],
        },
    )
    rd.part_aggregate(2).unlink()  # part 2 has not written one yet
    rd.summary.write_text(json_.dumps({"complete": False, "pods": 6}))
    asked = []

    def slurm(jobs):
        asked.append(list(jobs))
        return {
            "50": SlurmJobState("COMPLETED"),
            "51": SlurmJobState("RUNNING", nodes="n1"),
            "52": SlurmJobState("RUNNING", nodes="n[7-8]"),
        }

    m = Monitor(run)
    text = render(run, monitor=m, slurm=slurm)
    assert "  part 0: job 50 STOPPED, hosts n0, pods 0 running / 1 done / 1 stopped / 0 missing" in text, text
    assert "  part 1: job 51 RUNNING, hosts n1, pods 2 running / 0 done / 0 stopped / 0 missing" in text, text
    assert "  part 2: no record yet (job 52 RUNNING on nodes n[7-8])" in text, text
    assert "stopped early" not in text.splitlines()[0] and "running" in text.splitlines()[0]
    assert not m.trackers or all(t.rank in (4, 5) for t in m.trackers.values())  # part 2: its logs, unreadable
    assert asked == [["50", "51", "52"]]
