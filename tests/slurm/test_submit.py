"""`podracer submit --executor slurm` on a real local Slurm cluster (4 logical nodes, 2 CPUs and 2
stand-in GPUs each: scripts/local_slurm.sh), and without Slurm (--dry-run)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podracer_hpc.files.h5log import read_log
from podracer_hpc.pool.leaderboard import Leaderboard

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
SHORT = [
    "--set",
    "env.num_envs=128",
    "--set",
    "agent.num_minibatches=2",
    "--set",
    "log.progress_interval_s=0",
    "--set",
    "threads=1",
]
# the mpich wheel of .venv speaks PMI-2 (submit's default, pmix, is the site MPI's and refused with the wheel)
MPI = ["--mpi", "pmi2"]


def submit(cluster, *args: str, timeout: float = 240, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "submit",
            "jobs/quickstart.yaml",
            "--executor",
            "slurm",
            *MPI,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=cluster.env,
    )


def start(cluster, *args: str, out: Path, cwd: Path = REPO) -> tuple[subprocess.Popen, str]:
    """Submit with --wait in the background; returns the process and the job id."""
    f = open(out, "w")
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "submit",
            "jobs/quickstart.yaml",
            "--executor",
            "slurm",
            "--wait",
            *MPI,
            *args,
        ],
        stdout=f,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=cluster.env,
        text=True,
    )
    end = time.monotonic() + 60
    while time.monotonic() < end:
        m = re.search(r"submitted Slurm job (\d+)", out.read_text())
        if m:
            return p, m.group(1)
        if p.poll() is not None:
            break
        time.sleep(0.2)
    p.kill()
    raise AssertionError(f"no job id from submit:\n{out.read_text()}")


def test_refused_before_queueing(slurm_cluster, tmp_path):
    r = submit(slurm_cluster, "--partition", "gpu-nope", "--run-dir", str(tmp_path / "a"))
    assert r.returncode == 2 and "does not exist; partitions here: debug" in r.stderr
    r = submit(slurm_cluster, "--nodes", "9", "--run-dir", str(tmp_path / "a"))
    assert r.returncode == 2 and "has only 4 nodes" in r.stderr
    r = submit(slurm_cluster, "--tasks-per-node", "2", "--gpus-per-node", "1", "--run-dir", str(tmp_path / "a"))
    assert r.returncode == 2 and "one rank on one GPU" in r.stderr
    r = submit(slurm_cluster, "--exclusive", "--run-dir", str(tmp_path / "a"))  # the nodes' GPUs held, unused
    assert r.returncode == 2 and "--exclusive on partition" in r.stderr and "--gpus-per-node" in r.stderr, r.stderr
    r = submit(slurm_cluster, "--time", "infinite", "--run-dir", str(tmp_path / "a"))
    assert r.returncode == 2 and "--time" in r.stderr
    queued = slurm_cluster.run("squeue", "-h", "-n", "podracer-quickstart").stdout.strip()
    assert queued == "" and not (tmp_path / "a").exists()


def test_two_node_tournament(slurm_cluster, tmp_path):
    run = tmp_path / "run"
    r = submit(
        slurm_cluster,
        "--nodes",
        "2",
        "--tasks-per-node",
        "2",
        "--time",
        "5",
        "--wait",
        "--run-dir",
        str(run),
        "--set",
        "total_env_steps=65536",
        "--set",
        "tournament.interval_env_steps=16384",
        *SHORT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["pods"] == 4 and summary["rounds"] == 4
    nodes = {read_log(run / "logs" / f"quickstart_rank{k}.h5")["attrs"]["slurm"]["SLURM_NODEID"] for k in range(4)}
    assert nodes == {"0", "1"}  # one MPI world over two logical nodes
    assert "rounds 4" in r.stderr  # live progress read from the logs


def test_array_tasks_join_the_shared_leaderboard(slurm_cluster, tmp_path):
    run = tmp_path / "sweep"
    # One pod per task: two MPI jobs starting at once on the logical nodes of ONE host can mix up
    # MPICH's shared-memory set-up (docs/local-slurm.md); on a real cluster they are separate hosts.
    r = submit(
        slurm_cluster,
        "--tasks-per-node",
        "1",
        "--array",
        "3%2",
        "--time",
        "5",
        "--wait",
        "--run-dir",
        str(run),
        "--set",
        "total_env_steps=32768",
        "--set",
        "tournament.interval_env_steps=16384",
        *SHORT,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert len([line for line in r.stdout.splitlines() if line.startswith("{")]) == 3
    joins = {}
    for t in range(3):
        log = read_log(run / f"task{t}" / "logs" / "quickstart_rank0.h5")
        joins[t] = [s for a, s in zip(log["tournament"]["action"], log["tournament"]["source"]) if a == "join"]
    # task 2 starts after a first task ended and must take the leaderboard's entries into account: it
    # joins one, or says why not (a join evaluates an entry first and skips one that does not beat a
    # fresh agent)
    said = "".join(f.read_text(errors="replace") for f in (run / "slurm").rglob("*_2_*log.err"))
    assert joins[2] or "does not beat a fresh agent" in said, f"task 2 did not consider the leaderboard: {joins}"
    assert not (joins[0] and joins[1]), "with %2 the first two tasks start together on an empty leaderboard"
    assert Leaderboard(run / "leaderboard").list()


# A preempted (USR2), hard-killed and requeued tournament that loses nothing: test_requeue.py.


@pytest.mark.parametrize("which", ["slurm_cluster", "slurm_cluster_noacct"])
def test_cancelled_job_ends_wait_with_a_clear_error(which, request, tmp_path):
    """--wait exits non-zero within 60 s of a scancel, naming the state and the log, with
    accounting and without it (there sacct knows nothing: scontrol still has the record)."""
    cluster = request.getfixturevalue(which)
    run = tmp_path / "run"
    proc, job = start(
        cluster,
        "--tasks-per-node",
        "2",
        "--time",
        "5",
        "--run-dir",
        str(run),
        "--set",
        "total_env_steps=10000000",
        *SHORT,
        out=tmp_path / "submit.out",
    )
    try:
        cluster.wait_squeue_state(job, "RUNNING", timeout=60)
        end = time.monotonic() + 90
        while not list((run / "logs").glob("*_rank1.h5")) and time.monotonic() < end:
            time.sleep(0.3)  # the ranks are training: a cancel now is a stop with checkpoints
        cluster.run("scancel", job)
        t0 = time.monotonic()
        proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "submit.out").read_text()
    assert proc.returncode == 1, out
    assert took < 60, f"--wait took {took:.0f} s to notice the cancel"
    assert f"Slurm job {job} ended CANCELLED" in out and "_log.err" in out, out
    assert '"complete": false' not in out.splitlines()[-1]  # no summary printed as if it had finished
    if which == "slurm_cluster_noacct":
        acct = cluster.run("sacct", "-n", "-X", "-j", job, check=False)
        assert job not in acct.stdout  # the no-accounting path really was taken


def test_job_that_can_never_start_is_an_error_not_a_wait(slurm_cluster_noacct, tmp_path):
    """A request beyond a partition's limit: refused before queueing when sinfo can tell; and if
    such a job is queued anyway (limits of a QOS or an association), --wait says it cannot start."""
    cluster = slurm_cluster_noacct
    cluster.run("scontrol", "create", "PartitionName=tiny", "Nodes=n4", "MaxTime=1", "State=UP")
    job = None
    try:
        r = submit(cluster, "--partition", "tiny", "--time", "5", "--wait", "--run-dir", str(tmp_path / "a"))
        assert r.returncode == 2 and "partition 'tiny' allows at most 1 minutes" in r.stderr, r.stderr
        assert cluster.run("squeue", "-h", "-p", "tiny").stdout.strip() == ""
        code = (
            "import sys, time\n"
            "from podracer_hpc import launch\n"
            "from podracer_hpc.config import load_config\n"
            f"r = launch.Request('jobs/quickstart.yaml', [], 'slurm', partition='tiny', time_min=5, mpi='pmi2', "
            f"run_dir={str(tmp_path / 'b')!r})\n"
            "launched = launch.submit_slurm(r, load_config(r.job_file))\n"
            "print('JOB', launched.jobs[0].job_id, flush=True)\n"
            "t0 = time.monotonic()\n"
            "try:\n"
            "    launch.wait(launched, timeout_s=60, poll_s=0.5)\n"
            "except launch.JobError as e:\n"
            "    print(f'TOOK {time.monotonic() - t0:.1f}'); print(e); sys.exit(e.exit_code)\n"
        )
        p = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, env=cluster.env
        )
        m = re.search(r"JOB (\d+)", p.stdout)
        job = m.group(1) if m else None
        assert p.returncode == 1, p.stdout + p.stderr
        # Slurm names the limit (PartitionTimeLimit) or, evaluating the partition first, its config
        assert re.search(rf"Slurm job {job} cannot start: Partition(TimeLimit|Config)", p.stdout), p.stdout
        assert f"scancel {job}" in p.stdout
        assert float(re.search(r"TOOK ([0-9.]+)", p.stdout).group(1)) < 30  # not a wait: Slurm says why at once
    finally:
        if job:
            cluster.run("scancel", job, check=False)
        cluster.run("scontrol", "delete", "PartitionName=tiny", check=False)


# ------------------------------------------------------------------------------------------
# Resources reach the job, a snapshot survives the checkout changing, no Slurm needed
# to see the script
# ------------------------------------------------------------------------------------------
def test_dry_run_shows_the_script_without_slurm(tmp_path):
    """PATH without sbatch, sinfo or srun (a laptop): the full script and its srun line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(shutil.which("git"))  # the revision of the snapshot it names
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env["PATH"] = str(bin_dir)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "podracer_hpc.cli",
            "submit",
            "jobs/quickstart.yaml",
            "--executor",
            "slurm",
            "--dry-run",
            "--nodes",
            "4",
            "--tasks-per-node",
            "8",
            "--gpus-per-node",
            "8",
            "--cpus-per-task",
            "16",
            "--exclusive",
            "--mem",
            "0",
            "--partition",
            "batch",
            "--sbatch",
            "reservation=dgx",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert shutil.which("sbatch", path=env["PATH"]) is None
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no Slurm here" in r.stderr
    for line in (
        "#SBATCH --cpus-per-task=16",
        "#SBATCH --exclusive",
        "#SBATCH --mem=0",
        "#SBATCH --reservation=dgx",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --nodes=4",
        "export SRUN_CPUS_PER_TASK=16",
    ):
        assert line in r.stdout, line
    srun = next(ln for ln in r.stdout.splitlines() if ln.startswith("srun "))
    assert "--mpi=pmix --cpus-per-task=16 --gpus-per-task=1" in srun and "wckey" not in r.stdout
    assert not (tmp_path / "run").exists()  # nothing written: no snapshot, no run dir


