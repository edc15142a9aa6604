"""A rank killed with SIGKILL in the middle of training: the others must exit non-zero, naming it.

The victim (argv[1], default the last rank) kills itself after a few allreduces; the survivors keep reducing.
"""

import os
import signal
import sys
import time

import numpy as np

import hpcvod.runtime as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
victim = int(sys.argv[1]) if len(sys.argv) > 1 else size - 1
print(f"rank {rank} pid {os.getpid()} started", flush=True)
for step in range(1000000):
    if rank == victim and step == 20:
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(np.ones(1000), name="grad")
    if step == 19 and rank == 0:
        print("STEPS RUNNING", flush=True)
print(f"rank {rank}: the loop ended, which it never should", flush=True)
