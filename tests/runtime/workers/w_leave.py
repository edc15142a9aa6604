"""One rank leaves cleanly (returns from main, sys.exit(0) or hvd.shutdown()) while the others go on reducing.

argv: LEAVER HOW [PHASE]; HOW in return, exit, shutdown. The others must fail with HpcvodShutdownError naming
the leaver within seconds (Horovod: "Horovod has been shut down ... after one of the ranks finished execution").
"""

import sys
import time

import numpy as np

import hpcvod.runtime as hvd


def main() -> int:
    hvd.init()
    rank = hvd.rank()
    leaver, how = int(sys.argv[1]), sys.argv[2]
    for _ in range(5):
        hvd.allreduce(np.ones(10), name="warm-up")
    if rank == leaver:
        print(f"rank {rank} leaves by {how}", flush=True)
        if how == "exit":
            sys.exit(0)
        if how == "shutdown":
            hvd.shutdown()
            time.sleep(2.0)   # still alive, but no longer in the job's collectives
        return 0
    time.sleep(0.5)           # the leaver is gone before the next collective
    try:
        for step in range(100000):
            hvd.allreduce(np.ones(10), name="grad")
    except hvd.HpcvodShutdownError as exc:
        print(f"rank {rank} got HpcvodShutdownError: {exc}", flush=True)
        # Intel MPI's Hydra kills every rank once one fails: stay a moment so that a slower rank prints its own
        time.sleep(5.0)
        raise
    print(f"rank {rank}: the loop ended, which it never should", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
