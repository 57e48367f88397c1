"""Which ended jobs are retried and which nodes are excluded (launch/retry.py's pure verdicts on
real sacct and srun text), the retry rows (files/retries.py), srun's and sacct's text
(cluster/jobstate.py), and --retries refused before anything is queued. The retries themselves run
on the local Slurm cluster: tests/slurm/test_retries.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from podracer_hpc.cluster.jobstate import JobEnd
from podracer_hpc.files.retries import append_retry, read_retries, retries_of
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.launch.retry import Verdict, judge, silent_nodes

REPO = Path(__file__).resolve().parents[2]
UID = 1000
SRUN_KILLED = """podracer: MPIR_CVAR_CH4_NETMOD=ofi
srun: error: n1: task 0: Killed
srun: launch/slurm: _step_signal: Terminating StepId=2111003.0
srun: error: n2: tasks 1-3: Terminated
"""


def test_a_crash_is_retried_without_the_node_srun_names():
    v = judge(JobEnd("FAILED", None, "137:0", "n[1-2]"), None, SRUN_KILLED, None, UID)
    assert v.retry and v.nodes == ["n1"] and v.reason.startswith("failed, exit code 137:0") and "n1" in v.reason


def test_a_crash_srun_did_not_name_excludes_the_jobs_nodes():
    assert judge(JobEnd("FAILED", None, "1:0", "n3"), None, "", None, UID).nodes == ["n3"]
    assert judge(JobEnd("NODE_FAIL", None, "", "n5"), None, "", None, UID) == Verdict(True, "node failure", ["n5"])


def test_a_hang_excludes_the_hung_ranks_node_not_the_one_that_noticed():
    hang = {"job": "7", "hung": [{"pod": 3, "host": "vm", "node": "n2"}, {"pod": 4, "host": "n4"}]}
    log = "srun: error: n1: task 0: Exited with exit code 76\n"
    v = judge(JobEnd("FAILED", None, "76:0", "n[1-4]"), hang, log, None, UID)
    assert v.retry and v.nodes == ["n2", "n4"] and v.reason.startswith("hung (exit 76)")


def test_preemption_and_time_limit_are_retried_on_any_node():
    for state in ("PREEMPTED", "TIMEOUT"):
        v = judge(JobEnd(state, None, "0:0", "n1"), None, "", None, UID)
        assert v.retry and v.nodes == [], state


def test_a_cancel_is_retried_only_when_someone_else_made_it():
    assert judge(JobEnd("CANCELLED", UID, "0:15", "n1"), None, "", None, UID) == Verdict(
        False, f"cancelled by you (uid {UID})"
    )
    assert not judge(JobEnd("CANCELLED", None, "0:15", "n1"), None, "", None, UID).retry  # no accounting: yours
    v = judge(JobEnd("CANCELLED", 0, "0:15", "n1"), None, "", None, UID)
    assert v.retry and v.nodes == [] and "uid 0" in v.reason
    own = Verdict(True, "hung: every pod silent", ["n2"])
    assert judge(JobEnd("CANCELLED", UID, "0:15", "n2"), None, "", own, UID) is own  # the watcher's own cancel


def test_a_job_that_completed_or_is_unknown_is_not_retried():
    assert not judge(JobEnd("COMPLETED", None, "0:0", "n1"), None, "", None, UID).retry
    assert not judge(None, None, "", None, UID).retry


def test_a_part_is_silent_only_when_every_pod_of_this_job_is():
    now = time.time()
    beats = {0: {"job": "9", "t": now - 60, "node": "n1"}, 1: {"job": "9", "t": now - 50, "host": "n2"}}
    assert silent_nodes(beats, range(2), "9", 30, now) == ["n1", "n2"]
    assert silent_nodes(beats, range(2), "9", 55, now) is None  # pod 1 beat 50 s ago
    assert silent_nodes(beats, range(2), "10", 30, now) is None  # the beats are an earlier job's
    assert silent_nodes({0: beats[0]}, range(2), "9", 30, now) is None  # pod 1 has not beaten yet


def test_retry_rows_are_appended_whole_and_a_torn_line_is_skipped(tmp_path):
    rd = RunDir(tmp_path)
    append_retry(rd, 1, "12_1", "15", "failed", ["n2", "n1"], 1)
    append_retry(rd, 0, "12_0", "16", "hung", [], 1)
    with open(rd.retries_file, "a") as f:
        f.write('{"part": 1, "old_')
    rows = read_retries(rd)
    assert [(r["part"], r["new_job"], r["excluded"]) for r in rows] == [(1, "15", ["n1", "n2"]), (0, "16", [])]
    assert [r["old_job"] for r in retries_of(rows, 1)] == ["12_1"]
    assert read_retries(RunDir(tmp_path / "none")) == []


def _submit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "submit", "jobs/quickstart.yaml", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_retries_refused_before_anything_is_queued(tmp_path):
    run = tmp_path / "run"
    for args, says in (
        (("--retries", "2"), "--retries needs --wait"),
        (("--retries", "-1", "--wait"), "--retries -1: give the number of retries"),
        (("--retries", "1", "--wait", "--executor", "local"), "--retries resubmits Slurm jobs"),
        (("--wait", "--poll-slurm", "0"), "--poll-slurm 0: give 1 second or more"),
    ):
        r = _submit(*args, "--run-dir", str(run))
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert not run.exists(), args


def test_resume_without_a_recorded_pool_says_what_to_do(tmp_path):
    (tmp_path / "pool.json").write_text(json.dumps({"jobs": 2, "pods_per_job": 1, "parts": {}}))
    for args, says in (((), "records no request"), (("--retries", "-2"), "give K >= 0")):
        r = subprocess.run(
            [sys.executable, "-m", "podracer_hpc.cli", "resume", str(tmp_path), *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
