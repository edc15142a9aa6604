"""Settings that differ between ranks: rank 1 runs with other engine settings (or, with argv[1] == "bad",
rank 2 with a malformed one). init() must refuse on every rank, naming the settings and the ranks."""

import os
import sys

from mpi4py import MPI

import hpcvod.runtime as hvd

rank = MPI.COMM_WORLD.Get_rank()
if len(sys.argv) > 1 and sys.argv[1] == "bad":
    if rank == 2:
        os.environ["HPCVOD_CYCLE_TIME"] = "fast"
elif rank == 1:
    os.environ["HPCVOD_FUSION_THRESHOLD"] = "1000"
    os.environ["HPCVOD_HIERARCHICAL_ALLREDUCE"] = "1"
hvd.init()
print("init passed", flush=True)
