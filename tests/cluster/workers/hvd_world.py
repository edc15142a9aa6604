"""One line per rank from hpcvod's runtime: hvd.init() under whatever launcher started us, then an allreduce."""

import json
import socket
import sys

import numpy as np

import hpcvod.runtime as hvd

hvd.init()
summed = hvd.allreduce(np.array([hvd.rank() + 1.0, 2.0 ** hvd.rank()]), op=hvd.Sum)
sys.stdout.write("PROBE " + json.dumps({
    "host": socket.gethostname(),
    "rank": hvd.rank(), "size": hvd.size(),
    "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
    "allreduce": np.asarray(summed).tolist(),
}) + "\n")
sys.stdout.flush()
hvd.shutdown()
