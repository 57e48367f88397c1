"""The launcher without a cluster: requests refused before queueing, the generated sbatch text."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podracer_hpc import launch
from podracer_hpc.config import load_config

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"


@pytest.mark.parametrize(
    "spec,ids,par",
    [
        ("3", [0, 1, 2], 0),
        ("0-4%2", [0, 1, 2, 3, 4], 2),
        ("1,3,5", [1, 3, 5], 0),
        ("2-3,7%1", [2, 3, 7], 1),
    ],
)
def test_parse_array(spec, ids, par):
    assert launch.parse_array(spec) == (ids, par)


@pytest.mark.parametrize("spec", ["", "a", "3-1", "1,,x", "%2", "0-3%0"])
def test_parse_array_rejects(spec):
    with pytest.raises(launch.LaunchError, match="--array"):
        launch.parse_array(spec)


def req(**kw):
    base = dict(job_file="jobs/quickstart.yaml", overrides=[], executor="local")
    return launch.Request(**{**base, **kw})


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"nodes": 0}, "--nodes must be >= 1"),
        ({"tasks_per_node": 0}, "--tasks-per-node must be >= 1"),
        ({"tasks_per_node": 4, "gpus_per_node": 2}, "a pod is one rank on one GPU"),
        ({"time_min": 0}, "--time must be >= 1"),
        ({"nodes": 2}, "runs on this machine"),
        ({"job_file": "jobs/nope.yaml"}, "not found"),
        ({"mpi": "ucx"}, "--mpi must be"),
    ],
)
def test_impossible_requests_fail_before_anything_runs(kw, msg):
    with pytest.raises(launch.LaunchError, match=msg):
        launch.validate(req(**kw))


@pytest.mark.parametrize(
    "given, minutes", [("90", 90), ("12:00:00", 720), ("2-00:00:00", 2880), ("1-6", 1800), ("45:30", 45)]
)
def test_time_takes_minutes_or_slurms_syntax(given, minutes):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "submit",
            "jobs/quickstart.yaml",
            "--executor",
            "slurm",
            "--mpi",
            "pmi2",
            "--time",
            given,
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PATH": "/nonexistent"},
    )
    assert r.returncode == 0, r.stderr
    assert f"#SBATCH --time={minutes}\n" in r.stdout


@pytest.mark.parametrize("given", ["infinite", "1h", "-5", ""])
def test_time_refuses_what_slurm_would_not_take_or_never_ends(given):
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "submit", "jobs/quickstart.yaml", "--time", given, "--dry-run"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 2 and "--time" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_run_dir_that_cannot_be_made_is_refused_also_by_dry_run(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    for d, msg in ((f, "a file stands there"), (f / "run", "is a file, not a directory")):
        with pytest.raises(launch.LaunchError, match=msg):
            launch.validate(req(run_dir=str(d)), dry_run=True)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root writes anywhere: the check cannot fail here
            pytest.skip("running as root: a read-only directory is writable")
        with pytest.raises(launch.LaunchError, match="no permission"):
            launch.validate(req(run_dir=str(ro / "run")), dry_run=True)
    finally:
        ro.chmod(0o700)


def test_array_ids_other_than_0_to_n_minus_1_are_one_job_each_and_take_no_throttle(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no Slurm here: --dry-run shows the script
    text = launch.sbatch_text(req(executor="slurm", mpi="pmi2", array=[1, 3, 5]), load_config("jobs/quickstart.yaml"))
    assert "--array" not in text  # not an array: Slurm's index would be 0..2 for tasks 1, 3, 5
    assert "#SBATCH --array=0-2" in launch.sbatch_text(
        req(executor="slurm", mpi="pmi2", array=[0, 1, 2]), load_config("jobs/quickstart.yaml")
    )
    with pytest.raises(launch.LaunchError, match="throttle cannot hold"):
        launch.validate(req(executor="slurm", mpi="pmi2", array=[1, 3], array_parallelism=1), dry_run=True)


def test_bad_config_fails_before_anything_runs():
    with pytest.raises(launch.ConfigError, match="unknown config key 'agent.lr'"):
        launch.validate(req(overrides=["agent.lr=1"]))


def test_slurm_without_sbatch_says_so(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(launch.LaunchError, match="no sbatch here"):
        launch.validate(req(executor="slurm"))


def test_array_tasks_get_own_dirs_seeds_and_a_shared_leaderboard(tmp_path):
    r = req(array=[0, 2], run_dir=str(tmp_path / "sweep"))
    cfg = load_config(r.job_file)
    sets, d = launch.task_overrides(r, cfg, 2)
    assert d == tmp_path / "sweep" / "task2"
    assert "seed=2000" in sets and f"tournament.leaderboard_dir={tmp_path / 'sweep' / 'leaderboard'}" in sets
    r.shared_leaderboard = False
    sets, _ = launch.task_overrides(r, cfg, 2)
    assert not any(s.startswith("tournament.leaderboard_dir") for s in sets)


def normalize_sbatch(text: str) -> str:
    """The machine- and code-specific parts of a generated script: the interpreter, the snapshot
    id (a digest of the code) and the git revision."""
    text = text.replace(sys.executable, "PYTHON")
    text = re.sub(r"/code/[0-9a-f]{12}", "/code/SNAPSHOT", text)
    return re.sub(r"(PODRACER_GIT_REVISION=|revision )[^\s)]+", r"\1REV", text)


GOLDEN_CASES = {
    "submit_2x2": dict(nodes=2, tasks_per_node=2, time_min=10, mpi="pmi2"),
    "submit_dgx_array": dict(
        nodes=4,
        tasks_per_node=8,
        gpus_per_node=8,
        partition="batch",
        account="rl",
        time_min=240,
        array=[0, 1, 2],
        array_parallelism=2,
    ),
    # Every resource option, the pass-through, the HDF5 and cache settings, no snapshot
    # a DGX H100 (2 x 56 cores): 8 pods x 14 cores fit with --hint=nomultithread (16 would not); typed GPUs
    "submit_dgx_resources": dict(
        nodes=4,
        tasks_per_node=8,
        gpus_per_node=8,
        gpu_type="h100",
        cpus_per_task=14,
        mem="0",
        exclusive=True,
        qos="normal",
        constraint="h100",
        job_name="pbt-h100",
        mail_type="end,fail",
        mail_user="me@example.org",
        dependency="afterok:4242",
        sbatch=["reservation=dgx-maint", "hint=nomultithread", "--wckey=rl-team"],
        partition="batch",
        account="rl",
        time_min=240,
        hdf5_locking="false",
        cache_dir="/raid/podracer-cache",
    ),
    "submit_cpu_unbound": dict(
        nodes=1, tasks_per_node=2, cpus_per_task=4, gpus_per_node=2, gpu_bind="none", snapshot=False, mpi="pmi2"
    ),
    # The ranks in a container (pyxis on srun; charliecloud's ch-run as the rank's python), srun extras
    "submit_container_pyxis": dict(
        nodes=2,
        tasks_per_node=8,
        gpus_per_node=8,
        time_min=120,
        container_image="/lustre/images/podracer.sqsh",
        container_mounts="/lustre/data:/data",
        srun=["cpu-bind=cores", "network=single_node_vni"],
    ),
    "submit_container_charliecloud": dict(
        nodes=1, tasks_per_node=2, mpi="pmi2", container_image="/scratch/img/podracer", container_runtime="charliecloud"
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_generated_sbatch_matches_golden(name):
    """submitit's sbatch text for a request, with the machine-specific paths replaced."""
    r = req(executor="slurm", run_dir="/scratch/runs/qs", **GOLDEN_CASES[name])
    cfg = load_config(r.job_file)
    text = normalize_sbatch(launch.sbatch_text(r, cfg))
    golden = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), f"regenerate with UPDATE_GOLDEN=1 if the change is intended:\n{text}"


