"""init() checks: prints the world it sees, or the HpcvodWorldSizeError it raised (exit status 3)."""

import sys

import hpcvod.runtime as hvd

try:
    hvd.init()
except hvd.HpcvodWorldSizeError as exc:
    print(f"WORLD SIZE ERROR: {exc}", flush=True)
    sys.exit(3)
print(f"WORLD rank={hvd.rank()} size={hvd.size()} local={hvd.local_rank()}/{hvd.local_size()} "
      f"cross={hvd.cross_rank()}/{hvd.cross_size()} homogeneous={hvd.is_homogeneous()} "
      f"threads={hvd.mpi_threads_supported()}", flush=True)
hvd.shutdown()
