"""Fault injection: one rank (the victim) misbehaves at one phase while the others carry on.

argv: VICTIM FAULT PHASE
  FAULT  exit (sys.exit(0): a clean leave), raise (an uncaught exception), kill (SIGKILL), stop (SIGSTOP)
  PHASE  before-init (MPI started, init() not called), in-init (inside init(), after its first collectives),
         mid-collective (the others wait in an allreduce), in-shutdown (inside hvd.shutdown())
HPCVOD_TEST_RANK0_LATE=SECONDS: rank 0 (not the victim) comes that late to init(), as a loaded node's rank may.
HPCVOD_TEST_RANK0_STOP=SECONDS: rank 0 (not the victim) is stopped (SIGSTOP) that long after it enters init().
The others call init(), run allreduces and shut down; every case must end the job within seconds, non-zero,
with the victim named somewhere in the output.
"""

import os
import signal
import sys
import threading
import time

import numpy as np

import hpcvod.runtime as hvd
from hpcvod.runtime import watchdog
from hpcvod.runtime.mpi_start import start_mpi

victim, fault, phase = int(sys.argv[1]), sys.argv[2], sys.argv[3]


def strike() -> None:
    print(f"victim {victim}: {fault} at {phase}", flush=True)
    if fault == "exit":
        sys.exit(0)
    if fault == "raise":
        raise RuntimeError(f"injected failure on rank {victim} at {phase}")
    os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    time.sleep(3600)


# MPI starts here, before init(), as the first use of hvd.Sum & co. would start it (MPI_Init under its deadline)
MPI = start_mpi()
me = MPI.COMM_WORLD.Get_rank()
if me == victim and phase == "before-init":
    strike()
if me == victim and phase == "in-init":
    real_connect = watchdog.Watchdog.connect

    def connect(self, *args, **kwargs):  # the first collectives of init() are done
        strike()
        return real_connect(self, *args, **kwargs)

    watchdog.Watchdog.connect = connect
if me == victim and phase == "in-shutdown":
    real_close = watchdog.Watchdog.close

    def close(self, *args, **kwargs):
        strike()
        return real_close(self, *args, **kwargs)

    watchdog.Watchdog.close = close

if me == 0 != victim:
    time.sleep(float(os.environ.get("HPCVOD_TEST_RANK0_LATE", "0")))
    if "HPCVOD_TEST_RANK0_STOP" in os.environ:
        threading.Timer(float(os.environ["HPCVOD_TEST_RANK0_STOP"]), os.kill, (os.getpid(), signal.SIGSTOP)).start()
hvd.init()
print(f"rank {me} initialised", flush=True)
steps = 3 if me == victim and phase == "in-shutdown" else 1000000
for step in range(steps):
    if me == victim and phase == "mid-collective" and step == 3:
        strike()
    hvd.allreduce(np.ones(100), name="grad")
hvd.shutdown()
print(f"rank {me}: finished, which only the victim in-shutdown should", flush=True)