def test_no_wckey_unless_asked():
    r = req(executor="slurm", run_dir="/scratch/runs/qs")
    assert "wckey" not in launch.sbatch_text(r, load_config(r.job_file))


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"sbatch": ["cpus-per-task=4"]}, "use podracer submit --cpus-per-task instead"),
        ({"sbatch": ["--output=/tmp/x"]}, "set by podracer submit itself"),
        ({"sbatch": ["gpus-per-task=2"]}, "one bound GPU per pod"),
        ({"sbatch": ["r=1"]}, "long sbatch option name"),
        ({"mem": "lots"}, "--mem 'lots'"),
        ({"mail_type": "END,SOMETIMES"}, "SOMETIMES unknown"),
        ({"cpus_per_task": -1}, "--cpus-per-task must be"),
        ({"qos": "two words"}, "no spaces"),
        ({"gpu_bind": "closest"}, "--gpu-bind must be"),
        ({"hdf5_locking": "maybe"}, "--hdf5-locking must be"),
        ({"overrides": ["device=cuda"]}, "--gpus-per-node is 0"),
    ],
)
def test_bad_resource_requests_fail_before_anything_runs(kw, msg, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # nothing may get as far as Slurm
    with pytest.raises(launch.LaunchError, match=re.escape(msg)):
        launch.validate(req(executor="slurm", **kw), dry_run=True)


def test_sbatch_pass_through():
    assert launch.parse_sbatch(["reservation=dgx", "--hint=nomultithread", "requeue_not", "wckey=team"]) == {
        "reservation": "dgx",
        "hint": "nomultithread",
        "requeue-not": True,
        "wckey": "team",
    }


def test_dry_run_needs_no_slurm(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    r = req(executor="slurm", nodes=4, tasks_per_node=8, gpus_per_node=8, cpus_per_task=16, mpi="pmi2")
    cfg = launch.validate(r, dry_run=True)
    assert "no Slurm here" in capsys.readouterr().err
    assert "--cpus-per-task=16 --gpus-per-task=1" in launch.sbatch_text(r, cfg)
    with pytest.raises(launch.LaunchError, match="no sbatch here"):
        launch.validate(r)


def test_pmix_with_the_mpich_wheel_is_refused(monkeypatch):
    from podracer_hpc.launch import slurm

    monkeypatch.setattr(slurm, "pypi_mpich", lambda: "/venv/lib/libmpi.so.12")
    monkeypatch.setattr(slurm, "slurm_here", lambda: True)
    monkeypatch.setattr(slurm, "_check_against_slurm", lambda r: None)
    with pytest.raises(launch.LaunchError, match="--mpi pmi2 with the wheel"):
        launch.validate(req(executor="slurm", mpi="pmix"))
    launch.validate(req(executor="slurm", mpi="pmi2"))


def test_sinfo_checks_cpus_gpus_and_mpi_plugins(monkeypatch):
    from podracer_hpc.launch import slurm

    answers = {"%P": ["debug*"], "%D": ["4"], "%l": ["infinite"], "%c %Z": ["2 1"], "%G": ["gpu:2(S:0)"]}
    monkeypatch.setattr(slurm, "_sinfo", lambda fmt, part="": answers[fmt])
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)  # no srun: plugins not listed
    with pytest.raises(launch.LaunchError, match="= 4 CPUs per node, but a node has 2"):
        slurm._check_against_slurm(req(executor="slurm", tasks_per_node=2, cpus_per_task=2))
    with pytest.raises(launch.LaunchError, match="at most 2 GPUs"):
        slurm._check_against_slurm(req(executor="slurm", tasks_per_node=1, gpus_per_node=4))
    slurm._check_against_slurm(req(executor="slurm", tasks_per_node=2, gpus_per_node=2))
    assert slurm._gres_gpus("gpu:h100:8(S:0-1),nvme:1") == 8 and slurm._gres_gpus("(null)") == 0


def test_local_submit_runs_and_waits(tmp_path, capsys):
    r = req(
        tasks_per_node=2,
        run_dir=str(tmp_path / "run"),
        overrides=["total_env_steps=40960", "tournament.interval_env_steps=20480", "log.progress_interval_s=0"],
    )
    cfg = launch.validate(r)
    launched = launch.submit_local(r, cfg)
    summaries = launch.wait(launched, timeout_s=240, poll_s=0.5)
    assert summaries[0]["pods"] == 2 and summaries[0]["rounds"] == 2
    assert "2 pods" in capsys.readouterr().err


def test_local_failure_names_the_log(tmp_path):
    r = req(tasks_per_node=1, run_dir=str(tmp_path / "run"), overrides=["total_env_steps=4096"])
    cfg = launch.validate(r)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "rank0.safetensors").write_bytes(b"garbage")  # a corrupt resume
    launched = launch.submit_local(r, cfg)
    with pytest.raises(launch.LaunchError, match=r"failed \(exit 2\); see .*launch.log"):
        launch.wait(launched, timeout_s=120, poll_s=0.5)