def _launch_lines(run: Path) -> list[str]:
    text = "".join(p.read_text(errors="replace") for p in sorted((run / "slurm").rglob("*_log.err")))
    return [ln for ln in text.splitlines() if ln.startswith("podracer task ")]


def test_cpus_per_task_gpus_and_sbatch_options_reach_the_running_job(slurm_cluster_noacct, tmp_path):
    """--cpus-per-task, --gpus-per-node (bound: one stand-in GPU per pod) and --sbatch pass-through
    as scontrol shows the job, and as each pod sees its task: SLURM_CPUS_PER_TASK, its CPU affinity
    (task/affinity binds what srun was given: both CPUs of the node only if srun got -c 2) and
    CUDA_VISIBLE_DEVICES. device=cpu: the pods use no GPU (this torch has none)."""
    cluster = slurm_cluster_noacct
    run = tmp_path / "run"
    r = submit(
        cluster,
        "--tasks-per-node",
        "1",
        "--cpus-per-task",
        "2",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--job-name",
        "pr-resources",
        "--sbatch",
        "comment=podracer-issue-14",
        "--wait",
        "--run-dir",
        str(run),
        "--set",
        "total_env_steps=4096",
        "--set",
        "tournament.mode=none",
        "--set",
        "device=cpu",
        *SHORT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    job = re.search(r"submitted Slurm job (\d+)", r.stderr).group(1)
    show = cluster.run("scontrol", "show", "job", job).stdout
    for field in (
        "JobName=pr-resources",
        "NumCPUs=2",
        "CPUs/Task=2",
        "Comment=podracer-issue-14",
        "TresPerNode=gres:gpu:1",
    ):
        assert field in show, (field, show)
    assert "WCKey" not in show or "WCKey=submitit" not in show
    (line,) = _launch_lines(run)
    assert "SLURM_CPUS_PER_TASK=2, CPUs 0-1, CUDA_VISIBLE_DEVICES=0," in line, line
    assert f"code {run}/code/" in line and "HDF5_USE_FILE_LOCKING=BEST_EFFORT" in line, line
    assert (run / "logs" / "quickstart_rank0.h5").exists()  # the snapshot's job file keeps its name (and the run's)


def test_two_pods_on_one_node_each_bound_to_its_own_stand_in_gpu(slurm_cluster_noacct, tmp_path):
    """Several pods per GPU node: 2 tasks x 2 GPUs on one node under the default binding (srun
    --gpus-per-task=1 --gpu-bind=single:1 --distribution=block:block). Real: Slurm's allocation of
    the node's two GRES GPUs, the step's binding and each task's CPU affinity. Stand-in: the GPUs
    are device files (scripts/local_slurm.sh) and this torch has no CUDA, so the pods train on the
    CPU (device=cpu) and the GPUs' NUMA nodes cannot be read (one socket, no gres.conf Cores=).
    Each pod sees exactly one GPU index, the two differ, and each runs on its own CPU."""
    cluster = slurm_cluster_noacct
    run = tmp_path / "run"
    r = submit(
        cluster,
        "--nodes",
        "1",
        "--tasks-per-node",
        "2",
        "--gpus-per-node",
        "2",
        "--cpus-per-task",
        "1",
        "--time",
        "5",
        "--wait",
        "--run-dir",
        str(run),
        "--set",
        "total_env_steps=2048",
        "--set",
        "device=cpu",
        *SHORT,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = sorted(_launch_lines(run))
    assert len(lines) == 2, lines
    seen = {}
    for line in lines:
        m = re.search(r"podracer task (\d) \(local (\d)\).*CPUs ([0-9,-]+), CUDA_VISIBLE_DEVICES=([^,]*),", line)
        assert m, line
        task, local, cpus, gpus = m.groups()
        assert task == local and gpus in ("0", "1") and "," not in cpus and "-" not in cpus, line  # one GPU, one CPU
        seen[task] = (cpus, gpus)
    assert len({c for c, _ in seen.values()}) == 2 and len({g for _, g in seen.values()}) == 2, seen
    script = next((run / "slurm").rglob("*_submission.sh")).read_text()
    assert "--gpus-per-task=1 --gpu-bind=single:1 --distribution=block:block" in script, script
    assert all((run / "logs" / f"quickstart_rank{i}.h5").exists() for i in (0, 1))


def test_gpus_asked_on_a_cpu_only_torch_fail_before_training(slurm_cluster_noacct, tmp_path):
    """device: auto on GPUs that this torch cannot use: an error that says how to get the CUDA
    build, not a silent run on the CPU."""
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch has CUDA: the stand-in GPUs would be tried for real")
    run = tmp_path / "run"
    r = submit(
        slurm_cluster_noacct,
        "--tasks-per-node",
        "1",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--wait",
        "--run-dir",
        str(run),
        "--set",
        "total_env_steps=4096",
        "--set",
        "tournament.mode=none",
        *SHORT,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CPU-only build" in r.stderr and "download.pytorch.org/whl/cu" in r.stderr, r.stderr
    assert not (run / "logs").exists() or not list((run / "logs").glob("*.h5"))  # no training started


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_requeued_job_runs_the_code_it_was_submitted_with(slurm_cluster_noacct, tmp_path):
    """Submit from a checkout, commit a change to it while the job runs, requeue the job: the
    requeued start runs the snapshot taken at submission (its path, its revision), not the change."""
    cluster = slurm_cluster_noacct
    clone = tmp_path / "checkout"
    shutil.copytree(REPO / "podracer_hpc", clone / "podracer_hpc", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "jobs", clone / "jobs")
    _git(clone, "init", "-q")
    _git(clone, "add", "-A")
    _git(clone, "commit", "-q", "-m", "the code as submitted")
    old_rev = _git(clone, "rev-parse", "--short", "HEAD")
    run, out = tmp_path / "run", tmp_path / "submit.out"
    proc, job = start(
        cluster,
        "--tasks-per-node",
        "1",
        "--time",
        "5",
        "--run-dir",
        str(run),
        "--timeout",
        "240",
        "--set",
        "total_env_steps=24576",
        "--set",
        "tournament.mode=none",
        *SHORT,
        out=out,
        cwd=clone,
    )
    try:
        # the checkout moves on once the job is submitted (its snapshot is taken at submission)
        init = clone / "podracer_hpc" / "__init__.py"
        init.write_text(init.read_text() + "\nimport sys as _s\nprint('NEW CODE', file=_s.stderr)\n")
        _git(clone, "commit", "-q", "-am", "a change after submission")
        new_rev = _git(clone, "rev-parse", "--short", "HEAD")
        check = subprocess.run([sys.executable, "-c", "import podracer_hpc"], cwd=clone, capture_output=True, text=True)
        assert "NEW CODE" in check.stderr  # the checkout itself now runs the new code
        # then the requeue lands as soon as the fresh start's checkpoint is written: the requeued
        # start resumes from it (waiting for the log alone raced it under load: the log opens just
        # before the first checkpoint; committing in between let a short run finish first)
        end = time.monotonic() + 120
        while (
            not (run / "checkpoints" / "rank0.safetensors").exists() and time.monotonic() < end and proc.poll() is None
        ):
            time.sleep(0.1)
        assert _launch_lines(run), out.read_text()
        cluster.run("scontrol", "requeue", job)
        assert proc.wait(timeout=240) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            cluster.run("scancel", job, check=False)
    text = out.read_text()
    assert "requeued (start 2)" in text, text
    lines = _launch_lines(run)
    assert len(lines) == 2, lines  # the first start and the requeued one
    snap = re.search(r"code snapshot (\S+) \(revision (\S+)\)", text)
    assert snap and snap.group(2) == old_rev != new_rev, text
    for line in lines:
        assert f"code {snap.group(1)}/podracer_hpc (revision {old_rev})" in line, line
    err = "".join(p.read_text(errors="replace") for p in (run / "slurm").rglob("*_log.err"))
    assert "NEW CODE" not in err and "resuming from" in err, err
    meta = json.loads(Path(snap.group(1), "SNAPSHOT.json").read_text())
    assert meta["revision"] == old_rev and meta["dirty"] is False and meta["source"] == str(clone / "podracer_hpc")


def test_a_warning_signal_to_the_whole_job_checkpoints_and_requeues(slurm_cluster_noacct, tmp_path):
    """`scancel --signal=USR2 --full` (the batch shell too: what a site's preemption or a
    user who signals everything does). The batch shell died of it and the job ended FAILED
    (JobLaunchFailure), not requeued; now it traps it, the ranks checkpoint, rank 0 requeues, and
    the job resumes and completes with every update logged once."""
    cluster, run, out = slurm_cluster_noacct, tmp_path / "run", tmp_path / "submit.out"
    total, per_update = 40 * 2048, 128 * 16
    proc, job = start(
        cluster,
        "--tasks-per-node",
        "2",
        "--time",
        "5",
        "--timeout",
        "600",
        "--run-dir",
        str(run),
        "--set",
        f"total_env_steps={total}",
        "--set",
        "tournament.interval_env_steps=16384",
        *SHORT,
        out=out,
    )
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end and proc.poll() is None:
            try:
                if len(read_log(run / "logs" / "quickstart_rank1.h5")["train"]["update"]) >= 3:
                    break
            except Exception:  # noqa: BLE001  (not there yet, or being written)
                pass
            time.sleep(0.2)
        assert proc.poll() is None, out.read_text()
        cluster.run("scancel", "--signal=USR2", "--full", job)
        assert proc.wait(timeout=600) == 0, out.read_text() + cluster.job_report(job)
    finally:
        if proc.poll() is None:
            proc.kill()
            cluster.run("scancel", job, check=False)
    text = out.read_text()
    assert "requeued (start 2)" in text and "FAILED" not in text, text
    summary = json.loads(text.strip().splitlines()[-1])
    assert summary["env_steps"] == 2 * total and summary.get("complete", True) is True, summary
    # every rank gets the signal; the first to act tells the others, so rank 0 may stop on
    # its own signal or on rank 1's notice (both seen); each rank resumes
    logs = {k: "".join(p.read_text(errors="replace") for p in (run / "slurm").rglob(f"*_{k}_log.err")) for k in (0, 1)}
    assert any("stopped by signal SIGUSR2" in t for t in logs.values()), logs
    for t in logs.values():
        assert "stopped by signal SIGUSR2" in t or "stopped by another rank's stop" in t, logs
        assert "resuming from" in t, logs
    for k in range(2):
        steps = [int(x) for x in read_log(run / "logs" / f"quickstart_rank{k}.h5")["train"]["env_steps"]]
        assert steps == list(range(per_update, total + 1, per_update)), f"rank {k}: each update once"
