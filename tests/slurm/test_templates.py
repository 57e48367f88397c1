"""The plain sbatch templates of slurm_templates/ (docs/slurm-templates.md).

Three tiers in one file:

- golden: `slurm_templates/render.sh` prints a template's #SBATCH header and what its batch
  shell would run (banner, rank environment, srun line) with fake Slurm variables; the text must
  match tests/golden/templates/<case>.txt (`UPDATE_GOLDEN=1 pytest ...` rewrites them). No Slurm.
- launcher logic with stand-ins: the real templates run under bash with fake `srun`/`scontrol`/
  `podracer` on PATH, to check the signal relay and the requeue decision for every exit code. No Slurm.
- the real local cluster (marker `slurm`, fixture `slurm_cluster`): `sbatch --test-only` of every
  template; a 2-node x 2-task tournament that completes; a job array of 3 tasks at %2 whose
  last task joins the shared leaderboard; a tournament signalled in the middle that relays the
  signal, requeues itself, resumes and ends with every round logged once, the env steps of the
  uninterrupted run and an intact leaderboard.

pyxis/enroot are not installed here: container.sbatch gets only `sbatch --test-only` and its
golden render, never a real run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TPL = REPO / "slurm_templates"
GOLDEN = REPO / "tests" / "golden" / "templates"
RENDER = TPL / "render.sh"
TEMPLATES = ("tournament.sbatch", "sweep.sbatch", "container.sbatch")

# sbatch overrides that fit the DGX defaults of the templates to the local nodes
# (2 CPUs each, no GRES)
LOCAL = ["--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0"]
# a short quickstart: 48 updates of 2048 env steps per pod, a round every 8 updates (6 rounds)
STEPS, INTERVAL, BATCH = 98304, 16384, 16 * 128
FAST = [
    "--set",
    f"total_env_steps={STEPS}",
    "--set",
    f"tournament.interval_env_steps={INTERVAL}",
    "--set",
    "env.num_envs=128",
    "--set",
    "eval.episodes=8",
    "--set",
    "threads=1",
    "--quiet",
]
ROUNDS = STEPS // INTERVAL


# ------------------------------------------------------------------------------ golden

CASES: dict[str, tuple[str, list[str], list[str]]] = {
    # name: (template, NAME=VALUE given to render.sh, template args)
    "tournament_dgx": ("tournament.sbatch", [], []),
    "tournament_dgx_4nodes_args": (
        "tournament.sbatch",
        ["SLURM_JOB_NUM_NODES=4"],
        ["jobs/quickstart.yaml", "--set", "total_env_steps=50000000", "--set", "agent.hidden_sizes=[256, 256]"],
    ),
    "tournament_local": (
        "tournament.sbatch",
        ["PODRACER_MPI=pmi2", "SLURM_NTASKS_PER_NODE=2", "SLURM_CPUS_PER_TASK=1", "SLURM_GPUS_PER_NODE=0"],
        ["jobs/quickstart.yaml", "--set", "total_env_steps=204800", "--quiet"],
    ),
    "tournament_conda_resume": (
        "tournament.sbatch",
        [
            "PODRACER_CONDA_ENV=podracer-hpc",
            "PODRACER_MODULES=cuda/12.6 openmpi/4.1.7",
            "PODRACER_RUN_DIR=/lustre/runs/quickstart-777",
            "SLURM_RESTART_COUNT=3",
            "NCCL_IB_HCA=mlx5_0,mlx5_1",
            "UCX_TLS=rc,sm,self",
        ],
        ["jobs/pendulum.yaml"],
    ),
    "sweep_pods_task0": ("sweep.sbatch", [], ["jobs/quickstart.yaml", "slurm_templates/sweeps/pods.txt"]),
    "sweep_pods_task2_shared": (
        "sweep.sbatch",
        ["SLURM_ARRAY_TASK_ID=2", "PODRACER_LEADERBOARD=shared"],
        ["jobs/quickstart.yaml", "slurm_templates/sweeps/pods.txt", "--quiet"],
    ),
    "sweep_pods_task3_2nodes_path": (
        "sweep.sbatch",
        [
            "SLURM_ARRAY_TASK_ID=3",
            "SLURM_JOB_NUM_NODES=2",
            "SLURM_NTASKS_PER_NODE=4",
            "PODRACER_LEADERBOARD=/lustre/leaderboards/pendulum",
        ],
        ["jobs/quickstart.yaml", "slurm_templates/sweeps/pods.txt"],
    ),
    "tournament_dgx_unbound_gpus": (
        "tournament.sbatch",
        [
            "PODRACER_GPU_BIND=none",
            "HDF5_USE_FILE_LOCKING=FALSE",
            "PODRACER_CACHE_DIR=/raid/podracer-cache",
            "PODRACER_SNAPSHOT=0",
        ],
        [],
    ),
    "container_dgx": (
        "container.sbatch",
        [
            "PODRACER_IMAGE=/lustre/images/podracer.sqsh",
            "PODRACER_RUNS=/lustre/scratch/podracer/runs",
            "PODRACER_CONTAINER_MOUNTS=/lustre/data:/data:ro",
        ],
        ["jobs/quickstart.yaml"],
    ),
}


def render(template: str, given: list[str], args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(RENDER), str(TPL / template), *given, "--", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )


def normalize(text: str) -> str:
    """The checkout's path, the code snapshot's id (a digest of the code) and its git revision."""
    text = re.sub(r"/code/[0-9a-f]{12}", "/code/<id>", text.replace(str(REPO), "<repo>"))
    return re.sub(r"(PODRACER_GIT_REVISION=|\(revision )[^\s)]+", r"\1<rev>", text)


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_golden(case: str) -> None:
    template, given, args = CASES[case]
    proc = render(template, given, args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = normalize(proc.stdout)
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(), (
        f"{template} renders differently from {path.relative_to(REPO)}; if the change is meant, "
        f"rerun with UPDATE_GOLDEN=1 and review the diff.\n--- rendered:\n{text}"
    )


def test_no_stray_golden_files() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == sorted(CASES)


def test_golden_header_is_the_templates_header() -> None:
    """The rendered header is the file's own #SBATCH block, and the DGX defaults are in it."""
    for t in TEMPLATES:
        lines = [ln for ln in (TPL / t).read_text().splitlines() if ln.startswith("#SBATCH")]
        text = render(t, ["PODRACER_IMAGE=x"], ["jobs/quickstart.yaml", "slurm_templates/sweeps/pods.txt"]).stdout
        assert [ln for ln in text.splitlines() if ln.startswith("#SBATCH")] == lines, t
        header = "\n".join(lines)
        for opt in (
            "--ntasks-per-node=8",
            "--gpus-per-node=8",
            "--signal=B:USR1@120",
            "--requeue",
            "--open-mode=append",
        ):
            assert opt in header, (t, opt)
        assert "container" not in header, (
            "pyxis options must stay off #SBATCH lines (sbatch rejects them without pyxis)"
        )


