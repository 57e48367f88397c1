"""Run under `mpiexec -n N`: time the tournament's collectives through podracer_hpc.cluster.mpi.

Usage: ``mpiexec -n N python tests/mpi_scripts/comm_bench.py OUT.json [SECONDS]``.

Times, after a barrier, many iterations of

- ``allgather`` of one PodReport (what every rank sends each round), and
- ``bcast`` from rank 0 of a 1,000-entry candidates list (``[(entry_id, score)]``),

each for about SECONDS/2 of wall time (rank 0 decides when to stop, so every rank runs the same
number of iterations). Rank 0 writes OUT.json: seconds per operation (the slowest rank's mean,
and rank 0's median per-iteration time) and the pickled sizes. Imports neither torch nor pods.
"""

from __future__ import annotations

import json
import pickle
import statistics
import sys
import time

from podracer_hpc.agents.settings import MUTABLE_HPARAMS
from podracer_hpc.cluster.mpi import get_comm
from podracer_hpc.pool.rules import PodReport


def report(rank: int) -> PodReport:
    hp = {k: 1e-3 * (i + 1) * (rank + 1) for i, k in enumerate(MUTABLE_HPARAMS)}
    return PodReport(rank=rank, fitness=-150.0 - rank, env_steps=100_000 * (rank + 1), hparams=hp)


def candidates(n: int = 1000) -> list[tuple[str, float]]:
    return [(f"12345678_{i % 64}-{i % 1000}-{i // 1000}-{i:012x}", -100.0 - 0.5 * i) for i in range(n)]


def timed(comm, op, budget_s: float, max_iters: int = 20000) -> dict[str, float]:
    """Run ``op`` in lockstep until rank 0 has spent ``budget_s``; per-iteration times."""
    for _ in range(3):  # warm-up (connections, buffers)
        op()
    comm.barrier()
    times, n = [], 0
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        op()
        times.append(time.perf_counter() - t0)
        n += 1
        if n % 8 == 0:  # checking the clock costs a collective (untimed): only every 8 iterations
            stop = comm.rank == 0 and (time.perf_counter() - t_start >= budget_s or n >= max_iters)
            if comm.bcast(stop if comm.rank == 0 else None):
                break
    mean = sum(times) / len(times)
    slowest = comm.allreduce_max(mean)
    return {"iters": n, "mean_s_max_rank": slowest, "median_s_rank0": statistics.median(times)}


def main() -> None:
    out, budget = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    comm = get_comm("mpi")
    mine = report(comm.rank)
    cands = candidates() if comm.rank == 0 else None
    res = {
        "ranks": comm.size,
        "nodes": comm.num_nodes,
        "note": comm.note,
        "podreport_bytes": len(pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL)),
        "candidates_bytes": len(pickle.dumps(candidates(), protocol=pickle.HIGHEST_PROTOCOL)),
        "allgather": timed(comm, lambda: comm.allgather(mine), budget / 2),
        "bcast_1000": timed(comm, lambda: comm.bcast(cands), budget / 2),
    }
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
