"""MPI_Init under HPCVOD_INIT_TIMEOUT (hpcvod/runtime/mpi_start.py), in one process of the MPICH wheel.

hang-init, hang-lazy: a PMI server that accepts the rank's connection and never answers (a PMI service that is
down, an exchange that was cut): MPICH's MPI_Init then blocks for ever, reached through hvd.init() or through
the first use of hvd.Sum before init. ok: MPI_Init returns at once and the process outlives the deadline, so a
watcher left behind would kill it.
"""

import os
import socket
import sys
import time

mode = sys.argv[1]
if mode.startswith("hang"):
    silent_pmi = socket.socket()
    silent_pmi.bind(("127.0.0.1", 0))
    silent_pmi.listen(4)
    os.environ.update(PMI_PORT=f"127.0.0.1:{silent_pmi.getsockname()[1]}", PMI_RANK="3", PMI_SIZE="4",
                      PMI_ID="3")

import numpy as np  # noqa: E402

import hpcvod.runtime as hvd  # noqa: E402

if mode == "hang-lazy":
    op = hvd.Sum
else:
    hvd.init()
print("MPI_Init returned", flush=True)
deadline = float(os.environ.get("HPCVOD_INIT_TIMEOUT", "0"))
time.sleep(deadline + 1.5)
print("sum", hvd.allreduce(np.ones(3), op=hvd.Sum).tolist(), flush=True)