# ------------------------------------------------------------------------------------------
# The local executor behind the signal relay (podracer_hpc/cluster/mpirun.py), under a
# real mpiexec: USR2 to "the job" stops every rank with a checkpoint, USR2 to mpiexec is no crash.
# ------------------------------------------------------------------------------------------
TINY = [
    "--set",
    "env.num_envs=64",
    "--set",
    "threads=1",
    "--set",
    "eval.episodes=2",
    "--set",
    "log.progress_interval_s=0",
    "--set",
    "eval.interval_env_steps=4096",
]
STEPS_PER_UPDATE = 64 * 16  # num_envs x pendulum's rollout_steps


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _train_rows(run: Path, ranks: int) -> list[list[int]]:
    return _train_rows_of(run, ranks, "pendulum")


def _submit_local(run: Path, *sets: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "submit",
            "jobs/pendulum.yaml",
            "--executor",
            "local",
            "--tasks-per-node",
            "2",
            "--wait",
            "--timeout",
            "240",
            "--run-dir",
            str(run),
            *TINY,
            *sets,
        ],
        stdout=open(out, "w"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.mpi
def test_local_job_usr2_stops_every_rank_with_a_checkpoint_and_resumes(tmp_path):
    from helpers import mpiexec_or_skip

    mpiexec_or_skip()
    run, out = tmp_path / "run", tmp_path / "submit.out"
    proc = _submit_local(run, "--set", "total_env_steps=50000000", out=out)
    try:
        end = time.monotonic() + 120
        relay = None
        while time.monotonic() < end and proc.poll() is None:
            m = re.search(r"local mpiexec run\(s\) \(pid (\d+)", out.read_text())
            relay = relay or (int(m.group(1)) if m else None)
            if relay and all(len(r) >= 2 for r in _train_rows(run, 2)):
                break
            time.sleep(0.5)
        assert relay and all(len(r) >= 2 for r in _train_rows(run, 2)), out.read_text()
        (mpiexec,) = _children(relay)
        os.kill(mpiexec, signal.SIGUSR2)  # what killed the job without a checkpoint (rc 140) before
        time.sleep(3)
        assert _alive(mpiexec) and proc.poll() is None, out.read_text()
        os.kill(relay, signal.SIGUSR2)  # Slurm's habit, sent to "the job"
        assert proc.wait(timeout=120) == 75, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    assert "stopped early (exit 75): every rank checkpointed" in text and "launch.log" in text, text
    assert "SIGUSR2: asking every rank" in (run / "launch.log").read_text()
    for k in range(2):
        assert (run / "checkpoints" / f"rank{k}.safetensors").exists(), k
    stopped = json.loads((run / "summary.json").read_text())
    assert stopped["complete"] is False
    # each pod stopped after a whole update of its own (pods are not in lock-step: they may differ)
    per_pod = [rows[-1] for rows in _train_rows(run, 2)]
    assert sum(per_pod) == stopped["env_steps"], (per_pod, stopped)
    assert all(n % STEPS_PER_UPDATE == 0 and n >= 2 * STEPS_PER_UPDATE for n in per_pod), per_pod

    # the same command resumes (with 3 more updates to do) and completes: exit 0 and the summary
    total = max(per_pod) + 3 * STEPS_PER_UPDATE
    again = _submit_local(run, "--set", f"total_env_steps={total}", out=out)
    try:
        assert again.wait(timeout=240) == 0, out.read_text()
    finally:
        if again.poll() is None:
            again.kill()
    summary = json.loads(out.read_text().strip().splitlines()[-1])
    assert summary["env_steps"] == 2 * total and summary.get("complete", True) is True
    assert "resum" in (run / "launch.log").read_text().lower()
    for k, steps in enumerate(_train_rows(run, 2)):
        assert steps == list(range(STEPS_PER_UPDATE, total + 1, STEPS_PER_UPDATE)), f"rank {k}: each update once"


@pytest.mark.mpi
def test_podracer_mpirun_as_documented_survives_usr2_to_its_process_group(tmp_path):
    """The README's multi-rank command (``podracer mpirun -n 2 podracer train ...``) and a
    SIGUSR2 to its whole process group (a wrapper's "signal the job"): every rank checkpoints, exit
    75; the same command resumes and finishes. A bare mpiexec died of the same signal (-12)."""
    from helpers import mpiexec_or_skip

    mpiexec_or_skip()
    podracer = Path(sys.executable).parent / "podracer"
    run = tmp_path / "run"
    cmd = [
        str(podracer),
        "mpirun",
        "-n",
        "2",
        str(podracer),
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(run),
        "--set",
        "total_env_steps=40960",
        "--set",
        "tournament.interval_env_steps=8192",
        *TINY,
    ]
    out = tmp_path / "out"
    p = subprocess.Popen(
        cmd,
        stdout=open(out, "w"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and p.poll() is None and not all(len(r) >= 2 for r in _train_rows_of(run, 2)):
            time.sleep(0.3)
        assert p.poll() is None, out.read_text()
        os.killpg(p.pid, signal.SIGUSR2)
        assert p.wait(timeout=120) == 75, out.read_text()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = out.read_text()
    assert "SIGUSR2: asking every rank" in text and text.count("checkpoint saved, run again to resume") == 2, text
    assert subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=240).returncode == 0
    for k, steps in enumerate(_train_rows_of(run, 2)):
        assert steps == list(range(STEPS_PER_UPDATE, 40960 + 1, STEPS_PER_UPDATE)), f"rank {k}: each update once"


def _train_rows_of(run: Path, ranks: int, name: str = "quickstart") -> list[list[int]]:
    from podracer_hpc.files.h5log import read_log

    rows = []
    for k in range(ranks):
        try:
            rows.append([int(x) for x in read_log(run / "logs" / f"{name}_rank{k}.h5")["train"]["env_steps"]])
        except Exception:
            rows.append([])
    return rows


def test_signal_relay_refuses_bad_arguments():
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cluster.mpirun"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "usage: podracer mpirun" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cluster.mpirun", "--mpiexec", "/nonexistent/mpiexec", "-n", "2", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "is not an executable file" in r.stderr


def test_signal_relay_exit_code_is_mpiexecs(tmp_path):
    """With a stand-in for mpiexec: TERM is what it gets (once per signal), its exit code is passed on,
    and it starts with USR1/USR2 ignored."""
    fake = tmp_path / "mpiexec"
    fake.write_text(
        "#!/bin/bash\n"
        'grep -E \'^SigIgn\' /proc/$$/status > "$(dirname "$0")/sigign"\n'
        'trap \'echo TERM >> "$(dirname "$0")/got"; exit 75\' TERM\n'
        'echo started > "$(dirname "$0")/started"\n'
        "while :; do sleep 0.1; done\n"
    )
    fake.chmod(0o755)
    p = subprocess.Popen(
        [sys.executable, "-m", "podracer_hpc.cluster.mpirun", "--mpiexec", str(fake), "-n", "1", "x"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        end = time.monotonic() + 30
        while not (tmp_path / "started").exists() and time.monotonic() < end:
            time.sleep(0.05)
        p.send_signal(signal.SIGUSR1)
        assert p.wait(timeout=30) == 75
    finally:
        if p.poll() is None:
            p.kill()
    assert (tmp_path / "got").read_text() == "TERM\n"
    ignored = int((tmp_path / "sigign").read_text().split()[1], 16)
    assert ignored & (1 << (signal.SIGUSR1 - 1)) and ignored & (1 << (signal.SIGUSR2 - 1))
    assert "SIGUSR1: asking every rank to finish its update, checkpoint and exit" in p.stderr.read()
    fake.write_text("#!/bin/bash\nkill -KILL $$\n")
    assert (
        subprocess.run(
            [sys.executable, "-m", "podracer_hpc.cluster.mpirun", "--mpiexec", str(fake), "x"], timeout=30
        ).returncode
        == 128 + signal.SIGKILL
    )


# ------------------------------------------------------------------------------------------
# --wait's decisions, state by state. What Slurm reports comes from a script
# here because some paths take minutes on a real cluster (a record purged MinJobAge + 60 s after
# the end); tests/slurm runs the cancel, the requeues and the never-starting job for real.
# ------------------------------------------------------------------------------------------
def _scripted(monkeypatch, states):
    seq = list(states)

    def fake(job_ids):
        return {j: seq.pop(0) if len(seq) > 1 else seq[0] for j in job_ids}

    from podracer_hpc.cluster import jobstate

    monkeypatch.setattr(jobstate, "slurm_job_states", fake)  # what the watcher asks, once per poll (launch/watch.py)


def _slurm_launched(tmp_path, stale=None):

    err = tmp_path / "slurm" / "7" / "7_0_log.err"
    err.parent.mkdir(parents=True)
    err.write_text("last line of the job's stderr\n")
    return launch.Launched("slurm", [tmp_path], jobs=[launch.Job("7", err)], logs=[err], stale_summaries=[stale])


def _summary(tmp_path, **kw):
    (tmp_path / "summary.json").write_text(json.dumps({"env_steps": 4096, **kw}))


S = launch.SlurmJobState


def test_wait_follows_requeues_and_needs_a_complete_summary(tmp_path, monkeypatch, capsys):
    _summary(tmp_path, complete=False)  # what the first start wrote when it was stopped
    _scripted(
        monkeypatch,
        [
            S("PENDING", "None"),
            S("RUNNING"),
            None,
            S("COMPLETING"),
            S("PENDING", "BeginTime", 1),
            S("RUNNING", "None", 1),
            S("RUNNING", "None", 2),
            S("COMPLETED", "None", 2),
        ],
    )
    with pytest.raises(launch.JobError, match="ended COMPLETED without completing its training: its summary says"):
        launch.wait(_slurm_launched(tmp_path), timeout_s=30, poll_s=0, confirm_s=0, slurm_every_s=0)
    err = capsys.readouterr().err
    assert "requeued (start 2)" in err and "requeued (start 3)" in err


def test_wait_returns_the_summary_of_a_completed_job(tmp_path, monkeypatch):
    _scripted(monkeypatch, [S("RUNNING"), S("COMPLETED")])
    launched = _slurm_launched(tmp_path)
    _summary(tmp_path)
    assert launch.wait(launched, timeout_s=30, poll_s=0, confirm_s=0, slurm_every_s=0) == [{"env_steps": 4096}]


def test_wait_errors_when_the_job_vanishes_without_a_complete_summary(tmp_path, monkeypatch):
    _summary(tmp_path, complete=True)
    stale = launch.summary_signature(tmp_path)  # an earlier run's summary, there before submission
    _scripted(monkeypatch, [S("RUNNING"), S("")])  # no accounting, and the record was purged
    with pytest.raises(launch.JobError, match="gone from the queue.*wrote no summary.*7_0_log.err") as e:
        launch.wait(_slurm_launched(tmp_path, stale), timeout_s=30, poll_s=0, confirm_s=0, slurm_every_s=0)
    assert e.value.exit_code == 1 and "last line of the job's stderr" in str(e.value)


def test_wait_accepts_a_vanished_job_whose_fresh_summary_is_complete(tmp_path, monkeypatch):
    _scripted(monkeypatch, [S("RUNNING"), S("")])
    launched = _slurm_launched(tmp_path)
    _summary(tmp_path)
    assert launch.wait(launched, timeout_s=30, poll_s=0, confirm_s=0, slurm_every_s=0)[0]["env_steps"] == 4096


@pytest.mark.parametrize(
    "state,code",
    [("CANCELLED", "0:15"), ("FAILED", "75:0"), ("TIMEOUT", "0:0"), ("NODE_FAIL", "0:0"), ("OUT_OF_MEMORY", "0:125")],
)
def test_wait_errors_on_a_job_that_ended_badly(tmp_path, monkeypatch, state, code):
    _summary(tmp_path, complete=False)
    _scripted(monkeypatch, [S("RUNNING"), S(state, "None", 0, code)])
    with pytest.raises(launch.JobError, match=f"Slurm job 7 ended {state}.*stopped early.*see .*7_0_log.err"):
        launch.wait(_slurm_launched(tmp_path), timeout_s=30, poll_s=0, confirm_s=0, slurm_every_s=0)


def test_wait_does_not_take_a_requeue_for_an_end(tmp_path, monkeypatch):
    """A state that looks ended, then PENDING again (requeue), is not an end: it is confirmed only
    when Slurm still says so confirm_s later."""
    _scripted(
        monkeypatch,
        [S("RUNNING"), S("FAILED"), S("PENDING", "BeginTime", 1), S("RUNNING", "None", 1), S("COMPLETED", "None", 1)],
    )
    launched = _slurm_launched(tmp_path)
    _summary(tmp_path)
    assert launch.wait(launched, timeout_s=30, poll_s=0, confirm_s=0, slurm_every_s=0)


def test_wait_errors_at_once_on_a_job_that_can_never_start(tmp_path, monkeypatch):
    _scripted(monkeypatch, [S("PENDING", "PartitionTimeLimit")])
    with pytest.raises(launch.JobError, match="cannot start: PartitionTimeLimit.*scancel 7"):
        launch.wait(_slurm_launched(tmp_path), timeout_s=30, poll_s=0, confirm_s=0, slurm_every_s=0)


def test_wait_gives_up_after_its_timeout(tmp_path, monkeypatch):
    _scripted(monkeypatch, [S("PENDING", "Priority")])
    with pytest.raises(launch.JobError, match="gave up waiting after 0 s; the job goes on"):
        launch.wait(_slurm_launched(tmp_path), timeout_s=0.2, poll_s=0.05, confirm_s=0, slurm_every_s=0)


# ------------------------------------------------------------------------------------------
# Many jobs, one scheduler call per poll. A fake scontrol/sacct on PATH
# stands in for Slurm: the real-cluster tier (tests/slurm) takes minutes to queue 100 array
# tasks, and what is checked here is how often and how Slurm is asked, and how its answer is read.
# ------------------------------------------------------------------------------------------
SCONTROL_ARRAY = (  # scontrol -o: one line per job
    "JobId=905 ArrayJobId=900 ArrayTaskId=5 JobName=big JobState=RUNNING Reason=None Restarts=1 ExitCode=0:0\n"
    "JobId=901 ArrayJobId=900 ArrayTaskId=1 JobName=big JobState=COMPLETED Reason=None Restarts=0 ExitCode=0:0\n"
    "JobId=900 ArrayJobId=900 ArrayTaskId=6-99%4 JobName=big JobState=PENDING Reason=JobArrayTaskLimit "
    "Restarts=0 ExitCode=0:0\n"
)


def test_scontrol_and_sacct_answers_are_parsed_per_array_task():
    from podracer_hpc.cluster import jobstate

    assert jobstate.task_ids("6-99%4") == list(range(6, 100))
    assert jobstate.task_ids("1,3,5-7") == [1, 3, 5, 6, 7] and jobstate.task_ids("[0-6:3]") == [0, 3, 6]
    st = jobstate.parse_scontrol(SCONTROL_ARRAY)
    assert len(st) == 2 + 94
    assert st["900_5"] == S("RUNNING", "None", 1, "0:0", "scontrol") and st["900_1"].state == "COMPLETED"
    assert st["900_99"].state == "PENDING" and st["900_99"].reason == "JobArrayTaskLimit"
    plain = jobstate.parse_scontrol("JobId=77 JobName=x JobState=FAILED Reason=NonZeroExitCode Restarts=2 ExitCode=1:0")
    assert plain == {"77": S("FAILED", "NonZeroExitCode", 2, "1:0", "scontrol")}
    acct = jobstate.parse_sacct("900_2|CANCELLED by 1000|0:15\n900_[3-4]|PENDING|0:0\n78|TIMEOUT|0:0\n")
    assert acct["900_2"] == S("CANCELLED", "", 0, "0:15", "sacct") and acct["900_4"].state == "PENDING"
    assert acct["78"].state == "TIMEOUT"


def _fake_slurm(tmp_path, monkeypatch, scontrol_out: str, sacct_out: str = "") -> Path:
    calls = tmp_path / "calls"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in (("scontrol", scontrol_out), ("sacct", sacct_out)):
        (bin_ / f"{name}.out").write_text(text)
        (bin_ / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\ncat {bin_ / (name + ".out")}\n')
        (bin_ / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_wait_asks_slurm_once_per_poll_for_a_hundred_array_tasks(tmp_path, monkeypatch):
    tasks = 100
    text = "".join(
        f"JobId={1000 + t} ArrayJobId=900 ArrayTaskId={t} JobState=COMPLETED Reason=None Restarts=0 ExitCode=0:0\n"
        for t in range(tasks - 2)
    )  # two tasks purged from slurmctld: sacct has them
    calls = _fake_slurm(tmp_path, monkeypatch, text, "900_98|COMPLETED|0:0\n900_99|COMPLETED|0:0\n")
    dirs = []
    for t in range(tasks):
        d = tmp_path / f"task{t}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"env_steps": 4096}))
        dirs.append(d)
    jobs = [launch.Job(f"900_{t}", tmp_path / "log.err") for t in range(tasks)]
    launched = launch.Launched("slurm", dirs, jobs=jobs, logs=[tmp_path / "log.err"], stale_summaries=[None] * tasks)
    polls, real_sleep = [], time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: polls.append(s) if s == 3 else real_sleep(s))  # wait's pause only
    out = io.StringIO()
    summaries = launch.wait(launched, timeout_s=30, poll_s=3, out=out, confirm_s=0, progress=None, slurm_every_s=0)
    assert summaries == [{"env_steps": 4096}] * tasks
    asked = calls.read_text().splitlines()
    assert len(polls) == 1  # seen ended, then confirmed: two polls, one pause between them
    assert asked == ["scontrol -o show job 900", "sacct -n -X -P -j 900 -o JobID,State,ExitCode"] * 2
    assert "jobs: 100 COMPLETED" in out.getvalue() and "job 900_3:" not in out.getvalue()  # counts, not 100 lines


def test_a_slurmctld_that_does_not_answer_is_not_an_end(tmp_path, monkeypatch):
    from podracer_hpc.cluster import jobstate

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Socket timed out' >&2\nexit 1\n")
    (bin_ / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    assert jobstate.slurm_job_states(["900_1", "900_2"]) == {"900_1": None, "900_2": None}


SITE = REPO / "tests" / "fixtures" / "site_dgx.sh"


def _dry_run(*args: str) -> str:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "submit",
            "jobs/quickstart.yaml",
            "--executor",
            "slurm",
            "--run-dir",
            "/scratch/runs/qs",
            "--dry-run",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PATH": "/nonexistent"},
    )  # no Slurm: the script only
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_site_file_is_read_alike_by_submit_and_the_templates():
    """The same site file gives the same sbatch options through slurm_templates/submit.sh and
    podracer submit --site; podracer submit adds its srun extras and modules; the command line wins."""
    t = subprocess.run(
        ["bash", str(REPO / "slurm_templates" / "submit.sh"), "--print", "slurm_templates/tournament.sbatch"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**os.environ, "PODRACER_SITE": str(SITE)},
    )
    assert t.returncode == 0, t.stderr
    template = dict(re.findall(r"--([a-z-]+)=(\S+)", t.stdout))
    script = _dry_run("--site", str(SITE))
    submit = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)$", script, re.M))
    shared = ("partition", "account", "qos", "cpus-per-task", "mem", "constraint", "reservation")
    assert {k: template.get(k) for k in shared} == {k: submit.get(k) for k in shared}
    assert template["partition"] == "batch" and submit["reservation"] == "dgx"
    assert "module load cuda/12.6 openmpi/4.1.7" in script and "--cpu-bind=cores" in script and "--mpi=pmix" in script
    mine = _dry_run("--site", str(SITE), "--partition", "debug", "--cpus-per-task", "4", "--srun", "cpu-bind=none")
    assert "#SBATCH --partition=debug\n" in mine and "#SBATCH --cpus-per-task=4\n" in mine
    assert mine.index("--cpu-bind=cores") < mine.index("--cpu-bind=none")  # srun takes the last: the command line's


@pytest.mark.parametrize(
    "args, message",
    [
        (("--site", "/nonexistent/site.sh"), "no such file"),
        (("--srun", "mpi=pmi2"), "use podracer submit --mpi instead"),
        (("--srun", "bad key"), "long srun option name"),
        (("--container-mounts", "/a:/a"), "without --container-image"),
    ],
)
def test_bad_site_container_and_srun_options_fail_before_anything_runs(args, message):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "submit",
            "jobs/quickstart.yaml",
            "--executor",
            "slurm",
            "--mpi",
            "pmi2",
            "--dry-run",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


# ------------------------------------------------------------------------------------------
# Pods next to their GPU, typed GPUs, CPUs that fit a DGX, a start that spares the filesystem
# ------------------------------------------------------------------------------------------
def test_gpu_pods_are_bound_to_one_gpu_on_their_own_socket(monkeypatch):
    from podracer_hpc.launch.slurm import parameters as slurm_parameters

    monkeypatch.setenv("PATH", "/nonexistent")
    cfg = load_config("jobs/quickstart.yaml")
    srun = slurm_parameters(req(executor="slurm", tasks_per_node=8, gpus_per_node=8), cfg)["srun_args"]
    i = srun.index("--gpus-per-task=1")
    assert srun[i : i + 3] == ["--gpus-per-task=1", "--gpu-bind=single:1", "--distribution=block:block"]
    assert not any("gpu" in a for a in slurm_parameters(req(executor="slurm", tasks_per_node=2), cfg)["srun_args"])
    unbound = slurm_parameters(req(executor="slurm", tasks_per_node=2, gpus_per_node=2, gpu_bind="none"), cfg)
    assert not any("gpu-bind" in a or "distribution" in a for a in unbound["srun_args"])
    # --srun gpu-bind=...: the user's comes last (srun takes the last), but closest is refused
    own = slurm_parameters(req(executor="slurm", gpus_per_node=1, srun=["gpu-bind=map_gpu:0"]), cfg)["srun_args"]
    assert own[-1] == "--gpu-bind=map_gpu:0"
    for bind in ("closest", "verbose,closest"):
        with pytest.raises(launch.LaunchError, match="fail its one-GPU check"):
            launch.validate(req(executor="slurm", mpi="pmi2", gpus_per_node=1, srun=[f"gpu-bind={bind}"]), dry_run=True)


def test_typed_gpus_are_accepted_and_stay_bound():
    script = _dry_run("--mpi", "pmi2", "--nodes", "2", "--tasks-per-node", "8", "--gpus-per-node", "h100:8")
    assert "#SBATCH --gpus-per-node=h100:8\n" in script
    assert "export PODRACER_GPUS=8 " in script and "--gpus-per-task=1 --gpu-bind=single:1" in script
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "submit", "jobs/quickstart.yaml", "--gpus-per-node", "h100:x"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 2 and "TYPE:COUNT (h100:8)" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_sinfo_counts_only_the_gpus_of_the_type_asked_for(monkeypatch):
    from podracer_hpc.launch import slurm

    answers = {"%P": ["dgx*"], "%D": ["2"], "%l": ["infinite"], "%c %Z": ["224 2"], "%G": ["gpu:a100:8(S:0-1)"]}
    monkeypatch.setattr(slurm, "_sinfo", lambda fmt, part="": answers[fmt])
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    with pytest.raises(launch.LaunchError, match="at most 0 GPUs of type h100"):
        slurm._check_against_slurm(req(executor="slurm", tasks_per_node=8, gpus_per_node=8, gpu_type="h100"))
    slurm._check_against_slurm(req(executor="slurm", tasks_per_node=8, gpus_per_node=8, gpu_type="a100"))


@pytest.mark.parametrize(
    "sbatch, message",
    [
        ("gres=gpu:h100:8", "use podracer submit --gpus-per-node h100:8 instead"),
        ("gres=gpu:8,nvme:1", "--gpus-per-node 8 instead .* keep the rest as --sbatch gres=nvme:1"),
        ("gpus=16", "16 GPUs over N nodes is --gpus-per-node 16/N"),
        ("gpus-per-socket=4", "binds one GPU to each pod itself"),
        ("gpu-bind=closest", "binds one GPU to each pod itself"),
        ("gpus-per-node=8", "use podracer submit --gpus-per-node instead"),
    ],
)
def test_gpus_asked_for_through_sbatch_are_refused_with_the_option_to_use(sbatch, message, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(launch.LaunchError, match=message):
        launch.validate(req(executor="slurm", mpi="pmi2", sbatch=[sbatch]), dry_run=True)
    assert launch.parse_sbatch(["gres=nvme:1"]) == {"gres": "nvme:1"}  # other GRES pass


def test_cpus_per_task_come_from_the_node_or_are_refused_with_the_numbers(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    dgx = dict(executor="slurm", mpi="pmi2", nodes=4, tasks_per_node=8, gpus_per_node=8, node_cpus=112)
    r = req(**dgx)
    launch.validate(r, dry_run=True)
    assert r.cpus_per_task == 14 and "--cpus-per-task 14 = 112 CPUs per node" in capsys.readouterr().err
    assert "--cpus-per-task=14 --gpus-per-task=1" in launch.sbatch_text(r, load_config(r.job_file))
    with pytest.raises(launch.LaunchError, match=r"8 x --cpus-per-task 16 = 128 CPUs per node, but a node has 112"):
        launch.validate(req(**{**dgx, "cpus_per_task": 16}), dry_run=True)
    with pytest.raises(launch.LaunchError, match="Use --cpus-per-task 14"):
        launch.validate(req(**{**dgx, "cpus_per_task": 16}), dry_run=True)
    cpu_job = req(**{**dgx, "gpus_per_node": 0})
    launch.validate(cpu_job, dry_run=True)
    assert cpu_job.cpus_per_task == 0  # a CPU job keeps Slurm's default


def test_sinfo_gives_physical_cores_under_nomultithread(monkeypatch, capsys):
    from podracer_hpc.launch import slurm

    answers = {"%P": ["dgx*"], "%D": ["4"], "%l": ["infinite"], "%c %Z": ["224 2"], "%G": ["gpu:h100:8"]}
    monkeypatch.setattr(slurm, "_sinfo", lambda fmt, part="": answers[fmt])
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    ht = req(executor="slurm", tasks_per_node=8, gpus_per_node=8)
    slurm._check_against_slurm(ht)
    assert ht.cpus_per_task == 28  # 224 hyper-threads / 8
    one = req(executor="slurm", tasks_per_node=8, gpus_per_node=8, sbatch=["hint=nomultithread"])
    slurm._check_against_slurm(one)
    assert one.cpus_per_task == 14 and "physical cores" in capsys.readouterr().err
    with pytest.raises(launch.LaunchError, match="128 CPUs per node, but a node has 112"):
        slurm._check_against_slurm(
            req(executor="slurm", tasks_per_node=8, gpus_per_node=8, cpus_per_task=16, sbatch=["hint=nomultithread"])
        )


def test_the_golden_dgx_site_fits_its_node():
    script = _dry_run("--site", str(SITE), "--nodes", "4", "--tasks-per-node", "8", "--gpus-per-node", "8")
    assert "#SBATCH --cpus-per-task=14\n" in script
    r = subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "submit", "jobs/quickstart.yaml", "--executor", "slurm"]
        + ["--dry-run", "--site", str(SITE), "--tasks-per-node", "8", "--gpus-per-node", "8", "--cpus-per-task", "16"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PATH": "/nonexistent"},
    )
    assert r.returncode == 2 and "= 128 CPUs per node, but a node has 112 (--node-cpus)" in r.stderr, r.stderr


MOUNTS = """proc /proc proc rw 0 0
/dev/sda1 / ext4 rw 0 0
nas:/export/home /home nfs4 rw,vers=4.2 0 0
lfs@o2ib:/scratch /lustre lustre rw 0 0
/dev/nvme0n1 /home/me/local\\040disk xfs rw 0 0
"""


def test_a_large_job_from_a_network_home_is_warned_about():
    from podracer_hpc.launch import checks

    assert checks.mount_of("/home/me/env/bin/python", MOUNTS) == ("/home", "nfs4")
    assert checks.mount_of("/home/me/local disk/venv/bin/python", MOUNTS) == ("/home/me/local disk", "xfs")
    assert checks.mount_of("/homework/x", MOUNTS) == ("/", "ext4")
    why = checks.shared_interpreter("/home/me/miniconda/envs/rl/bin/python", 512, MOUNTS)
    assert "/home (nfs4" in why and "512 ranks" in why and "--container-image" in why and "sbcast" in why
    assert "lustre" in checks.shared_interpreter("/lustre/venv/bin/python", 64, MOUNTS)
    assert checks.shared_interpreter("/home/me/env/bin/python", 63, MOUNTS) == ""  # a small job
    assert checks.shared_interpreter("/opt/venv/bin/python", 512, MOUNTS) == ""  # node-local
    assert checks.shared_interpreter("/home/me/local disk/venv/bin/python", 512, MOUNTS) == ""