@pytest.mark.parametrize(
    "given,args,message",
    [
        ([], ["no/such.yaml"], "job file no/such.yaml not found"),
        (["PODRACER_MPI=openmpi"], [], "PODRACER_MPI=openmpi"),
        (["SLURM_GPUS_PER_NODE=4"], [], "8 pods per node but 4 GPUs per node: two pods would share a GPU"),
        (["PODRACER_GPU_BIND=closest"], [], "PODRACER_GPU_BIND=closest"),
    ],
)
def test_render_rejects_bad_input_with_exit_2(given, args, message) -> None:
    proc = render("tournament.sbatch", given, args)
    assert proc.returncode == 2 and message in proc.stdout, proc.stdout + proc.stderr


def test_sweep_rejects_bad_points() -> None:
    pods = ["jobs/quickstart.yaml", "slurm_templates/sweeps/pods.txt"]
    out = render("sweep.sbatch", ["SLURM_ARRAY_TASK_ID=4"], pods)
    assert out.returncode == 2 and "array task 4, but" in out.stdout and "has 4 points" in out.stdout, out.stdout
    out = render("sweep.sbatch", ["SLURM_NTASKS_PER_NODE=2", "SLURM_ARRAY_TASK_ID=2"], pods)  # pods=4 > 2 tasks
    assert out.returncode == 2 and "pods=4, but the allocation has 2 task(s)" in out.stdout, out.stdout
    out = render("sweep.sbatch", ["PODRACER_LEADERBOARD=everyone"], pods)
    assert out.returncode == 2 and "PODRACER_LEADERBOARD=everyone" in out.stdout, out.stdout
    out = render("sweep.sbatch", [], ["jobs/quickstart.yaml"])
    assert out.returncode == 2 and "usage:" in out.stdout, out.stdout


def test_container_needs_an_image() -> None:
    out = render("container.sbatch", [], [])
    assert out.returncode == 2 and "set PODRACER_IMAGE" in out.stdout, out.stdout


