"""Run under `mpiexec -n N`: exercise podracer_hpc.cluster.mpi and print one JSON line per rank.

Usage: ``mpiexec -n N python comm_check.py OUTDIR``. Each rank writes ``OUTDIR/rank<r>.json``
(files, not stdout: the launcher may interleave the ranks' output lines); tests/cluster/test_mpi.py
checks them, and imports :func:`tournament_digests` to compute the expected decisions without MPI.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from podracer_hpc.config import TournamentConfig
from podracer_hpc.pool.rules import PodReport, decide

ENTRIES = [("job0-0-0-aaaaaaaaaaaa", 1.25), ("job0-1-0-bbbbbbbbbbbb", 0.5)]


def report(rank: int, size: int) -> PodReport:
    """Rank ``rank``'s report: fitness 0,NaN,2,0,1,2,... so there are ties and a NaN pod."""
    fitness = float("nan") if rank == 1 else float(rank % 3)
    return PodReport(rank=rank, fitness=fitness, env_steps=1000, hparams={"lr": 1e-3 * (rank + 1)})


def tournament_digests(reports: list[PodReport], entries: list) -> dict[str, str]:
    """sha256 of every decision of round 7, per mode."""
    out = {}
    for mode in ("elegantrl", "pbt"):
        cfg = TournamentConfig(mode=mode, hparam_space={"lr": (1e-5, 1e-2, True)}, top_k=4)
        ds = decide(reports, entries, round=7, seed=123, cfg=cfg)
        out[mode] = hashlib.sha256(json.dumps([d.to_dict() for d in ds], sort_keys=True).encode()).hexdigest()
    return out


def main() -> None:
    from podracer_hpc.cluster.mpi import get_comm

    comm = get_comm()
    r, n = comm.rank, comm.size
    gathered = comm.allgather({"rank": r, "fitness": 1.5 * r, "steps": 1000 + r})
    root = n - 1
    bval = comm.bcast({"from": root, "x": [1.0, 2.0]} if r == root else None, root=root)
    total = comm.allreduce_sum(r + 1)
    biggest = comm.allreduce_max(10.0 * r)
    comm.barrier()
    # A tournament round as the rank program runs it: gathered reports, entries from rank 0.
    reports = comm.allgather(report(r, n))
    entries = comm.bcast(ENTRIES if r == 0 else None)
    result = {
        "rank": r,
        "size": n,
        "local_rank": comm.local_rank,
        "local_size": comm.local_size,
        "num_nodes": comm.num_nodes,
        "is_mpi": comm.is_mpi,
        "note": comm.note,
        "gathered": gathered,
        "bcast": bval,
        "sum": total,
        "max": biggest,
        "digests": tournament_digests(reports, entries),
    }
    (Path(sys.argv[1]) / f"rank{r}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
