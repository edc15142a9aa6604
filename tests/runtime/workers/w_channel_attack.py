"""Strangers at the control channel while it is being set up; then the job must train and still detect a death.

Rank 1 holds the set-up window open (it connects 4 s late). Meanwhile a thread on rank 0's host (standing in for
another user's process: the listener cannot tell the difference) connects to the listener and sends: a hello
without a token, with a wrong token, with the right token but a rank out of range, the wrong pid for a rank, a
duplicate of a connected rank, a 100 MB line, garbage bytes, a forged abort, and one connection that never
speaks. The job then runs allreduces, and rank 2 kills itself: the others must abort naming it.
"""

import json
import os
import signal
import socket
import threading
import time

import numpy as np

import hpcvod.runtime as hvd
from hpcvod.runtime import channel, watchdog
from hpcvod.runtime.mpi_start import start_mpi

MPI = start_mpi()
me = MPI.COMM_WORLD.Get_rank()


def attack(port: int, token: str, identities: list) -> None:
    def send(payload: bytes, wait: float = 0.3) -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(payload)
                time.sleep(wait)
        except OSError:
            pass

    def hello(**fields) -> bytes:
        return (json.dumps({"t": "hello", **fields}) + "\n").encode()

    host2, pid2 = identities[2]
    silent = socket.create_connection(("127.0.0.1", port))   # never says anything
    send(hello(rank=1, pid=identities[1][1], host=identities[1][0]))
    send(hello(rank=1, pid=identities[1][1], host=identities[1][0], token="0" * 64))
    send(hello(rank=7, pid=1, host="x", token=token))
    send(hello(rank=1, pid=1, host=identities[1][0], token=token))
    time.sleep(0.5)                                           # rank 2 has connected by now
    send(hello(rank=2, pid=pid2, host=host2, token=token))
    send(b"x" * (100 * 1024 * 1024))
    send(bytes(range(256)) * 16 + b"\n")
    send(b'{"t": "abort", "reason": "forged", "kind": "failure"}\n')
    print("ATTACKS SENT", flush=True)
    time.sleep(5)
    silent.close()


if me == 0:
    real_accept = channel.ControlChannel._accept_ranks

    def accept(self, listeners, token, identities, *args):
        port = listeners[0].getsockname()[1]
        threading.Thread(target=attack, args=(port, token, identities), daemon=True).start()
        return real_accept(self, listeners, token, identities, *args)

    channel.ControlChannel._accept_ranks = accept
if me == 1:
    real_connect = watchdog.Watchdog.connect

    def late_connect(self, *args):
        time.sleep(4.0)
        return real_connect(self, *args)

    watchdog.Watchdog.connect = late_connect

hvd.init()
for step in range(20):
    out = hvd.allreduce(np.full(1000, float(hvd.rank())), op=hvd.Sum, name="grad")
    assert np.all(out == 3.0), out
print(f"rank {me} TRAINED OK", flush=True)
hvd.allreduce(np.ones(1), name="sync")
if me == 2:
    os.kill(os.getpid(), signal.SIGKILL)
for step in range(1000000):
    hvd.allreduce(np.ones(10), name="after")
