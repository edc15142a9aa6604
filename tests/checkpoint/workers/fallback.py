"""Run under `mpiexec -n 2`: restore() from DIR (argv[1]) on every rank; rank 0 reads and broadcasts. One RESULT
line per rank: the step it resumed from, or the error it raised (every rank must raise the same one)."""

import json
import os
import sys

import numpy as np

import hpcvod.runtime as hvd
from hpcvod.runtime.checkpoint import Checkpoint

hvd.init()
ckpt = Checkpoint(sys.argv[1], signals=())
try:
    state = ckpt.restore({"w": np.zeros(2), "step": 0})
    record = {"rank": hvd.rank(), "resumed_from": ckpt.resumed_from, "w": state["w"].tolist()}
except hvd.HpcvodInputError as exc:
    record = {"rank": hvd.rank(), "error": str(exc)}
os.write(1, ("RESULT " + json.dumps(record) + "\n").encode())   # one write: the ranks share stdout
hvd.shutdown()
