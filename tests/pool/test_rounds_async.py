"""The pool without lock-step, under a real mpiexec: no collective per update, a
signal to one rank ends the job cleanly, asynchronous pods never wait for a straggler."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import mpiexec_or_skip, rank_pids

from podracer_hpc.files import safeio
from podracer_hpc.files.h5log import read_log
from podracer_hpc.files.records import read_records

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.mpi
BASE = [
    "agent.rollout_steps=16",
    "eval.episodes=4",
    "threads=1",
    "log.progress_interval_s=0",
    "agent.hidden_sizes=[16, 16]",
]


def env(**extra: str) -> dict:
    e = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    e.pop("PODRACER_COMM", None)
    return e


def cmd(n: int, run: Path, *sets: str) -> list[str]:
    return [
        mpiexec_or_skip(),
        "-n",
        str(n),
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(run),
        "--quiet",
        *sum((["--set", s] for s in (*BASE, *sets)), []),
    ]


def ckpt_meta(run: Path, rank: int) -> dict:
    return safeio.load(run / "checkpoints" / f"rank{rank}.safetensors", "pod-state")[1]


def test_no_collective_on_the_per_update_path(tmp_path):
    """2 ranks, 2 collective rounds: twice the updates between rounds must not add one collective.
    (Two ranks show the property as well as more: the counts are per rank and per kind.)"""
    counts = {}
    for num_envs in (64, 32):  # 1,024 or 512 env steps an update: 16 or 32 updates, the same 2 rounds
        run = tmp_path / f"e{num_envs}"
        r = subprocess.run(
            cmd(
                2,
                run,
                f"env.num_envs={num_envs}",
                "total_env_steps=16384",
                "tournament.interval_env_steps=8192",
                "eval.interval_env_steps=8192",
            ),
            cwd=REPO,
            env=env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr
        metas = [ckpt_meta(run, k) for k in range(2)]
        assert {m["updates"] for m in metas} == {16384 // (16 * num_envs)} and {m["round"] for m in metas} == {2}
        counts[num_envs] = [m["collectives"] for m in metas]
    assert counts[64] == counts[32], counts  # per rank and per kind: independent of the number of updates
    assert sum(counts[64][0].values()) <= 16, counts  # start-up, 2 rounds (a meeting, listing, publish, barrier)


@pytest.mark.parametrize("sync", ["collective", "async"])
def test_a_signal_to_one_rank_only_ends_the_job_cleanly(tmp_path, sync):
    """A user's kill -USR2 of ONE pid: that rank tells the others, every rank checkpoints, exit 75
    (bounded: no rank waits forever in a round); the same command then finishes the run."""
    run = tmp_path / "r"
    sets = (
        "env.num_envs=64",
        "total_env_steps=40960",
        "tournament.interval_env_steps=4096",
        "eval.interval_env_steps=4096",
        f"tournament.sync={sync}",
    )
    p = subprocess.Popen(
        cmd(3, run, *sets),
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:

        def started() -> bool:
            try:
                return all(
                    len(read_log(run / "logs" / f"quickstart_rank{k}.h5")["train"]["update"]) >= 3 for k in range(3)
                )
            except Exception:  # noqa: BLE001  (not there yet, or a read racing a flush)
                return p.poll() is not None

        deadline = time.monotonic() + 300
        while not started():
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.2)
        assert p.poll() is None, p.communicate()[1]
        ranks = rank_pids(run)
        assert len(ranks) == 3
        os.kill(ranks[1], signal.SIGUSR2)  # one rank only
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 75, err
    assert "stopped by signal SIGUSR2" in err and err.count("stopped by another rank's stop") == 2, err
    metas = [ckpt_meta(run, k) for k in range(3)]
    assert all(m["updates"] >= 3 for m in metas)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["complete"] is False
    r = subprocess.run(cmd(3, run, *sets), cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for k in range(3):
        log = read_log(run / "logs" / f"quickstart_rank{k}.h5")
        assert list(log["train"]["update"]) == list(range(1, 41))
        rounds = [x.round for x in read_records(log["tournament"]) if x.round >= 0]
        assert rounds == list(range(len(rounds))) and len(rounds) == 10
        steps = list(log["eval"]["env_steps"])
        assert steps == sorted(set(steps))


def test_async_pods_never_wait_for_a_straggler(tmp_path):
    """Rank 2 runs 4x slower: the two fast pods hold every round without it and finish their
    training long before it; in collective mode they would wait at each round."""
    run = tmp_path / "r"
    r = subprocess.run(
        cmd(
            3,
            run,
            "env.num_envs=64",
            "total_env_steps=24576",
            "tournament.interval_env_steps=4096",
            "eval.interval_env_steps=4096",
            "tournament.sync=async",
        ),
        cwd=REPO,
        env=env(PODRACER_INJECT_SLOW="2:4"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    logs = [read_log(run / "logs" / f"quickstart_rank{k}.h5") for k in range(3)]
    ends = [float(g["train"]["wall_s"][-1]) for g in logs]
    assert max(ends[:2]) < 0.6 * ends[2], ends  # the fast pods did not move at the straggler's pace
    for g in logs[:2]:
        recs = [x for x in read_records(g["tournament"]) if x.round >= 0]
        assert len(recs) == 6
        # the fast pods' rounds happened while the straggler was still early in its training
        assert recs[-1].wall_s < 0.6 * ends[2]


def test_an_async_pod_resumes_exactly(tmp_path):
    """One pod in async rounds: 2N updates == N, stop, N more (its own state is exact)."""
    sets = (
        "env.num_envs=32",
        "total_env_steps=8192",
        "tournament.interval_env_steps=2048",
        "eval.interval_env_steps=2048",
        "tournament.sync=async",
        "tournament.mode=pbt",
    )
    a, b = tmp_path / "a", tmp_path / "b"
    assert subprocess.run(cmd(1, a, *sets), cwd=REPO, env=env(), capture_output=True, timeout=600).returncode == 0
    r = subprocess.run(
        [*cmd(1, b, *sets), "--stop-after-updates", "7"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 75, r.stderr
    assert subprocess.run(cmd(1, b, *sets), cwd=REPO, env=env(), capture_output=True, timeout=600).returncode == 0
    ta, ma, _ = safeio.load(a / "checkpoints" / "rank0.safetensors", "pod-state")
    tb, mb, _ = safeio.load(b / "checkpoints" / "rank0.safetensors", "pod-state")
    assert ma["updates"] == mb["updates"] == 16
    assert all(bool((ta[k] == tb[k]).all()) for k in ta), [k for k in ta if not bool((ta[k] == tb[k]).all())]


def test_async_pbt_pods_copy_from_a_bounded_sample_of_the_population(tmp_path):
    """Async PBT: each pod's latest agent is in the population (its newest 2 kept), the
    leaderboard keeps only the top K, and a pod reads at most ``population_sample`` others' sidecars a
    round; copies come from population entries and are loaded whole."""
    run = tmp_path / "r"
    r = subprocess.run(
        cmd(
            4,
            run,
            "env.num_envs=32",
            "total_env_steps=12288",
            "tournament.interval_env_steps=2048",
            "eval.interval_env_steps=2048",
            "tournament.sync=async",
            "tournament.mode=pbt",
            "tournament.top_k=2",
            "tournament.population_sample=2",
            "tournament.ready_rounds=0",
            "tournament.quantile=0.5",
        ),
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    pop = run / "leaderboard" / "population"
    assert json.loads((pop / "layout.json").read_text())["buckets"] == 1
    sidecars = [p.name for p in pop.rglob("*.json") if p.name != "layout.json"]
    per_pod: dict[str, int] = {}
    for name in sidecars:
        per_pod[name.split("-")[1]] = per_pod.get(name.split("-")[1], 0) + 1
    assert per_pod == {"0": 2, "1": 2, "2": 2, "3": 2}, sidecars
    assert len(list((run / "leaderboard" / "entries").glob("*.json"))) <= 2
    copies = []
    for k in range(4):
        recs = [
            x for x in read_records(read_log(run / "logs" / f"quickstart_rank{k}.h5")["tournament"]) if x.round >= 0
        ]
        assert [x.round for x in recs] == list(range(6))
        copies += [x for x in recs if x.action == "copy_pod"]
    assert copies, "no pod copied another in 24 rounds with half the sample below it"
    assert all(x.source.kind == "entry" and x.source.pod is not None and not x.source.rejected for x in copies)


def test_a_time_floor_spaces_collective_rounds_on_the_interval_grid(tmp_path):
    """``tournament.min_interval_s``: rounds wait whole intervals until the floor has passed
    at the pods' speed, both pods hold the same rounds at the same env steps, and with rounds that no
    longer checkpoint each (auto: due) the run still ends complete."""
    run = tmp_path / "r"
    interval = 512  # 32 envs x 16 steps = 1 update
    r = subprocess.run(
        cmd(
            2,
            run,
            "env.num_envs=32",
            "total_env_steps=24576",
            f"tournament.interval_env_steps={interval}",
            "eval.interval_env_steps=0",
            "tournament.min_interval_s=1.0",
        ),
        cwd=REPO,
        env=env(PODRACER_INJECT_SLOW="0:3,1:3"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    recs = [
        [x for x in read_records(read_log(run / "logs" / f"quickstart_rank{k}.h5")["tournament"]) if x.round >= 0]
        for k in range(2)
    ]
    steps = [[x.env_steps for x in rr] for rr in recs]
    assert steps[0] == steps[1] and all(s % interval == 0 for s in steps[0]), steps
    assert 3 <= len(steps[0]) < 24576 // interval - 8, steps  # fewer rounds than intervals (how many: the speed)
    gaps = [b.wall_s - a.wall_s for a, b in zip(recs[0], recs[0][1:])]
    # ~1 s apart (a second at the speed of the interval before); the first wish comes from the speed
    # since the start, start-up included, so the first gap may be shorter
    assert min(gaps[1:]) > 0.5, gaps
