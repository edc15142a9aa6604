"""One grouped allreduce of two small tensors around a 1 MiB one, with the timeline on (HPCVOD_TIMELINE): the
test reads which MPI_ALLREDUCE spans were fused (executors.ALONE_BYTES)."""

import numpy as np

import hpcvod.runtime as hvd

hvd.init()
tensors = [np.ones(256, np.float32), np.ones(1 << 18, np.float32), np.ones(256, np.float32)]
out = hvd.grouped_allreduce_(tensors, op=hvd.Sum, name="group")
assert all(float(t[0]) == hvd.size() for t in out)
hvd.shutdown()
