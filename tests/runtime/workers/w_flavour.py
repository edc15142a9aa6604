"""init() against the MPI flavour the script promised: prints the world, or the HpcvodConfigError (exit 3)."""

import os
import sys
import time

import hpcvod.runtime as hvd

try:
    hvd.init()
except hvd.HpcvodConfigError as exc:
    # one write(2) of the whole line: print() writes the text and its newline apart, and two ranks failing in the
    # same millisecond then share one line of the launcher's output (the test counts one line per rank)
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"FLAVOUR ERROR: {exc}\n".encode())
    # A launcher ends the other ranks once one exits with an error (Hydra does at once): stay a moment, so that a
    # slower rank can reach its own check and print it too (the test counts one line per rank).
    time.sleep(5)
    sys.exit(3)
print(f"WORLD rank={hvd.rank()} size={hvd.size()}", flush=True)
hvd.shutdown()
