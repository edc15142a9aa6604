"""A bad setting (the test sets it on every rank: a value outside its bounds, a timeline in a missing folder):
hvd.init() must raise HpcvodConfigError, which this worker prints as one line naming its rank (exit status 3). A run that gets past init() does one
allreduce_async and says so: that is the failure the test looks for (an infinite cycle time ends the engine's
thread and leaves the allreduce unfinished for ever)."""

import os
import sys

import numpy as np

import hpcvod.runtime as hvd

rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
try:
    hvd.init()
except hvd.HpcvodConfigError as exc:
    os.write(1, f"rank {rank} refused: {exc}\n".encode())   # one write: the ranks share stdout
    from mpi4py import MPI   # init() started MPI before it raised, so that one bad rank ends the whole job
    MPI.COMM_WORLD.Barrier()  # every rank has printed before the first exit makes the launcher end the others
    sys.exit(3)
print(f"rank {rank} passed init()", flush=True)
total = hvd.synchronize(hvd.allreduce_async(np.ones(2), name="x", op=hvd.Sum))
print(f"rank {rank} allreduce {total.tolist()}", flush=True)
hvd.shutdown()
