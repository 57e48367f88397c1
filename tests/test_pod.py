"""The pod and the rank program: exact resume, checkpoint safety, errors that say what to do."""

import json

import pytest
import torch

from podracer_hpc.config import load_config
from podracer_hpc.files import safeio
from podracer_hpc.files.h5log import read_log
from podracer_hpc.pod import Pod

SMALL = [
    "env.num_envs=64",
    "agent.rollout_steps=8",
    "agent.num_minibatches=4",
    "agent.update_epochs=2",
    "eval.interval_env_steps=1024",
    "eval.episodes=4",
    "log.progress_interval_s=0",
    "threads=1",
]


def small(task: str = "pendulum", updates: int = 6) -> list[str]:
    return SMALL + [f"env.name={task}", f"total_env_steps={updates * 64 * 8}"]


@pytest.mark.parametrize("task", ["pendulum", "cartpole"])
def test_resume_is_exact(tmp_path, cli, task):
    """2N updates in one go == N updates, stop, load in a new process, N more: every tensor equal."""
    a, b = tmp_path / "a", tmp_path / "b"
    r = cli("train", "jobs/pendulum.yaml", "--run-dir", str(a), *sum((["--set", s] for s in small(task)), []))
    assert r.returncode == 0, r.stderr
    r1 = cli(
        "train",
        "jobs/pendulum.yaml",
        "--run-dir",
        str(b),
        "--stop-after-updates",
        "3",
        *sum((["--set", s] for s in small(task)), []),
    )
    assert r1.returncode == 75, r1.stderr  # stopped early, checkpointed: run again to resume
    assert "run again to resume" in r1.stderr
    mid, meta_mid, _ = safeio.load(b / "checkpoints" / "rank0.safetensors", "pod-state")
    assert meta_mid["updates"] == 3
    r2 = cli("train", "jobs/pendulum.yaml", "--run-dir", str(b), *sum((["--set", s] for s in small(task)), []))
    assert r2.returncode == 0, r2.stderr
    assert "resuming from" in r2.stderr
    ta, ma, _ = safeio.load(a / "checkpoints" / "rank0.safetensors", "pod-state")
    tb, mb, _ = safeio.load(b / "checkpoints" / "rank0.safetensors", "pod-state")
    assert ma["updates"] == mb["updates"] == 6
    assert set(ta) == set(tb)
    # The run actually moved: the resumed half changed the network.
    assert not torch.equal(mid["net.actor.0.weight"], tb["net.actor.0.weight"])
    for k in ta:
        assert torch.equal(ta[k], tb[k]), f"tensor {k} differs after resume"
    assert ma["optim_param_groups"] == mb["optim_param_groups"]
    # Same summary too (wall time aside).
    sa, sb = json.loads(r.stdout.strip().splitlines()[-1]), json.loads(r2.stdout.strip().splitlines()[-1])
    for k in ("env_steps", "best_return", "final_return"):
        assert sa[k] == sb[k]


def test_resume_drops_log_rows_after_checkpoint(tmp_path):
    """Rows logged after the checkpoint (work lost in a crash) are dropped, then redone once."""
    from podracer_hpc.rank.program import train

    cfg = load_config(None, small("pendulum", updates=4))
    run = tmp_path / "run"
    res = train(cfg, run, stop_after_updates=2, quiet=True)
    assert not res.complete
    # Simulate a crash after more updates were logged but before they were checkpointed:
    ckpt = run / "checkpoints" / "rank0.safetensors"
    saved = ckpt.read_bytes()
    train(cfg, run, stop_after_updates=1, quiet=True)
    ckpt.write_bytes(saved)  # back to the 2-update checkpoint; the log has 3 train rows
    res = train(cfg, run, quiet=True)
    assert res.complete
    log = read_log(run / "logs" / "pendulum_rank0.h5")
    assert list(log["train"]["update"]) == [1, 2, 3, 4]  # updates completed
    steps = log["train"]["env_steps"]
    assert list(steps) == sorted(set(steps))


def test_corrupt_checkpoint_falls_back_to_prev_and_is_kept(tmp_path, cli):
    """A corrupt checkpoint is set aside (kept as evidence) and the run resumes from .prev, saying
    why; with .prev corrupt too nothing can be resumed: exit 2 naming the checksum error, nothing touched."""
    run = tmp_path / "run"
    args = sum((["--set", s] for s in small("pendulum", 2)), [])
    assert (
        cli("train", "jobs/pendulum.yaml", "--run-dir", str(run), "--stop-after-updates", "1", *args).returncode == 75
    )
    ckpt = run / "checkpoints" / "rank0.safetensors"
    prev = run / "checkpoints" / "rank0.prev"
    assert prev.exists()  # the checkpoint a fresh pod writes before its first update
    blob = bytearray(ckpt.read_bytes())
    blob[-10] ^= 0xFF
    ckpt.write_bytes(bytes(blob))
    good_prev = prev.read_bytes()
    prev.write_bytes(good_prev[:100])
    r = cli("train", "jobs/pendulum.yaml", "--run-dir", str(run), *args)
    assert r.returncode == 2
    assert "checksum mismatch" in r.stderr and str(ckpt) in r.stderr and "truncated or corrupt" in r.stderr
    assert ckpt.read_bytes() == bytes(blob) and prev.read_bytes() == good_prev[:100]  # evidence kept
    prev.write_bytes(good_prev)
    r = cli("train", "jobs/pendulum.yaml", "--run-dir", str(run), *args)
    assert r.returncode == 0, r.stderr
    assert "checksum mismatch" in r.stderr and "resuming from its .prev (update 0)" in r.stderr
    assert (run / "checkpoints" / "rank0.safetensors.corrupt").read_bytes() == bytes(blob)
    assert list(read_log(run / "logs" / "pendulum_rank0.h5")["train"]["update"]) == [1, 2]


