"""Run as a plain process: get_comm() must give a world of one without initializing MPI."""

import json
import sys

import podracer_hpc.cluster.mpi as comm_mod

imported_at_import = "mpi4py.MPI" in sys.modules
comm = comm_mod.get_comm()
payload = {"a": 1.5, "b": [1, 2]}
gathered = comm.allgather(payload)
result = {
    "mpi_imported_by_module_import": imported_at_import,
    "mpi_imported": "mpi4py.MPI" in sys.modules,
    "rank": comm.rank,
    "size": comm.size,
    "local_rank": comm.local_rank,
    "is_mpi": comm.is_mpi,
    "note": comm.note,
    "gathered": gathered,
    "gathered_is_copy": gathered[0] is not payload,
    "bcast": comm.bcast(payload),
    "sum": comm.allreduce_sum(3),
    "max": comm.allreduce_max(2.5),
}
comm.barrier()
print("RESULT " + json.dumps(result), flush=True)
