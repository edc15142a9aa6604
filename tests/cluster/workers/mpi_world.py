"""One line per rank: where it runs and what MPI world it is in (mpi4py only, no hpcvod), plus an allreduce."""

import json
import os
import socket

import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD
node = world.Split_type(MPI.COMM_TYPE_SHARED)
contribution = np.array([world.rank + 1.0, 2.0 ** world.rank])
total = np.empty_like(contribution)
world.Allreduce(contribution, total, op=MPI.SUM)
print("PROBE " + json.dumps({
    "host": socket.gethostname(),
    "rank": world.rank,
    "size": world.size,
    "node_rank": node.rank,
    "node_size": node.size,
    "slurm_procid": os.environ.get("SLURM_PROCID"),
    "slurm_localid": os.environ.get("SLURM_LOCALID"),
    "allreduce": total.tolist(),
    "library": MPI.Get_library_version().splitlines()[0].strip(),
}), flush=True)