def test_foreign_checkpoint_is_never_loaded(tmp_path):
    from safetensors.torch import save_file

    p = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(3)}, str(p))
    pod = Pod(load_config(None, small()))
    with pytest.raises(safeio.StateFileError, match="not one written by podracer-hpc"):
        pod.load(p)
    p.write_bytes(b"\x80\x04\x95" + b"pickle" * 20)  # a pickle is not even parsed as one
    with pytest.raises(safeio.StateFileError, match="truncated or corrupt"):
        pod.load(p)


def test_checkpoint_of_another_task_or_shape_is_refused(tmp_path):
    pend = Pod(load_config(None, small("pendulum")))
    pend.save(tmp_path / "p.safetensors")
    cart = Pod(load_config(None, small("cartpole")))
    with pytest.raises(safeio.StateFileError, match="trained on task 'pendulum'"):
        cart.load(tmp_path / "p.safetensors")
    wider = Pod(load_config(None, small("pendulum") + ["agent.hidden_sizes=[16]"]))
    with pytest.raises(safeio.StateFileError, match="does not fit this pod"):
        wider.load(tmp_path / "p.safetensors")


def test_resume_with_another_config_is_refused(tmp_path, cli):
    run = tmp_path / "run"
    args = sum((["--set", s] for s in small("pendulum", 2)), [])
    assert (
        cli("train", "jobs/pendulum.yaml", "--run-dir", str(run), "--stop-after-updates", "1", *args).returncode == 75
    )
    r = cli("train", "jobs/pendulum.yaml", "--run-dir", str(run), *args, "--set", "agent.learning_rate=0.5")
    assert r.returncode == 2
    assert "agent.learning_rate" in r.stderr and "new --run-dir" in r.stderr
    # Changing only the budget is allowed (extend a run).
    r = cli("train", "jobs/pendulum.yaml", "--run-dir", str(run), *args, "--set", f"total_env_steps={3 * 512}")
    assert r.returncode == 0, r.stderr


def test_nan_in_training_stops_with_a_clear_error(tmp_path, cli):
    args = sum((["--set", s] for s in small("pendulum", 4)), [])
    r = cli(
        "train",
        "jobs/pendulum.yaml",
        "--run-dir",
        str(tmp_path / "r"),
        *args,
        "--set",
        "agent.learning_rate=1e30",
        "--set",
        "agent.max_grad_norm=1e30",
        "--set",
        "agent.anneal_lr=false",
    )
    assert r.returncode == 2, r.stderr
    assert "loss is nan" in r.stderr.lower() and "learning_rate" in r.stderr


def test_eval_is_deterministic_and_does_not_disturb_training():
    cfg = load_config(None, small())
    p1, p2 = Pod(cfg), Pod(cfg)
    p1.train_iteration()
    p2.train_iteration()
    r1 = p1.evaluate(7)
    assert torch.equal(r1, p1.evaluate(7))  # same start states, same deterministic policy
    assert not torch.equal(r1, p1.evaluate(8))  # other start states
    p1.train_iteration()
    p2.train_iteration()
    assert torch.equal(p1.agent.net.actor[0].weight, p2.agent.net.actor[0].weight)


def test_refuses_to_run_launcher_ranks_that_are_not_one_world(tmp_path):
    """srun started 2 tasks but MPI sees a world of 1 each (wrong --mpi plugin): never run 2 rank-0s."""
    from podracer_hpc.cluster.mpi import Comm
    from podracer_hpc.rank.program import TrainingError, train

    lonely = Comm(note="world of one: MPI sees 1 rank", launcher_size=2)
    with pytest.raises(TrainingError, match="do not form one MPI world.*--mpi"):
        train(load_config(None, small()), tmp_path / "r", comm=lonely, quiet=True)
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_thread_count_follows_the_cpus_given(monkeypatch):
    from podracer_hpc.cluster.device import set_cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert set_cpu_threads(0, 1) == 1
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    assert set_cpu_threads(0, 1) == 1  # bound to one CPU
    assert set_cpu_threads(3, 1) == 3  # an explicit setting wins
