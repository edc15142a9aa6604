"""A training step that fails on one rank only, between two collectives, and the user catches it.

argv[1]: "named" (collectives named per step) or "unnamed". Rank 1 raises after the first allreduce of step 2
and skips the second; the ranks are then out of step. Every rank must get an error (a mismatch), not hang.
"""

import sys

import numpy as np

import hpcvod.runtime as hvd

hvd.init()
rank = hvd.rank()
named = sys.argv[1] == "named"


def step(i: int) -> None:
    hvd.allreduce(np.ones(4), name=f"forward.{i}" if named else None)
    if rank == 1 and i == 2:
        raise AssertionError("injected failure on rank 1 in step 2")
    hvd.allreduce(np.ones(6), name=f"backward.{i}" if named else None)


errors = 0
for i in range(6):
    try:
        step(i)
    except AssertionError as exc:
        print(f"rank {rank} caught: {exc}", flush=True)
    except hvd.HpcvodMismatchError as exc:
        print(f"rank {rank} step {i} HpcvodMismatchError: {exc}", flush=True)
        errors += 1
        break
print(f"rank {rank} done, {errors} mismatch error(s)", flush=True)
