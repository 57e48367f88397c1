"""A pool of several jobs (podracer submit --pods-per-job): one run directory and leaderboard, each
job its own MPI world and failure domain, a summary assembled from the pods' records.

The fault test runs a real pool of 2 local jobs (2 pods each, real mpiexec worlds behind the
signal relay), kills one job hard mid-run, and checks that the other finishes untouched and the
same submit command starts only the killed part, which resumes and rejoins (every update and
round logged once). The Slurm tier has the same test on the local cluster (tests/slurm/).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, mpiexec_or_skip, run_cli, wait_for

from podracer_hpc.files.rundir import PoolPart, RunDir
from podracer_hpc.files.summary import assemble, describe_missing, read_records, write_record
from podracer_hpc.launch import LaunchError, Request, pooljobs, validate

SMALL = (
    "total_env_steps=40960",
    "tournament.interval_env_steps=8192",
    "eval.interval_env_steps=8192",
    "tournament.sync=async",
    "eval.final_episodes=20",
    "log.progress_interval_s=0",
)


# --- the pieces -------------------------------------------------------------------------------
@pytest.mark.parametrize("text, part", [("0/1", PoolPart(0, 1)), ("3/4", PoolPart(3, 4)), (" 1 / 2", PoolPart(1, 2))])
def test_pool_part_parses(text, part):
    assert PoolPart.parse(text) == part


@pytest.mark.parametrize("text", ["1", "4/4", "a/2", "-1/2", "0/0", ""])
def test_pool_part_refuses_what_is_not_a_part(text):
    with pytest.raises(ValueError, match="--pool-part"):
        PoolPart.parse(text)


def test_pool_part_auto_is_the_array_task():
    env = {
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_ARRAY_TASK_COUNT": "4",
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_MAX": "3",
    }
    assert PoolPart.parse("auto", env) == PoolPart(2, 4)
    with pytest.raises(ValueError, match="not an array task"):
        PoolPart.parse("auto", {})
    with pytest.raises(ValueError, match="--array=0-3"):
        PoolPart.parse("auto", {**env, "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "4"})


def test_pool_part_maps_ranks_to_pool_indices_and_names_the_pool_once(tmp_path):
    part = PoolPart(2, 4)
    assert [part.pod(r, 3) for r in range(3)] == [6, 7, 8] and part.pods(3) == range(6, 9)
    assert PoolPart().identity(tmp_path, "123") == "123"  # one job: its id, as before
    ids = {PoolPart(g, 4).identity(tmp_path, f"9{g}") for g in range(4)}
    assert len(ids) == 1 and ids != {"90"}  # every part the same name, whatever its job id
    assert PoolPart(0, 4).identity(tmp_path / "other", "90") not in ids


def _rec(state: str, best: float, **kw) -> dict:
    return {
        "state": state,
        "algo": "ppo",
        "env_steps": 100,
        "best": best,
        "final": best,
        "wall_s": 2.0,
        "run_steps": 100,
        "run_wall": 1.0,
        "rounds": 3,
        "job": kw.pop("job", "1"),
        **kw,
    }


def test_summary_from_records_is_complete_only_when_every_pod_is_done(tmp_path):
    rd = RunDir(tmp_path)
    for i, (state, best) in enumerate([("done", -5.0), ("done", -1.0), ("stopped", -9.0)]):
        write_record(rd, i, _rec(state, best, job=f"j{i // 2}"))
    recs = read_records(rd, range(4))
    assert sorted(recs) == [0, 1, 2]
    s = assemble(recs, 4, task="pendulum", revision="r", tournament=True)
    assert s["complete"] is False and s["pods_missing"] == [3] and s["pods_stopped"] == [2] and s["pods_done"] == 2
    assert s["best_pod"] == 1 and s["best_return"] == -1.0 and s["env_steps"] == 300 and s["jobs"] == ["j0", "j1"]
    assert "pod(s) 3" in describe_missing(s) and "pod(s) 2 stopped" in describe_missing(s)
    write_record(rd, 2, _rec("done", -9.0))
    write_record(rd, 3, _rec("done", float("nan")))  # NaN is written as null and read back as missing
    s = assemble(read_records(rd, range(4)), 4, task="pendulum", revision="r", tournament=True)
    assert s.get("complete", True) and "pods_missing" not in s and s["pods"] == 4 and s["rounds"] == 3
    assert json.loads(rd.pod_record(3).read_text())["best"] is None


def test_summary_verdict_is_the_best_pod_on_the_common_final_set(tmp_path):
    recs = {
        0: _rec("done", -1.0, verdict=[-7.0, 0.5, [-8.0, -6.0]]),
        1: _rec("done", -3.0, verdict=[-2.0, 0.4, [-2.8, -1.2]]),
    }
    s = assemble(recs, 2, task="t", revision="r", tournament=True, final_episodes=20, final_eval_seed=5)
    assert s["best_pod"] == 1 and s["best_return"] == -2.0 and s["peak_return"] == -1.0 and s["final_eval_seed"] == 5
    s = assemble({0: recs[0]}, 2, task="t", revision="r", tournament=True, final_episodes=20)
    assert "final_episodes" not in s and s["best_pod"] == 0  # a pod missing: no verdict yet


@pytest.mark.parametrize(
    "reached,target_end,want",
    [
        ([300, 200, None], True, {"env_steps": 200, "pods": [1]}),
        ([200, 200, None], True, {"env_steps": 200, "pods": [0, 1]}),
        ([300, 200, None], False, None),  # reached, but the budget ended the run (no target set now)
        ([None, None, None], False, None),
    ],
)
def test_a_run_ended_by_its_target_says_where_and_by_whom(reached, target_end, want):
    recs = {i: _rec("done", -1.0, reached=r, target_end=target_end) for i, r in enumerate(reached)}
    s = assemble(recs, 3, task="t", revision="r", tournament=False)
    assert s.get("ended_at_target") == want and s.get("complete", True)


def test_a_record_must_say_how_the_pod_ended(tmp_path):
    with pytest.raises(ValueError, match="state"):
        write_record(RunDir(tmp_path), 0, _rec("running", 1.0))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(tasks_per_node=4, pods_per_job=3), "do not split into jobs of 3"),
        (dict(tasks_per_node=4, pods_per_job=2, array=[0, 1]), "use one or the other"),
        (dict(executor="slurm", nodes=2, tasks_per_node=2, pods_per_job=1, mpi="pmi2"), "whole nodes"),
    ],
)
def test_submit_refuses_a_pool_that_does_not_split(kw, message):
    with pytest.raises(LaunchError, match=message):
        validate(Request(job_file=str(REPO / "jobs/quickstart.yaml"), **kw), dry_run=True)


def test_request_splits_the_pool_into_jobs_of_whole_nodes():
    r = Request(job_file="x", nodes=8, tasks_per_node=4, pods_per_job=8)
    assert (r.ranks, r.jobs, r.job_ranks, r.job_nodes) == (32, 4, 8, 2)
    assert Request(job_file="x", nodes=2, tasks_per_node=4).jobs == 1


def test_dry_run_shows_each_job_of_a_local_pool_and_a_slurm_pool_as_an_array(tmp_path):
    r = run_cli(
        "submit",
        "jobs/quickstart.yaml",
        "--executor",
        "local",
        "--tasks-per-node",
        "4",
        "--pods-per-job",
        "2",
        "--run-dir",
        str(tmp_path / "p"),
        "--dry-run",
    )
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("# podracer mpirun")]
    assert len(lines) == 2 and all("-n 2 " in ln for ln in lines)
    assert "--pool-part 0/2" in lines[0] and "--pool-part 1/2" in lines[1]
    r = run_cli(
        "submit",
        "jobs/quickstart.yaml",
        "--executor",
        "slurm",
        "--nodes",
        "4",
        "--tasks-per-node",
        "2",
        "--pods-per-job",
        "4",
        "--mpi",
        "pmi2",
        "--run-dir",
        str(tmp_path / "q"),
        "--dry-run",
    )
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --array=0-1" in r.stdout and "#SBATCH --nodes=2\n" in r.stdout  # 2 jobs of 2 nodes
    assert "2 jobs of 4" in r.stdout


def test_train_refuses_a_bad_pool_part(tmp_path):
    r = run_cli("train", "jobs/quickstart.yaml", "--run-dir", str(tmp_path), "--pool-part", "2/2")
    assert r.returncode == 2 and "--pool-part" in r.stderr and "Traceback" not in r.stderr


def test_plan_starts_only_parts_neither_done_nor_running(tmp_path):
    rd = RunDir(tmp_path)
    assert pooljobs.plan(rd, 3, 2).start == [0, 1, 2]  # a new pool: every part
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        pooljobs.record(
            rd, 3, 2, {0: pooljobs.local_job(1), 1: pooljobs.local_job(sleeper.pid), 2: pooljobs.local_job(dead.pid)}
        )
        for i in (0, 1):
            write_record(rd, i, _rec("done", 0.0))
        p = pooljobs.plan(rd, 3, 2)
        assert p.start == [2], p  # part 0 done, part 1 still running (its pid lives), part 2's job is gone
        assert any("part 0" in n and "done" in n for n in p.notes)
        assert any("part 1" in n and str(sleeper.pid) in n for n in p.notes)
        with pytest.raises(LaunchError, match="holds a pool of 3 jobs x 2 pods"):
            pooljobs.plan(rd, 2, 3)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert pooljobs.plan(rd, 3, 2).start == [1, 2]  # its job ended before its pods were done


def test_a_part_whose_pid_was_reused_by_another_process_is_started_again(tmp_path):
    """pool.json names a part's relay by pid and start time: a later process with the same pid is not it."""
    rd = RunDir(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        job = pooljobs.local_job(other.pid)
        assert job["start"]
        pooljobs.record(rd, 2, 1, {0: job, 1: {**job, "start": job["start"] + "0"}})  # part 1: its pid reused
        assert pooljobs.plan(rd, 2, 1).start == [1]
    finally:
        other.kill()
        other.wait()


# --- a real pool of 2 local jobs: one killed hard, the other untouched, the same command rejoins -----
def _read_log(path: Path) -> dict:
    from podracer_hpc.files.h5log import read_log

    return read_log(path)


def _part_pids(run_dir: Path, part: str) -> list[int]:
    """Every live process of one part of a local pool (its command line names the run dir and the part)."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
            alive = p.name.isdigit() and pooljobs._running(int(p.name))
        except OSError:
            continue
        if alive and str(run_dir).encode() in cmd and part.encode() in cmd and b"--pool-part" in cmd:
            out.append(int(p.name))
    return out


def _rounds(path: Path) -> int:
    try:
        return len([r for r in _read_log(path)["tournament"]["round"] if r >= 0])
    except Exception:  # noqa: BLE001  (a read can race the writer's flush: try again)
        return 0


@pytest.mark.mpi
def test_a_pool_of_two_jobs_survives_one_killed_hard(tmp_path):
    mpiexec_or_skip()
    d = tmp_path / "pool"
    sets = sum((["--set", s] for s in SMALL), [])
    cmd = (
        "submit",
        "jobs/quickstart.yaml",
        "--executor",
        "local",
        "--tasks-per-node",
        "4",
        "--pods-per-job",
        "2",
        "--run-dir",
        str(d),
        *sets,
    )
    # part 1's pods (2, 3) take 6x as long per update (a sleep: the results are the same), so the kill lands mid-run
    slow = {**os.environ, "PODRACER_INJECT_SLOW": "2:6,3:6"}
    r = run_cli(*cmd, env=slow)
    assert r.returncode == 0, r.stderr
    parts = json.loads(RunDir(d).pool_file.read_text())["parts"]
    pid0 = int(parts["0"]["pid"])
    wait_for(lambda: _rounds(d / "logs" / "quickstart_rank3.h5") >= 2, 240, "part 1's second round")
    for pid in _part_pids(d, "1/2"):  # the whole job at once, as a node failure: relay, mpiexec, proxies, ranks
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _part_pids(d, "1/2"), 60, "part 1's processes to die")
    wait_for(lambda: not pooljobs._running(pid0), 300, "part 0 to finish")
    rd = RunDir(d)
    recs = read_records(rd, range(4))
    assert [recs[i]["state"] for i in (0, 1)] == ["done", "done"] and 2 not in recs and 3 not in recs
    summary = json.loads(rd.summary.read_text())  # part 0's end: the pool so far, the dead pods named
    assert summary["complete"] is False and summary["pods_missing"] == [2, 3] and summary["pods"] == 4
    part0 = rd.part_launch_log(0).read_text()
    assert part0.count("$ ") == 1 and "resuming" not in part0  # started once, never stopped
    # the same command again: only part 1 starts, resumes from its checkpoints, and ends the pool
    r = run_cli(*cmd, "--wait", timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "part 0 (pods 0-1): done" in r.stderr and "1 of the pool's 2 jobs" in r.stderr
    part1 = rd.part_launch_log(1).read_text()
    assert part1.count("$ ") == 2 and "resuming from" in part1
    final = json.loads(r.stdout.strip().splitlines()[-1])
    assert final.get("complete", True) and final["pods"] == 4 and "pods_missing" not in final
    assert final["env_steps"] == 4 * 40960 and final["final_episodes"] == 20
    for pod in range(4):  # every update and every round logged once, in order
        log = _read_log(d / "logs" / f"quickstart_rank{pod}.h5")
        u = list(log["train"]["update"])
        assert u == list(range(1, len(u) + 1)), (pod, u)
        rounds = [x for x in log["tournament"]["round"] if x >= 0]
        assert rounds == list(range(5)), (pod, rounds)
    assert int(_read_log(d / "logs" / "quickstart_rank2.h5")["attrs"]["pool_size"]) == 4
    # nothing left to do: the same command starts nothing
    r = run_cli(*cmd)
    assert r.returncode == 0 and "nothing to start" in r.stderr, r.stderr
