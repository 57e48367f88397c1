"""Small helpers shared by test modules (import as ``from helpers import ...``)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from podracer_hpc.cluster.caches import CACHE_VARS
from podracer_hpc.launch import LaunchError, find_mpiexec

REPO = Path(__file__).resolve().parent.parent
CACHE_HOST = socket.gethostname().split(".")[0]  # the name cluster/caches.node_caches gives this node's directory


def env_without_caches() -> dict[str, str]:
    """This process's environment without the compile-cache variables (cluster/caches.CACHE_VARS)
    and the PODRACER_ ones: what a fresh process whose caches nobody has set starts from."""
    return {k: v for k, v in os.environ.items() if k not in CACHE_VARS and not k.startswith("PODRACER_")}


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the `podracer` console entry point in a fresh process (as a user would). (Import it from
    here, not from conftest: tests/slurm has a conftest of its own, which `from conftest import`
    can pick once that tier is collected.)"""
    e = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    e.pop("PODRACER_COMM", None)
    return subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO,
        env=e,
    )


def run_mpi(n: int, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``mpiexec -n n python args...`` from the checkout, with this process's environment (the
    world chosen by the launcher, not PODRACER_COMM); skips where there is no mpiexec."""
    e = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    e.pop("PODRACER_COMM", None)
    return subprocess.run(
        [mpiexec_or_skip(), "-n", str(n), sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=e,
    )


def mpiexec_or_skip() -> str:
    """The mpiexec the launcher would use; skip (saying why) where there is none."""
    try:
        return find_mpiexec()
    except LaunchError as e:
        pytest.skip(str(e))


def rank_pids(run_dir) -> list[int]:
    """The python rank processes of a run (not mpiexec, not Hydra's proxies), from /proc."""
    from pathlib import Path

    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # argv[0], not /proc/<pid>/comm: torch (2.4, and others) renames its main thread "pt_main_thread"
        exe = Path(cmd[0].decode(errors="replace")).name if cmd and cmd[0] else ""
        if (
            exe.startswith("python")
            and b"podracer_hpc.cli" in cmd
            and b"mpirun" not in cmd  # not the relay
            and str(run_dir).encode() in cmd
        ):
            out.append(int(d.name))
    return sorted(out)


def assert_mujoco_contract(env, task: str, n: int, obs_dim: int, act_dim: int) -> None:
    """A MuJoCo adapter's shapes, dtypes and device on CPU, after a reset and one zero-action step."""
    import pytest
    import torch

    assert (env.obs_dim, env.act_dim, env.discrete, env.max_episode_steps) == (obs_dim, act_dim, False, 1000)
    assert env.action_low == pytest.approx(-0.4 if task == "humanoid" else -1.0) == -env.action_high
    obs = env.reset(0)
    assert obs.shape == (n, obs_dim) and obs.dtype == torch.float32 and obs.device == torch.device("cpu")
    obs, rew, term, trunc, info = env.step(torch.zeros(n, act_dim))
    assert obs.shape == (n, obs_dim) and obs.dtype == torch.float32
    assert rew.shape == (n,) and rew.dtype == torch.float32
    assert term.dtype == trunc.dtype == info["done"].dtype == torch.bool and term.shape == (n,)
    assert info["final_obs"].shape == (n, obs_dim)
    assert info["episode_return"].dtype == torch.float64 and info["episode_length"].dtype == torch.int64
    assert torch.isfinite(obs).all() and torch.isfinite(rew).all()


HOPPER_START = [1.25] + [0.0] * 10  # hopper's init qpos[1:] and qvel; reset noise is +-0.005


def random_actions(n: int, num_envs: int, act_dim: int, seed: int = 0, scale: float = 1.0) -> list:
    """``n`` uniform random action batches in [-scale, scale], from a seeded torch Generator."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [scale * (2 * torch.rand(num_envs, act_dim, generator=g) - 1) for _ in range(n)]


def assert_hopper_autoreset(env, n: int, steps: int, limit: int, rtol: float) -> None:
    """Hopper under random large actions: episodes end by falling (terminated) or by the step limit
    (truncated), each finished row restarts in the same step (obs is a start state, final_obs the
    episode's last state) and the episode statistics match what the test summed itself."""
    import torch

    env.reset(1)
    ret = torch.zeros(n, dtype=torch.float64)
    length = torch.zeros(n, dtype=torch.int64)
    n_term = n_trunc = 0
    for a in random_actions(steps, n, 3, seed=2):
        obs, rew, term, trunc, info = env.step(a)
        done, final = info["done"], info["final_obs"]
        ret += rew.double()
        length += 1
        assert not (term & trunc).any() and torch.equal(done, term | trunc)
        assert torch.equal(final[~done], obs[~done])  # unfinished rows: final_obs is the obs
        start = torch.as_tensor(HOPPER_START, dtype=torch.float32).expand_as(obs[done])
        assert torch.allclose(obs[done], start, atol=0.0051)  # restarted: gymnasium's start noise
        for i in torch.nonzero(done).flatten().tolist():
            assert not torch.allclose(final[i], obs[i])  # the last state, not the new start
        for i in torch.nonzero(term).flatten().tolist():  # a terminal state is unhealthy
            z, angle, rest = final[i, 0].item(), final[i, 1].item(), final[i, 1:]
            assert z <= 0.7 or abs(angle) >= 0.2 or rest.abs().max() >= 100, final[i]
            assert length[i] <= limit
        assert (length[trunc] == limit).all()
        assert torch.equal(info["episode_length"][done], length[done])
        assert torch.allclose(info["episode_return"][done], ret[done], rtol=rtol)
        n_term += int(term.sum())
        n_trunc += int(trunc.sum())
        ret[done] = 0
        length[done] = 0
    assert n_term > 0 and n_trunc > 0, (n_term, n_trunc)


def wait_for(cond, timeout: float, what: str, poll_s: float = 0.1) -> None:
    """Poll ``cond()`` until it is true; an AssertionError naming ``what`` after ``timeout`` seconds."""
    import time

    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll_s)


def slurm_rank_pids(**ids: str) -> list[int]:
    """The rank processes (Python with a Slurm task id) on this host, which holds every logical node
    of the test cluster, whose Slurm environment has ``ids`` (e.g. ``SLURM_JOB_ID="12"``, or
    ``SLURM_ARRAY_JOB_ID="12", SLURM_ARRAY_TASK_ID="1"``). (`scancel --signal=KILL` is a cancel:
    Slurm sends SIGTERM first; tests that kill hard signal these.)"""
    from pathlib import Path

    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:  # argv[0], not comm: torch renames its main thread ("pt_main_thread")
            argv0 = (p / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            if not Path(argv0).name.startswith("python"):
                continue
            env = dict(kv.split("=", 1) for kv in (p / "environ").read_text().split("\0") if "=" in kv)
        except OSError:
            continue
        if all(env.get(k) == v for k, v in ids.items()) and "SLURM_PROCID" in env:
            pids.append(int(p.name))
    return pids


def tree_distances(origin: int, n: int) -> list[int]:
    """Hops from ``origin`` to every rank over the stop notices' tree (comm.stop_tree_neighbours,
    breadth-first; -1: not reached)."""
    from podracer_hpc.cluster.mpi import stop_tree_neighbours

    dist = [-1] * n
    dist[origin], frontier = 0, [origin]
    while frontier:
        nxt = []
        for r in frontier:
            for q in stop_tree_neighbours(r, n):
                if dist[q] < 0:
                    dist[q] = dist[r] + 1
                    nxt.append(q)
        frontier = nxt
    return dist
