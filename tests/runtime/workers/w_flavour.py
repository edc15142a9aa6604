"""init() against the MPI flavour the script promised: prints the world, or the HpcvodConfigError (exit 3)."""

import sys

import hpcvod.runtime as hvd

try:
    hvd.init()
except hvd.HpcvodConfigError as exc:
    print(f"FLAVOUR ERROR: {exc}", flush=True)
    sys.exit(3)
print(f"WORLD rank={hvd.rank()} size={hvd.size()}", flush=True)
hvd.shutdown()
