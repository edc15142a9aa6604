"""Horovod's test/parallel/test_process_sets_static.py in hpcvod's words, with MPI left to the training library.

The script tells mpi4py not to start MPI (``mpi4py.rc.initialize = False``, as Horovod's tests do), so
``hvd.init()`` must start it itself (MPI_Init_thread, MPI_THREAD_MULTIPLE) and finalize it at exit. Run under
``mpiexec -n N``; prints one ``rank R: ...`` line per step, checked by tests/frameworks/test_mpi_started_by_hpcvod.py.
Argument: the framework module to use (``tensorflow`` as in Horovod's test, or ``torch``).
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys

import mpi4py

mpi4py.rc.initialize = False
from mpi4py import MPI  # noqa: E402  (loaded, not started)

hvd = importlib.import_module(f"hpcvod.{sys.argv[1]}")
RANK, SIZE = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])


def say(line: str) -> None:
    print(f"rank {RANK}: {line}", flush=True)


# registered before hvd.init(), so it runs after hpcvod's own exit handlers: MPI must be finalized by then
atexit.register(lambda: say(f"at exit MPI finalized: {MPI.Is_finalized()}"))
assert not MPI.Is_initialized(), "nothing may start MPI before hvd.init()"

# Different process sets on different ranks, or the same ranks twice: refused on every rank
if RANK == 0:
    sets = [hvd.ProcessSet([0]), hvd.ProcessSet(range(1, SIZE)), hvd.ProcessSet(range(SIZE - 1, -1, -1)),
            hvd.ProcessSet([0])]
else:
    sets = [hvd.ProcessSet([0]), hvd.ProcessSet(reversed(range(1, SIZE))), hvd.ProcessSet(range(SIZE - 1, -1, -1)),
            hvd.ProcessSet([0])]
try:
    hvd.init(process_sets=sets)
except ValueError as exc:
    say(f"duplicate sets refused: {type(exc).__name__}")
else:
    raise AssertionError("hvd.init() accepted the same process set twice")

# The members' order does not matter: rank 0 lists them upwards, the others downwards
second = hvd.ProcessSet(range(1, SIZE)) if RANK == 0 else hvd.ProcessSet(reversed(range(1, SIZE)))
hvd.init(process_sets=[hvd.ProcessSet([0]), second])
say(f"thread level multiple: {MPI.Query_thread() == MPI.THREAD_MULTIPLE}")
assert hvd.global_process_set.process_set_id == 0
assert hvd.global_process_set.ranks == list(range(SIZE)), hvd.global_process_set.ranks
table = hvd.mpi_ops._basics._get_process_set_ids_and_ranks()
assert table == {0: list(range(SIZE)), 1: [0], 2: list(range(1, SIZE))}, table
say(f"process sets {table}")
MPI.COMM_WORLD.barrier()   # the script's own MPI calls work on the MPI hpcvod started
hvd.shutdown()
say("shut down")
