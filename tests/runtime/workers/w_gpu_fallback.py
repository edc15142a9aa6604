"""The GPU path on a machine without a usable GPU: everything imports, nothing raises, every answer says why.

Run as a singleton (no launcher). Prints one "GPU FALLBACK {json}" line.
"""

import json

import numpy as np

import hpcvod.runtime as hvd
from hpcvod.runtime import gpu
from hpcvod.runtime.errors import HpcvodConfigError
from hpcvod.runtime.nccl import choose_backend

hvd.init()
report = {"nccl_built": hvd.nccl_built(), "cuda_built": hvd.cuda_built(), "why": gpu.probe()[2],
          "cupy_imported": gpu.probe()[0] is not None}
comm = hvd.global_process_set._lane.comm
report["auto"] = choose_backend("auto", comm)
try:
    choose_backend("nccl", comm)
    report["nccl"] = "accepted"
except HpcvodConfigError as exc:
    report["nccl"] = str(exc)
report["pinned"] = gpu.pin(hvd.local_rank())
# host collectives are untouched by the GPU code
report["host_allreduce"] = hvd.allreduce(np.arange(4.0), name="x").tolist()
print("GPU FALLBACK " + json.dumps(report), flush=True)
hvd.shutdown()
