"""Shared-filesystem load of a tournament: filesystem calls on the leaderboard (and the run's
round listings) per pod and round, counted with strace, as the pool grows.

    python bench/leaderboard_fsops.py                                   # 16, 256, 4,096 pods
    python bench/leaderboard_fsops.py --pods 16 256 --compare cdfcc1d   # beside an earlier revision
    python bench/leaderboard_fsops.py --end-to-end --pods 2             # a real 2-pod quickstart job

Simulated pods (the default): each rank's real :class:`pool.Pool` driving the real
:class:`leaderboard.Leaderboard` (and async PBT's :class:`population.Population`) on this disk, for
both round modes (``collective``, ``async``) and both rules (``elegantrl``, ``pbt``). What is
simulated, because it cannot run here at 4,096: the MPI world and the pods' training and
evaluation (a pod is a small tensor and a quality; its episode returns are that quality plus noise
common to every pod on the same start states, so the rules see realistic, comparable fitness).

The world: collective rounds run one thread per rank in one process, the ranks taking turns (a
baton, :class:`World`): a rank runs until its next collective, leaves its value and wakes the next
rank only; the last rank's arrival completes the collective and wakes rank 0. Each step between two
collectives is thus run pod after pod, not at once as MPI ranks run it. The counts do not depend on
that order beyond run-to-run noise (the pods' qualities are drawn afresh each run): at 1,024 and
64 pods they agree with the earlier harness's (bench/HISTORY.md, fifth session). Until 2026-12-01
(fifth session) the world was a :class:`threading.Barrier` that woke all N threads at every
collective and let them run at once: they fought for the GIL, and at 4,096 threads a run went past
570 s (1,024 pods, ElegantRL: 227 s then, 13 s now; 4,096: 90-150 s now). Async rounds need no
world: one thread holds every pod's rounds in turn.

The whole process runs under ``strace --seccomp-bpf -f -y`` (only the counted calls stop the
process); the calls that name a path under the leaderboard or ``rounds/`` are attributed to the pod
whose thread made them (by thread id, told by a stat of the ``MARK`` path) and counted by kind:
metadata calls (open/create, stat, getdents, link, rename, unlink, chmod, mkdir) and fsyncs. A
shared filesystem's metadata server pays for each. The counts are the point, not the wall time.
Prints a table (mean and largest pod per round), then one line of JSON.
Needs strace (apt-get install strace).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CALLS = (
    "openat",
    "stat",
    "newfstatat",
    "statx",
    "lstat",
    "access",
    "faccessat",
    "faccessat2",
    "getdents64",
    "link",
    "linkat",
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "mkdir",
    "mkdirat",
    "chmod",
    "fchmod",
    "fchmodat",
    "fsync",
    "fdatasync",
)
LINE = re.compile(r"^(?P<tid>\d+)\s+(?P<call>[a-z0-9_]+)\((?P<args>.*)")
MARK = "/podracer-fsops-mark"  # a stat of this path tells the trace which thread is which pod


# ------------------------------------------------------------------------------------------ the worker
class World:
    """N threads as one MPI world whose ranks run one at a time, in rank order (a baton).

    A rank runs until its next collective, leaves its value there and hands the turn to the next
    rank; the last rank's arrival completes the collective, and the turn goes back to rank 0, which
    reads the result and runs on. Each rank waits on its own lock, so a hand-off wakes one thread,
    never all N, and only one thread ever wants the GIL (a :class:`threading.Barrier` woke all N at
    each collective and ran them at once: at 4,096 threads the harness spent its time in the GIL).
    Every rank is still its own thread, so the trace attributes its calls by thread id. What this
    changes: within one step between collectives, the pods' file calls come one pod after another
    instead of interleaved (MPI ranks run them at once).
    """

    def __init__(self, n: int):
        self.n, self.slots, self.result, self.broken = n, [None] * n, [], False
        self.turns = [threading.Lock() for _ in range(n)]
        for t in self.turns:
            t.acquire()

    def begin(self, rank: int) -> None:
        """Wait for this rank's first turn (the driver gives rank 0 its turn with :meth:`go`)."""
        self._wait(rank)

    def go(self) -> None:
        """Start the world: rank 0's turn."""
        self.turns[0].release()

    def collective(self, rank: int, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, once every rank has given its own."""
        if self.broken:
            raise threading.BrokenBarrierError
        self.slots[rank] = obj
        if rank == self.n - 1:  # the last one in: the collective is complete
            self.result, self.slots = self.slots, [None] * self.n
        self.turns[(rank + 1) % self.n].release()
        self._wait(rank)
        return self.result  # not replaced before every rank has read it: the next completion needs them all

    def end(self, rank: int) -> None:
        """This rank is done: the next one finishes its last step."""
        if rank + 1 < self.n:
            self.turns[rank + 1].release()

    def abort(self) -> None:
        """A rank failed: every waiting rank raises :class:`threading.BrokenBarrierError`."""
        self.broken = True
        for t in self.turns:
            try:
                t.release()
            except RuntimeError:  # not held: that rank is running (or done)
                pass

    def _wait(self, rank: int) -> None:
        self.turns[rank].acquire()
        if self.broken:
            raise threading.BrokenBarrierError


class ThreadComm:
    """What :class:`pool.Pool` uses of :class:`comm.Comm`, over a :class:`World` of threads."""

    def __init__(self, world: World, rank: int):
        self.world, self.rank, self.size, self.calls = world, rank, world.n, {}

    def allgather(self, obj: Any) -> list[Any]:
        return list(self.world.collective(self.rank, obj))

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.world.collective(self.rank, obj if self.rank == root else None)[root]

    def barrier(self) -> None:
        self.world.collective(self.rank, None)


class SimPod:
    """What :class:`pool.Pool` uses of :class:`pod.Pod`: an agent that is one tensor (its quality)."""

    def __init__(self, rank: int, seed: int, episodes: int):
        import torch

        self.torch, self.rank, self.episodes = torch, rank, episodes
        self.quality = float(torch.Generator().manual_seed(seed * 100_003 + rank).seed() % 1000) / 10.0
        self.lr, self.env_steps, self.kind, self.device = 3e-4, 0, "ppo", "cpu"

    def hparams(self, names: Any = None) -> dict[str, float]:
        return {"learning_rate": self.lr}

    def set_hparams(self, hp: dict[str, float]) -> None:
        self.lr = float(hp.get("learning_rate", self.lr))

    def agent_tensors(self) -> tuple[dict, dict]:
        t = self.torch.full((256,), self.quality)  # 1 KiB: the counts do not depend on the size
        return {"actor.w": t}, {"kind": self.kind, "env_steps": self.env_steps, "rank": self.rank}

    def returns(self, quality: float, seed: int):
        g = self.torch.Generator().manual_seed(int(seed) % (2**31))
        common = self.torch.randn(self.episodes, generator=g, dtype=self.torch.float64) * 20.0  # the start states
        own = self.torch.randn(self.episodes, dtype=self.torch.float64) * 2.0
        return common + own + quality

    def evaluate(self, seed: int, agent: Any = None, episodes: int = 0):
        return self.returns(self.quality if agent is None else agent, seed)

    def agent_from(self, tensors: dict, meta: dict, source: str = "") -> float:
        return float(tensors["actor.w"][0])

    def load_agent(self, tensors: dict, meta: dict, source: str = "", load_hparams: bool = True) -> None:
        self.quality = float(tensors["actor.w"][0])

    def reset_agent(self) -> None:
        self.quality = 0.0


def worker(args: argparse.Namespace) -> int:
    """One simulated pool: every pod holds ``--rounds`` rounds (its calls between marks in the trace)."""
    sys.path.insert(0, str(Path(os.environ.get("PODRACER_TREE", REPO))))
    from podracer_hpc.config import Config, from_dict
    from podracer_hpc.files.rundir import RunDir
    from podracer_hpc.pool.fitness import Fitness, eval_seed
    from podracer_hpc.pool.rounds import Pool

    cfg = from_dict(
        Config,
        {
            "name": "sim",
            "seed": 0,
            "eval": {"episodes": 8},
            "tournament": {"mode": args.rule, "sync": args.mode, "top_k": 8, "interval_env_steps": 1000},
        },
    )
    n = args.pods[0]
    world = World(n)
    rundir = RunDir(Path(args.run_dir), "sim")
    rundir.root.mkdir(parents=True, exist_ok=True)
    (rundir.root / "rounds").mkdir(exist_ok=True)
    errors: list[str] = []

    def fitness(pod: SimPod, i: int) -> Fitness:
        pod.env_steps += 1000
        pod.quality += 1.0  # training: everyone improves a little
        seed = eval_seed(0, "round", i) if args.mode == "collective" else eval_seed(0, "async")
        return Fitness(tuple(pod.evaluate(seed).tolist()), seed)

    if args.mode == "async":
        # Asynchronous pods need no world: one thread holds every pod's rounds in turn, in a new
        # random order each round (threads would measure the GIL, not the files). Each pod's
        # round is whole before the next begins: the burst of the first round is fully visible.
        import numpy as np

        world1 = World(1)
        pods = [SimPod(r, 0, 8) for r in range(n)]
        pools = []
        for r, pod in enumerate(pods):
            comm = ThreadComm(world1, 0)
            comm.rank, comm.size = r, n
            pools.append(Pool(cfg, comm, pod, rundir, "4242", lambda m: None))
        order = np.random.default_rng(0)
        for i in range(args.rounds):
            for r in order.permutation(n).tolist():
                os.path.exists(f"{MARK}-start-{r}")
                pools[r].async_round(i, fitness(pods[r], i), 0.0)
                os.path.exists(f"{MARK}-end")
        return 0

    # Every rank of a collective round computes the same decisions from the same table (O(N) each:
    # 80 ms at 4,096 pods, in parallel on real nodes); the threads here would compute them N times
    # one after the other, so the first rank's are shared. No file is touched by it.
    import podracer_hpc.pool.rounds as pool_mod

    decided: dict[int, Any] = {}
    real_decide = pool_mod.decide

    def decide_once(reports, entries, index, *a, **kw):
        if index not in decided:
            decided[index] = real_decide(reports, entries, index, *a, **kw)
        return decided[index]

    threading.stack_size(512 * 1024)

    def run(rank: int) -> None:
        try:
            world.begin(rank)
            comm, pod = ThreadComm(world, rank), SimPod(rank, 0, 8)
            pool = Pool(cfg, comm, pod, rundir, "4242", lambda m: None)
            comm.barrier()
            os.path.exists(f"{MARK}-start-{rank}")
            for i in range(args.rounds):
                fit = fitness(pod, i)
                pool.collective_round(i, fit, 0.0, comm.allgather(pool.report(fit)))
            os.path.exists(f"{MARK}-end")
            world.end(rank)
        except threading.BrokenBarrierError:
            pass  # another rank failed first: its error is the one reported
        except BaseException as e:  # noqa: BLE001 - reported, and the world is broken for everyone
            errors.append(f"rank {rank}: {type(e).__name__}: {e}")
            world.abort()

    # Patched for this world only: a caller in the same process (the tests run this worker
    # in-process) must get the real decide back, or its next round reads this world's decisions.
    pool_mod.decide = decide_once
    try:
        threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        world.go()
        for t in threads:
            t.join()
    finally:
        pool_mod.decide = real_decide
    if errors:
        print("\n".join(errors[:5]), file=sys.stderr)
        return 1
    return 0


# ------------------------------------------------------------------------------------------ the driver
def count(trace: Path, marks: tuple[str, ...], by_pod: bool) -> dict[int, Counter]:
    """Calls on ``marks`` paths per pod (a thread's calls between its marks ``-start-<pod>`` and
    ``-end`` are that pod's; all under key 0 when not ``by_pod``)."""
    per: dict[int, Counter] = defaultdict(Counter)
    current: dict[int, int] = {}
    for line in trace.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if not m:
            continue
        tid = int(m["tid"])
        if by_pod:
            if MARK in m["args"]:
                start = re.search(re.escape(MARK) + r"-start-(\d+)", m["args"])
                if start:
                    current[tid] = int(start[1])
                else:
                    current.pop(tid, None)
                continue
            if tid not in current:
                continue
        if not any(x in m["args"] for x in marks):
            continue
        key = current[tid] if by_pod else 0
        per[key]["fsync" if m["call"] in ("fsync", "fdatasync") else "metadata"] += 1
        per[key][m["call"]] += 1
    return per


def simulate(tree: Path, pods: int, mode: str, rule: str, rounds: int, work: Path) -> dict:
    run_dir = work / f"run-{pods}-{mode}-{rule}"
    trace = work / "trace.txt"
    cmd = [
        "strace",
        "--seccomp-bpf",
        "-f",
        "-y",
        "-qq",
        "-e",
        f"trace={','.join(CALLS)}",
        "-o",
        str(trace),
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--pods",
        str(pods),
        "--mode",
        mode,
        "--rule",
        rule,
        "--rounds",
        str(rounds),
        "--run-dir",
        str(run_dir),
    ]
    t0 = time.perf_counter()
    r = subprocess.run(
        cmd,
        env={**os.environ, "PODRACER_TREE": str(tree), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{tree} {pods} {mode} {rule}: exit {r.returncode}\n{r.stderr[-3000:]}")
    per = count(trace, (str(run_dir / "leaderboard"), str(run_dir / "rounds")), True)
    trace.unlink()
    shutil.rmtree(run_dir, ignore_errors=True)
    meta = [per[p]["metadata"] / rounds for p in range(pods)]
    fsync = [per[p]["fsync"] / rounds for p in range(pods)]
    total: Counter = sum((per[p] for p in range(pods)), Counter())
    return {
        "metadata": sum(meta) / pods,
        "fsync": sum(fsync) / pods,
        "metadata_max": max(meta),
        "fsync_max": max(fsync),
        "wall_s": round(wall, 1),
        "by_call": {k: round(v / pods / rounds, 2) for k, v in sorted(total.items()) if k not in ("metadata", "fsync")},
    }


def end_to_end(tree: Path, pods: int, rounds: int, out: Path) -> dict:
    """A real quickstart tournament of ``pods`` MPI ranks."""
    run_dir = out / "run"
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    batch = 64 * 16
    sets = [
        "env.num_envs=64",
        "agent.rollout_steps=16",
        "eval.episodes=2",
        "threads=1",
        "log.progress_interval_s=0",
        f"total_env_steps={rounds * 2 * batch}",
        f"tournament.interval_env_steps={2 * batch}",
        f"eval.interval_env_steps={2 * batch}",
        "tournament.top_k=4",
    ]
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.txt"
    cmd = [
        "strace",
        "--seccomp-bpf",
        "-f",
        "-y",
        "-qq",
        "-e",
        f"trace={','.join(CALLS)}",
        "-o",
        str(trace),
        mpiexec,
        "-n",
        str(pods),
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(run_dir),
        "--quiet",
        *sum((["--set", s] for s in sets), []),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)}
    env.pop("PODRACER_COMM", None)
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{tree}: exit {r.returncode}\n{r.stderr[-3000:]}")
    c = count(trace, (str(run_dir / "leaderboard"), str(run_dir / "rounds")), False)[0]
    n = pods * rounds
    return {
        "metadata": c["metadata"] / n,
        "fsync": c["fsync"] / n,
        "metadata_max": math.nan,
        "fsync_max": math.nan,
        "by_call": {k: round(v / n, 2) for k, v in sorted(c.items()) if k not in ("metadata", "fsync")},
    }


def checkout(rev: str, work: Path) -> Path:
    old = work / f"tree-{rev}"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(old), rev], check=True, capture_output=True
    )
    return old


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, nargs="+", default=[16, 256, 4096])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["collective", "async"], choices=["collective", "async"])
    ap.add_argument("--rules", nargs="+", default=["elegantrl", "pbt"], choices=["elegantrl", "pbt"])
    ap.add_argument("--compare", default="", help="an earlier revision measured beside this tree ('' = none)")
    ap.add_argument(
        "--compare-max-pods",
        type=int,
        default=256,
        help="the earlier revision only up to this many pods (its async PBT is quadratic)",
    )
    ap.add_argument("--end-to-end", action="store_true", help="a real MPI quickstart job instead of simulated pods")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="async", help=argparse.SUPPRESS)
    ap.add_argument("--rule", default="pbt", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not shutil.which("strace"):
        print("needs strace: apt-get install strace", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="podracer-fsops-"))
    trees = {"this tree": REPO}
    rows: list[dict] = []
    try:
        if args.compare:
            trees = {f"{args.compare} (before)": checkout(args.compare, work), **trees}
        for name, tree in trees.items():
            if args.end_to_end:
                for pods in args.pods:
                    rows.append(
                        {
                            "version": name,
                            "pods": pods,
                            "mode": "collective",
                            "rule": "elegantrl",
                            **end_to_end(tree, pods, args.rounds, work / f"e2e-{len(rows)}"),
                        }
                    )
                continue
            for mode in args.modes:
                for rule in args.rules:
                    for pods in args.pods:
                        if tree is not REPO and pods > args.compare_max_pods:
                            continue
                        r = simulate(tree, pods, mode, rule, args.rounds, work)
                        rows.append({"version": name, "pods": pods, "mode": mode, "rule": rule, **r})
                        print(
                            f"  {name} {mode} {rule} {pods} pods: {r['metadata']:.1f} metadata, "
                            f"{r['fsync']:.1f} fsync per pod and round ({r['wall_s']} s)",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        for tree in trees.values():
            if tree is not REPO:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True
                )
        shutil.rmtree(work, ignore_errors=True)
    print(f"leaderboard filesystem calls per pod and round ({args.rounds} rounds, strace; max: the busiest pod)")
    print(
        f"{'version':<18} | {'mode':<10} | {'rule':<9} | {'pods':>5} | {'metadata':>8} | {'max':>6} | "
        f"{'fsync':>5} | {'max':>5} | by call"
    )
    for r in rows:
        calls = ", ".join(f"{k} {v:g}" for k, v in sorted(r["by_call"].items(), key=lambda kv: -kv[1])[:6])
        print(
            f"{r['version']:<18} | {r['mode']:<10} | {r['rule']:<9} | {r['pods']:>5} | {r['metadata']:>8.1f} | "
            f"{r['metadata_max']:>6.1f} | {r['fsync']:>5.1f} | {r['fsync_max']:>5.1f} | {calls}"
        )
    flat = {}
    for mode in args.modes:
        for rule in args.rules:
            mine = {
                r["pods"]: r for r in rows if r["version"] == "this tree" and r["mode"] == mode and r["rule"] == rule
            }
            if len(mine) >= 2:
                lo, hi = mine[min(mine)], mine[max(mine)]
                flat[f"{mode}/{rule}"] = {
                    "metadata_ratio": round(hi["metadata"] / max(lo["metadata"], 1e-9), 3),
                    "fsync_ratio": round(hi["fsync"] / max(lo["fsync"], 1e-9), 3),
                    "max_metadata_ratio": round(hi["metadata_max"] / max(lo["metadata_max"], 1e-9), 3),
                }
    print(json.dumps({"bench": "leaderboard_fsops", "rounds": args.rounds, "rows": rows, "largest_vs_smallest": flat}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
