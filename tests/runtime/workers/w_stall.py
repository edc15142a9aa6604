"""The stall inspector: the last rank submits 'late.tensor' only after a delay (argv[1] seconds).

With HPCVOD_STALL_CHECK_TIME_SECONDS below the delay, rank 0 must warn that 'late.tensor' waits for the last
rank; the collective then completes normally. argv[2] == "never": the last rank never submits it (the job
must then be aborted by HPCVOD_STALL_SHUTDOWN_TIME_SECONDS).
"""

import sys
import time

import numpy as np

import hpcvod.runtime as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
delay = float(sys.argv[1])
never = len(sys.argv) > 2 and sys.argv[2] == "never"
hvd.allreduce(np.ones(4), name="warmup")
if rank == size - 1:
    time.sleep(delay)
    if never:
        time.sleep(3600)
got = hvd.allreduce(np.full(4, float(rank)), op=hvd.Sum, name="late.tensor")
assert np.array_equal(got, np.full(4, float(sum(range(size))))), got
if rank == 0:
    print("STALL WORKER DONE", flush=True)
hvd.shutdown()
