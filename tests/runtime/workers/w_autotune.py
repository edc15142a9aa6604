"""Autotune on real ranks: a training-like loop (20 small tensors and one large one per step, asynchronous, then
synchronized) runs STEPS steps with HOROVOD_AUTOTUNE=1; each rank then prints the settings its engine applied,
in order, and whether rank 0's tuner has settled (test_autotune.py compares them across ranks and with the log)."""

import json
import os
import sys

import numpy as np

import hpcvod.runtime as hvd
from hpcvod.runtime import context

hvd.init()
grads = [np.ones(256, np.float32) for _ in range(20)] + [np.ones(1 << 18, np.float32)]
names = [f"grad.{i}" for i in range(len(grads))]
for step in range(int(sys.argv[1])):
    handles = [hvd.allreduce_async_(g, op=hvd.Sum, name=n) for g, n in zip(grads, names)]
    for h in handles:
        hvd.synchronize(h)
    assert all(float(g[0]) == hvd.size() for g in grads), [float(g[0]) for g in grads]
    for g in grads:
        g[...] = 1.0
lane = context.runtime().lanes[0]
tuned = [[p.fusion_threshold, p.cycle_time_ms, p.cache_enabled, p.hierarchical_allreduce] for p in lane.tuned]
line = json.dumps({"rank": hvd.rank(), "tuned": tuned, "settled": lane.tuner is None}, separators=(",", ":"))
os.write(1, f"TUNED {line}\n".encode())   # one short write: the ranks share stdout (long lines interleave)
hvd.shutdown()
