"""Run under `mpiexec -n 2`: the collective parts of hpcvod.runtime.checkpoint with a real MPI world.

argv: BASE_DIR. Rank 0 checkpoints into BASE_DIR/rank0, rank 1 points at the empty BASE_DIR/rank1: rank 1 must
still restore rank 0's state (restore broadcasts it). Only rank 1 receives SIGUSR1: stop_requested() must be
True on both ranks. One JSON line per rank on stdout.
"""

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

import hpcvod.runtime as hvd
from hpcvod.runtime.checkpoint import Checkpoint

hvd.init()
base = Path(sys.argv[1])
ckpt = Checkpoint(base / f"rank{hvd.rank()}")
initial = {"w": np.zeros(3), "step": 0, "data": {"epoch": 0, "batch": 0}}
fresh = ckpt.restore(initial)
assert ckpt.resumed_from is None and fresh["step"] == 0

before = ckpt.stop_requested()
if hvd.rank() == 1:
    os.kill(os.getpid(), signal.SIGUSR1)
after = ckpt.stop_requested()

state = {"w": np.arange(3.0) + 0.5, "step": 7, "data": {"epoch": 1, "batch": 4}}
ckpt.save(state)
files = sorted(os.listdir(base / f"rank{hvd.rank()}")) if (base / f"rank{hvd.rank()}").exists() else []

again = Checkpoint(base / f"rank{hvd.rank()}", signals=())
restored = again.restore(initial)
sys.stdout.write("RESULT " + json.dumps({
    "rank": hvd.rank(), "before": before, "after": after, "signalled": ckpt.signalled, "files": files,
    "resumed_from": again.resumed_from, "w": restored["w"].tolist(), "step": restored["step"],
    "data": restored["data"],
}) + "\n")  # one write: mpiexec may interleave the ranks' output between writes
sys.stdout.flush()
hvd.shutdown()