def test_templates_parse_as_bash() -> None:
    for f in [*TEMPLATES, "lib.sh", "site.sh", "render.sh", "submit.sh", "submit_check.sh"]:
        proc = subprocess.run(["bash", "-n", str(TPL / f)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{f}: {proc.stderr}"


def test_submit_adds_site_partition_account_qos() -> None:
    env = {"PATH": os.environ["PATH"], "PODRACER_PARTITION": "batch", "PODRACER_ACCOUNT": "rl", "PODRACER_QOS": "long"}
    proc = subprocess.run(
        ["bash", str(TPL / "submit.sh"), "--print", "-N", "4", "slurm_templates/tournament.sbatch"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"PODRACER_ROOT={REPO} sbatch --partition=batch --account=rl --qos=long -N 4 slurm_templates/tournament.sbatch"
    )
    # not a pod template (no podracer_launch): no job file or GPU check, the options as given
    proc = subprocess.run(
        ["bash", str(TPL / "submit.sh"), "--print", "slurm_templates/rllib.sbatch"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"]},
        cwd=REPO,
        timeout=30,
    )
    assert proc.stdout.strip() == f"PODRACER_ROOT={REPO} sbatch slurm_templates/rllib.sbatch", proc.stdout + proc.stderr


@pytest.fixture
def fake_sbatch(tmp_path):
    """submit.sh with a stand-in `sbatch` first on PATH that logs each call: what reaches sbatch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "sbatch $*" >>{log}\necho "Submitted batch job 7"\n')
    (bin_dir / "sbatch").chmod(0o755)

    def submit(*args: str, **extra: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        env = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "PODRACER_RUNS": str(tmp_path / "runs"),
            "PODRACER_VENV": "",
            "PODRACER_SNAPSHOT": "0",
            **extra,
        }
        proc = subprocess.run(
            ["bash", str(TPL / "submit.sh"), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
        )
        return proc, log.read_text().splitlines() if log.exists() else []

    return submit


@pytest.mark.parametrize(
    "args,message",
    [
        (["--ntasks-per-node=16", "slurm_templates/tournament.sbatch"], "16 tasks per node but 8 GPUs per node"),
        (["-N", "1", "-n", "16", "slurm_templates/tournament.sbatch"], "16 tasks per node but 8 GPUs per node"),
        (
            ["--gres=gpu:h100:8", "--ntasks-per-node", "16", "slurm_templates/container.sbatch"],
            "16 tasks per node but 8 GPUs per node",
        ),
        (
            [
                "--array=0-3",
                "--gpus-per-node=4",
                "slurm_templates/sweep.sbatch",
                "jobs/quickstart.yaml",
                "slurm_templates/sweeps/pods.txt",
            ],
            "8 tasks per node but 4 GPUs per node",
        ),
        (["slurm_templates/tournament.sbatch", "jobs/quickstrat.yaml"], "job file jobs/quickstrat.yaml not found"),
        (["slurm_templates/sweep.sbatch", "jobs/quickstart.yaml"], "sweep.sbatch needs a sweep file"),
        (["slurm_templates/sweep.sbatch", "jobs/quickstart.yaml", "nosuch.txt"], "sweep file nosuch.txt not found"),
        (["slurm_templates/tournamnet.sbatch"], "template slurm_templates/tournamnet.sbatch not found"),
    ],
)
def test_submit_refuses_before_sbatch(fake_sbatch, args, message) -> None:
    """What would fail with exit 2 only at the job's start, after its wait in the queue, never reaches sbatch."""
    for mode in ([], ["--print"]):
        proc, calls = fake_sbatch(*mode, *args)
        assert proc.returncode == 2 and message in proc.stderr and "nothing submitted" in proc.stderr, proc.stderr
        assert calls == [] and proc.stdout == "", (calls, proc.stdout)


def test_submit_refuses_a_job_file_podracer_config_rejects(fake_sbatch, tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  name: pendulum\n  num_envz: 64\n")
    proc, calls = fake_sbatch("slurm_templates/tournament.sbatch", str(bad))
    assert proc.returncode == 2 and "num_envz" in proc.stderr and "podracer config rejects" in proc.stderr, proc.stderr
    assert calls == []
    # a --set option of the template's arguments is checked with the job file
    proc, calls = fake_sbatch("slurm_templates/tournament.sbatch", "jobs/quickstart.yaml", "--set", "total_env_stepz=1")
    assert proc.returncode == 2 and "total_env_stepz" in proc.stderr and calls == [], proc.stderr
    # a Python without the package's dependencies (a login node's): only "looks like YAML", and it says so
    venv = tmp_path / "bare-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n"
    )
    (venv / "bin" / "python").chmod(0o755)
    (tmp_path / "tabs.yaml").write_text("env:\n\tname: pendulum\n")
    proc, calls = fake_sbatch("slurm_templates/tournament.sbatch", str(tmp_path / "tabs.yaml"), PODRACER_VENV=str(venv))
    assert proc.returncode == 2 and "indented with tabs" in proc.stderr and calls == [], proc.stderr
    assert "No module named 'torch'" in proc.stderr and "checked only that" in proc.stderr, proc.stderr
    proc, calls = fake_sbatch("slurm_templates/tournament.sbatch", "jobs/quickstart.yaml", PODRACER_VENV=str(venv))
    assert proc.returncode == 0 and "checked only that" in proc.stderr and len(calls) == 1, proc.stderr


def test_submit_passes_what_fits(fake_sbatch) -> None:
    """1 GPU per task, CPU pods (no GPUs asked: the local cluster) and a good job file reach sbatch unchanged."""
    cases = [
        [
            "--ntasks-per-node=4",
            "--gpus-per-node=4",
            "slurm_templates/tournament.sbatch",
            "jobs/quickstart.yaml",
            "--set",
            "total_env_steps=1000",
        ],
        ["--ntasks-per-node=2", "--gpus-per-node=0", "slurm_templates/tournament.sbatch"],
    ]
    for args in cases:
        proc, calls = fake_sbatch(*args)
        assert proc.returncode == 0 and "Submitted batch job 7" in proc.stdout, proc.stderr
        assert calls[-1] == "sbatch " + " ".join(args), calls


# ------------------------------------------------- launcher logic with stand-in srun/scontrol

FAKE_SRUN = r"""#!/bin/bash
# stand-in srun: logs its arguments, then behaves as FAKE_MODE says
echo "srun $*" >>"$FAKE_LOG"
case $FAKE_MODE in
    exit-*) exit "${FAKE_MODE#exit-}" ;;
    wait-signal)
        trap 'echo "srun got USR1" >>"$FAKE_LOG"; exit 75' USR1
        touch "$FAKE_LOG.started"
        for _ in $(seq 300); do sleep 0.1; done
        exit 0 ;;
    die-on-signal)  # as if the ranks had no handler yet: killed by the signal
        trap 'echo "srun got USR1" >>"$FAKE_LOG"; exit 138' USR1
        touch "$FAKE_LOG.started"
        for _ in $(seq 300); do sleep 0.1; done
        exit 0 ;;
esac
"""
FAKE_SCONTROL = '#!/bin/bash\necho "scontrol $*" >>"$FAKE_LOG"\nexit "${FAKE_SCONTROL_RC:-0}"\n'


@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("srun", FAKE_SRUN),
        ("scontrol", FAKE_SCONTROL),
        ("scancel", FAKE_SCONTROL),
        ("podracer", "#!/bin/sh\nexit 0\n"),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "fake.log"

    def start(mode: str, **extra: str) -> tuple[subprocess.Popen, Path]:
        env = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "PODRACER_ROOT": str(REPO),
            "PODRACER_VENV": "",
            "PODRACER_RUNS": str(tmp_path / "runs"),
            "SLURM_JOB_ID": "42",
            "SLURM_NTASKS": "4",
            "SLURM_JOB_NUM_NODES": "2",
            "FAKE_LOG": str(log),
            "FAKE_MODE": mode,
            **extra,
        }
        proc = subprocess.Popen(
            ["bash", str(TPL / "tournament.sbatch"), "jobs/quickstart.yaml"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        proc.run_log = tmp_path / "runs" / "quickstart-42" / "slurm-42.out"  # type: ignore[attr-defined]
        return proc, log

    return start


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    """Exit code, and the job's output: the first lines (stdout), then the rest, in the run dir."""
    out, _ = proc.communicate(timeout=30)
    log = proc.run_log  # type: ignore[attr-defined]
    assert f"output continues in {log}" in out, out
    return proc.returncode, log.read_text()


@pytest.mark.parametrize("srun_rc,job_rc,requeued", [(0, 0, False), (75, 0, True), (2, 2, False), (1, 1, False)])
def test_exit_code_decides_requeue(fake_slurm, srun_rc, job_rc, requeued) -> None:
    """75 with no signal at the batch shell: the steps were signalled directly (`scancel
    --signal=USR1 JOB` reaches the steps only) and asked to be run again."""
    proc, log = fake_slurm(f"exit-{srun_rc}")
    rc, out = _finish(proc)
    assert rc == job_rc, out
    assert ("scontrol requeue 42" in log.read_text()) == requeued, out + log.read_text()
    assert "srun --mpi=pmix --wait=120 podracer train" in log.read_text()


def test_requeue_limit_and_failed_requeue_exit_75(fake_slurm) -> None:
    rc, out = _finish(fake_slurm("exit-75", SLURM_RESTART_COUNT="20")[0])
    assert rc == 75 and "not requeued: restarted 20 times already" in out, out
    rc, out = _finish(fake_slurm("exit-75", FAKE_SCONTROL_RC="1")[0])
    assert rc == 75 and "scontrol requeue 42 failed" in out, out


def _signal_when_started(proc: subprocess.Popen, log: Path, sig: int) -> None:
    end = time.monotonic() + 20
    while not Path(f"{log}.started").exists():
        assert time.monotonic() < end and proc.poll() is None, "stand-in srun did not start"
        time.sleep(0.05)
    proc.send_signal(sig)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2])
def test_warning_signal_is_relayed_to_srun_then_requeued(fake_slurm, sig) -> None:
    proc, log = fake_slurm("wait-signal")
    _signal_when_started(proc, log, sig)
    rc, out = _finish(proc)
    name = signal.Signals(sig).name
    assert f"batch shell got {name}: sending SIGUSR1 to the srun step" in out, out
    assert "srun got USR1" in log.read_text(), log.read_text()
    assert f"srun exited with 75 (after {name})" in out and "scontrol requeue 42" in log.read_text(), out
    assert rc == 0, out


def test_sigterm_is_relayed_but_never_requeued(fake_slurm) -> None:
    """SIGTERM is scancel (or the hard limit, or preemption): requeueing would undo a cancel
    (seen on the real cluster before this rule: `scancel JOB` left the job PENDING again)."""
    proc, log = fake_slurm("wait-signal")
    _signal_when_started(proc, log, signal.SIGTERM)
    rc, out = _finish(proc)
    assert "batch shell got SIGTERM: sending SIGUSR1 to the srun step" in out and "srun got USR1" in log.read_text()
    assert "not requeued: the job got SIGTERM" in out and "scontrol" not in log.read_text(), out
    assert rc == 75, out


def test_ranks_killed_by_the_signal_still_requeue(fake_slurm) -> None:
    proc, log = fake_slurm("die-on-signal")
    _signal_when_started(proc, log, signal.SIGUSR1)
    rc, out = _finish(proc)
    assert "srun exited with 138 after SIGUSR1; requeueing" in out and "scontrol requeue 42" in log.read_text(), out


# ------------------------------------------------------------------------------ real cluster


def _python_env() -> dict[str, str]:
    """The interpreter running the tests provides `podracer` to the jobs (its venv, or its bin on PATH)."""
    prefix = Path(sys.prefix)
    env = {"PODRACER_ROOT": str(REPO), "PODRACER_MPI": "pmi2"}
    if (prefix / "bin" / "activate").exists():
        env["PODRACER_VENV"] = str(prefix)
    else:
        env["PODRACER_VENV"] = ""
        env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return env


@pytest.fixture(scope="module")
def cluster(slurm_cluster, tmp_path_factory):
    """The cluster with this file's variables in the client environment (sbatch exports it to the
    jobs) and a work directory (job outputs, PODRACER_RUNS); cancels whatever it submitted."""
    work = tmp_path_factory.mktemp("templates")
    c = dataclasses.replace(
        slurm_cluster, env={**slurm_cluster.env, **_python_env(), "PODRACER_RUNS": str(work / "runs")}
    )
    c.work, c.submitted = work, []
    try:
        yield c
    finally:
        for job in c.submitted:  # a failed test leaves nothing running
            c.run("scancel", job, check=False)


def _sbatch(cluster, *args: str, **env: str) -> str:
    c = dataclasses.replace(cluster, env={**cluster.env, **env}) if env else cluster
    job = c.sbatch(*args, cwd=cluster.work)
    cluster.submitted.append(job)
    return job


def _tournament(cluster) -> str:
    return _sbatch(cluster, "-N2", *LOCAL, "--time=5", str(TPL / "tournament.sbatch"), "jobs/quickstart.yaml", *FAST)


SWEEP_POINTS = "# pods per task\npods=2\npods=1   # a single pod\npods=2 seed=7\n"
SWEEP_STEPS = 2 * INTERVAL


@pytest.fixture(scope="module")
def jobs(cluster) -> dict[str, str]:
    """The three real runs, submitted at once so that they overlap on the 4 nodes (2 cores in
    all here: the tier stays near two minutes): an uninterrupted tournament (n1-n2), the same
    tournament to be signalled (n3-n4), and the array (3 tasks of 1 node, at most 2 at a time),
    which runs as nodes free up. The signal is sent here, once the second tournament has logged
    2 of its 6 rounds, whatever order the tests run in; `signalled` says how that went."""
    sweep = cluster.work / "points.txt"
    sweep.write_text(SWEEP_POINTS)
    out = {
        "baseline": _tournament(cluster),
        "preempt": _tournament(cluster),
        "array": _sbatch(
            cluster,
            "--array=0-2%2",
            *LOCAL,
            "--time=5",
            str(TPL / "sweep.sbatch"),
            "jobs/quickstart.yaml",
            str(sweep),
            *FAST,
            "--set",
            f"total_env_steps={SWEEP_STEPS}",
            PODRACER_LEADERBOARD="shared",
        ),
    }
    job = out["preempt"]
    try:
        _wait_rounds(cluster.work / "runs" / f"quickstart-{job}" / "logs" / "quickstart_rank0.h5", 2, job, cluster)
        # what --signal=B:USR1@120 does before the time limit: USR1 to the batch shell only
        cluster.run("scancel", "--signal=USR1", "--batch", job)
        out["signalled"] = "ok"
    except (AssertionError, subprocess.SubprocessError) as e:
        out["signalled"] = f"could not signal job {job} in the middle: {e}"
    return out


def _wait_rounds(log_path: Path, n: int, job: str, cluster, timeout: float = 120) -> None:
    from podracer_hpc.files.h5log import LogError, read_log

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if log_path.exists() and len(read_log(log_path)["tournament"].get("round", [])) >= n:
                return
        except (LogError, OSError, KeyError):
            pass  # the writer may be creating the file
        state = cluster.sacct_state(job)
        assert not (state and state[0].startswith(("COMPLETED", "FAILED", "CANCELLED"))), f"job {job} ended: {state}"
        time.sleep(0.2)
    raise AssertionError(f"{log_path} has not logged {n} rounds after {timeout}s")


def _output(cluster, job: str, run_dir: Path, stub: str = "") -> str:
    """A template job's output: the first lines (#SBATCH --output, in the submit directory), then
    the rest, which goes into the run directory (lib.sh, podracer_rundir)."""
    first = (cluster.work / (stub or f"podracer-{job}.out")).read_text()
    rest = run_dir / f"slurm-{job}.out"
    assert f"output continues in {rest}" in first, first
    return first + rest.read_text()


def _summary(text: str) -> dict:
    """The last JSON line a run printed (rank 0's summary)."""
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    assert lines, f"no summary line in:\n{text}"
    return json.loads(lines[-1])


@pytest.mark.slurm
def test_sbatch_test_only_accepts_every_template(cluster, tmp_path) -> None:
    for t in TEMPLATES:
        extra = ["--array=0-2%2"] if t == "sweep.sbatch" else []
        proc = cluster.run(
            "sbatch",
            "--test-only",
            *LOCAL,
            *extra,
            str(TPL / t),
            "jobs/quickstart.yaml",
            "slurm_templates/sweeps/pods.txt",
            cwd=tmp_path,
            check=False,
        )
        assert proc.returncode == 0 and "to start at" in proc.stderr, f"{t}: {proc.stdout}{proc.stderr}"
        # the DGX defaults ask for 8 GPUs and 16 CPUs per task, beyond these nodes (2 CPUs, 2
        # stand-in GPUs): the request is real
        bare = cluster.run("sbatch", "--test-only", str(TPL / t), cwd=tmp_path, check=False)
        assert bare.returncode != 0 and "node configuration is not available" in bare.stderr, f"{t}: {bare.stderr}"
    # submit.sh: the site's partition reaches sbatch
    proc = cluster.run(
        "bash", str(TPL / "submit.sh"), "--test-only", *LOCAL, str(TPL / "tournament.sbatch"), cwd=tmp_path, check=False
    )
    assert proc.returncode == 0 and "in partition debug" in proc.stderr, proc.stderr
    other = dataclasses.replace(cluster, env={**cluster.env, "PODRACER_PARTITION": "nosuchpartition"})
    proc = other.run(
        "bash", str(TPL / "submit.sh"), "--test-only", *LOCAL, str(TPL / "tournament.sbatch"), cwd=tmp_path, check=False
    )
    assert proc.returncode != 0 and "partition" in proc.stderr.lower(), proc.stderr


def _check_logs(run_dir: Path, pods: int) -> list[dict]:
    from podracer_hpc.files.h5log import read_log

    logs = []
    for r in range(pods):
        log = read_log(run_dir / "logs" / f"quickstart_rank{r}.h5")
        rounds = [int(x) for x in log["tournament"]["round"]]
        assert rounds == list(range(ROUNDS)), f"rank {r}: rounds logged {rounds}"
        updates = [int(x) for x in log["train"]["update"]]
        assert updates == list(range(1, STEPS // BATCH + 1)), f"rank {r}: updates logged {updates}"
        assert int(log["train"]["env_steps"][-1]) == STEPS, f"rank {r}"
        logs.append(log)
    return logs


@pytest.mark.slurm
def test_tournament_runs_on_two_nodes_and_completes(cluster, jobs) -> None:
    job = jobs["baseline"]
    state = cluster.wait_terminal(job, timeout=600)
    run_dir = cluster.work / "runs" / f"quickstart-{job}"
    out = _output(cluster, job, run_dir)
    assert state == ("COMPLETED", "0:0"), f"job {job}: {state}\n{out}"
    summary = _summary(out)
    assert summary["pods"] == 4 and summary["rounds"] == ROUNDS and summary["env_steps"] == 4 * STEPS, summary
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    logs = _check_logs(run_dir, 4)
    slurm = [log["attrs"]["slurm"] for log in logs]
    assert [s.get("SLURM_NODEID") for s in slurm] == ["0", "0", "1", "1"], slurm  # 2 ranks per node
    assert {s.get("SLURM_JOB_ID") for s in slurm} == {job}, slurm
    assert {log["attrs"]["world_size"] for log in logs} == {4}
    assert "srun --mpi=pmi2" in out and "complete:" in out and "requeue" not in out, out
    # srun got the job's --cpus-per-task (1 here: LOCAL) and ran the code snapshot's job file
    snap = re.search(r"code: snapshot (\S+) \(revision (\S+)\) of " + re.escape(str(REPO)), out)
    assert snap and f"--cpus-per-task=1 podracer train {snap.group(1)}/quickstart.yaml" in out, out
    code = Path(snap.group(1)) / "podracer_hpc" / "launch" / "slurm.py"
    assert code.read_bytes() == (REPO / "podracer_hpc" / "launch" / "slurm.py").read_bytes()
    assert f"env PYTHONPATH={snap.group(1)}" in out and "env HDF5_USE_FILE_LOCKING=BEST_EFFORT" in out, out


@pytest.mark.slurm
def test_signalled_tournament_requeues_resumes_and_finishes_once(cluster, jobs) -> None:
    """USR1 to the batch shell in the middle (sent by the `jobs` fixture after 2 of 6 rounds)."""
    from podracer_hpc.pool.leaderboard import Leaderboard

    job = jobs["preempt"]
    assert jobs["signalled"] == "ok", jobs["signalled"]
    run_dir = cluster.work / "runs" / f"quickstart-{job}"
    state = cluster.wait_terminal(job, timeout=600)
    out = _output(cluster, job, run_dir)
    assert state == ("COMPLETED", "0:0"), f"job {job}: {state}\n{out}"

    # the relay and the requeue
    assert "batch shell got SIGUSR1: sending SIGUSR1 to the srun step" in out, out
    assert out.count("stopped by signal SIGUSR1") == 4, out
    assert "every rank checkpointed and stopped (exit 75); requeueing job" in out, out
    history = cluster.run("sacct", "-n", "-P", "-X", "-D", "-j", job, "-o", "State,ExitCode").stdout.split()
    assert history == ["REQUEUED|0:0", "COMPLETED|0:0"], history
    assert re.search(r"\bRestarts=1\b", cluster.run("scontrol", "show", "job", job).stdout)
    assert f"tournament: job {job}, restart 1," in out, out  # SLURM_RESTART_COUNT in the second run
    assert out.count("resuming from") == 4, out
    assert "made at the first start; reused" in out.split("requeueing job")[1], out  # the same code
    interrupted = _summary(out.split("requeueing job")[0])
    assert interrupted.get("complete") is False and 0 < interrupted["env_steps"] < 4 * STEPS, interrupted

    # the end state: as if it had never stopped
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["pods"] == 4 and summary["rounds"] == ROUNDS, summary
    assert summary["env_steps"] == 4 * STEPS and "complete" not in summary, summary  # = the uninterrupted run
    _check_logs(run_dir, 4)
    board = Leaderboard(run_dir / "leaderboard")
    entries = board.list()
    assert 1 <= len(entries) <= 4, entries  # top_k 4 of jobs/quickstart.yaml
    for e in entries:
        board.load(e.id)  # verifies the checksum and the format
    names = sorted(p.name for p in board.entries_dir.iterdir())
    assert names == sorted([f"{e.id}.json" for e in entries] + [f"{e.id}.safetensors" for e in entries]), names


@pytest.mark.slurm
def test_array_throttled_later_task_joins_shared_leaderboard(cluster, jobs) -> None:
    array, steps = jobs["array"], SWEEP_STEPS
    end = time.monotonic() + 300
    rows: dict[str, list[str]] = {}
    while time.monotonic() < end:
        out = cluster.run(
            "sacct", "-n", "-P", "-X", "-j", array, "-o", "JobID,State,ExitCode,Start,End", check=False
        ).stdout
        rows = {r.split("|")[0]: r.split("|")[1:] for r in out.split()}
        if len(rows) == 3 and all(
            v[0].startswith(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")) for v in rows.values()
        ):
            break
        time.sleep(0.5)
    outs = {t: (cluster.work / f"podracer-sweep-{array}_{t}.out") for t in range(3)}
    text = {t: p.read_text() if p.exists() else "(no output)" for t, p in outs.items()}
    for t in range(3):  # the rest of each task's output is in its run directory
        text[t] += "".join(
            f.read_text() for f in (cluster.work / "runs" / f"quickstart-{array}" / f"task{t}").glob("slurm-*.out")
        )
    assert sorted(rows) == [f"{array}_{t}" for t in range(3)], (rows, text)
    assert all(v[:2] == ["COMPLETED", "0:0"] for v in rows.values()), (rows, text)
    # %2: the third task started only after one of the first two had ended
    first_end = min(rows[f"{array}_0"][3], rows[f"{array}_1"][3])
    assert rows[f"{array}_2"][2] >= first_end, rows
    for t, pods in enumerate((2, 1, 2)):
        s = _summary(text[t])
        assert s["pods"] == pods and s["env_steps"] == pods * steps, (t, s)
    assert "--set seed=7" in text[2] and "--set seed=7" not in text[0]
    board = cluster.work / "runs" / f"quickstart-{array}" / "leaderboard"
    assert f"tournament.leaderboard_dir={board}" in text[0]
    # the later task started from the entries the earlier ones had published
    # (whether task 1 also joined depends on which of the first two published first: not asserted)
    # (a join evaluates an entry first: one that does not beat a fresh agent is skipped, saying so)
    considered = text[2].count("joined from leaderboard entry") + text[2].count("does not beat a fresh agent")
    assert considered >= 2, text[2]
    assert len(list((board / "entries").glob("*.json"))) >= 1


@pytest.mark.slurm
def test_a_warning_signal_to_the_whole_job_requeues_and_resumes(cluster) -> None:
    """`scancel --signal=USR2 --full`: the batch shell (trapped), srun and every rank get
    the signal at once; the ranks checkpoint, the job requeues itself and completes, each update once."""
    total = 12 * INTERVAL
    job = _sbatch(
        cluster,
        "-N1",
        *LOCAL,
        "--time=5",
        str(TPL / "tournament.sbatch"),
        "jobs/quickstart.yaml",
        *FAST,
        "--set",
        f"total_env_steps={total}",
    )
    run_dir = cluster.work / "runs" / f"quickstart-{job}"
    _wait_rounds(run_dir / "logs" / "quickstart_rank0.h5", 1, job, cluster)
    cluster.run("scancel", "--signal=USR2", "--full", job)
    state = cluster.wait_terminal(job, timeout=600)
    out = _output(cluster, job, run_dir)
    assert state == ("COMPLETED", "0:0"), f"job {job}: {state}\n{out}"
    assert "batch shell got SIGUSR2" in out and "requeueing job" in out, out
    history = cluster.run("sacct", "-n", "-P", "-X", "-D", "-j", job, "-o", "State,ExitCode").stdout.split()
    assert history == ["REQUEUED|0:0", "COMPLETED|0:0"], history
    from podracer_hpc.files.h5log import read_log

    for r in range(2):
        log = read_log(run_dir / "logs" / f"quickstart_rank{r}.h5")
        assert [int(x) for x in log["train"]["update"]] == list(range(1, total // BATCH + 1)), f"rank {r}"
        assert [int(x) for x in log["tournament"]["round"]] == list(range(total // INTERVAL)), f"rank {r}"
