"""One line per rank from hpcvod's runtime: hvd.init() under whatever launcher started us, then an allreduce."""

import json
import socket
import sys

import numpy as np

import hpcvod.runtime as hvd

hvd.init()
summed = hvd.allreduce(np.array([hvd.rank() + 1.0, 2.0 ** hvd.rank()]), op=hvd.Sum)
# A larger reduction (odd length: the hierarchical path's leftover elements too); with
# HPCVOD_HIERARCHICAL_ALLREDUCE=1 on several nodes it goes node-local reduce-scatter / cross / allgather.
big = hvd.allreduce(np.arange(1001, dtype=np.float64) * (hvd.rank() + 1), op=hvd.Sum, name="big")
ranks_sum = hvd.size() * (hvd.size() + 1) // 2
fused = hvd.grouped_allreduce([np.full(7, hvd.rank() + 1, np.int64), np.full(3, 1.0)], op=hvd.Max)
sys.stdout.write("PROBE " + json.dumps({
    "host": socket.gethostname(),
    "rank": hvd.rank(), "size": hvd.size(),
    "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
    "allreduce": np.asarray(summed).tolist(),
    "big_ok": bool(np.array_equal(big, np.arange(1001) * ranks_sum)),
    "grouped_ok": bool((fused[0] == hvd.size()).all() and (fused[1] == 1.0).all()),
    "hierarchical": bool(hvd.global_process_set._lane.executors.hierarchical),   # the engine used the node split
}) + "\n")
sys.stdout.flush()
hvd.shutdown()
