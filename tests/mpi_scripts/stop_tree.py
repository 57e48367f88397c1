"""Run under `mpiexec -n N`: stop notices flooding the ranks' tree (podracer_hpc.cluster.mpi), as the
rank program uses them, in three scenarios; rank 0 writes what every rank saw to OUTDIR/stop_tree.json.

Usage: ``mpiexec -n N python stop_tree.py OUTDIR``. Each scenario has a communicator of its own
(its own notice counters), and ends as the run program does: a meeting (:meth:`Comm.meet`), then
:meth:`Comm.settle_notices`, then one more gather of what each rank received in all.

- ``one``: the last rank (a leaf as deep as any) announces with a value (:data:`VALUE`, as a pod
  that reached the run's target announces its env steps), then goes to the meeting; every other
  rank polls :meth:`Comm.stop_announced` (as between updates) until it hears, then goes too;
- ``all``: every rank announces at once (Slurm signals every task), then goes to the meeting;
- ``waiting``: the last rank announces; every rank with children in the tree is already at the
  meeting (as ranks done training wait at the end), only the leaves poll: only ranks passing the
  notice on while they wait at a meeting can reach them.

tests/cluster/test_mpi.py checks the file.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from podracer_hpc.cluster.mpi import get_comm, stop_tree_neighbours

POLL_S = 0.001  # a (very short) update between two polls
VALUE = 123_456  # what the announcer's notice carries in "one"
GIVE_UP_S = 60.0  # a rank that never hears goes to the meeting anyway: the test fails, nothing hangs


def poll_until_heard(comm) -> bool:
    deadline = time.monotonic() + GIVE_UP_S
    while not comm.stop_announced():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def scenario(name: str) -> dict:
    comm = get_comm("mpi")
    r, n = comm.rank, comm.size
    origin = n - 1
    comm.barrier()
    t0 = time.time()
    heard_at = None
    if name == "all" or r == origin:
        comm.announce_stop(VALUE if name == "one" else 0)
    elif name == "one" or (name == "waiting" and len(stop_tree_neighbours(r, n)) == 1 and r != 0):
        if poll_until_heard(comm):
            heard_at = time.time()
    # "waiting": ranks with children go straight to the meeting, and hear (and pass on) there

    def part() -> dict:
        return {
            "rank": r,
            "announced": comm.announced,
            "sent": comm.notices_sent,
            "notified": list(comm.notified),
            "received": comm.notices_received,
            "hops": comm.notice_hops,
            "value": comm.notice_value,
            "heard_s": None if heard_at is None else heard_at - t0,
        }

    parts = comm.meet(part)
    comm.settle_notices([tuple(p["notified"]) for p in parts])
    received = comm.notices_received
    comm.barrier()  # every rank has settled: nothing more is on its way
    after = comm.allgather(
        {
            "received": received,
            "left": bool(comm._notices.iprobe()),
            "collectives": dict(comm.calls),
            "wall_s": time.time() - t0,
        }
    )
    return {"parts": parts, "after": after}


def main() -> None:
    out = {name: scenario(name) for name in ("one", "all", "waiting")}
    comm = get_comm("mpi")
    if comm.rank == 0:
        out["size"] = comm.size
        (Path(sys.argv[1]) / "stop_tree.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
