"""Collectives that differ across ranks must raise HpcvodMismatchError on every rank, never hang or corrupt data.

Rank 0 prints "MISMATCH OK <n>" at the end; every rank also prints the first line of each error it caught
("rank R caught: ...") so the test can see that every rank raised.
"""

from __future__ import annotations

import numpy as np

import hpcvod.runtime as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
caught = 0


def expect_mismatch(label: str, call, *needles: str) -> None:
    global caught
    try:
        call()
    except hvd.HpcvodMismatchError as exc:
        text = str(exc)
        missing = [n for n in needles if n not in text]
        if missing:
            raise AssertionError(f"rank {rank}: {label}: message lacks {missing}: {text}") from None
        print(f"rank {rank} caught [{label}]: {text.splitlines()[0]}", flush=True)
        caught += 1
        return
    raise AssertionError(f"rank {rank}: {label}: no HpcvodMismatchError")


def healthy(tag: str) -> None:
    """A normal collective right after a mismatch: the engine still works and the data is right."""
    got = hvd.allreduce(np.full(5, float(rank)), op=hvd.Sum, name=f"healthy.{tag}")
    if not np.array_equal(got, np.full(5, float(sum(range(size))))):
        raise AssertionError(f"rank {rank}: corrupted data after {tag}: {got}")


# shape
expect_mismatch("shape", lambda: hvd.allreduce(np.ones(3 if rank == 0 else 4), name="m.shape"),
                "m.shape", "(3,)", "(4,)")
healthy("shape")
# dtype
expect_mismatch("dtype", lambda: hvd.allreduce(np.ones(3, np.float32 if rank == 0 else np.float64), name="m.dtype"),
                "float32", "float64")
healthy("dtype")
# reduction op
expect_mismatch("op", lambda: hvd.allreduce(np.ones(3), op=hvd.Sum if rank == 0 else hvd.Max, name="m.op"),
                "op=Sum", "op=Max")
healthy("op")
# broadcast root
expect_mismatch("root", lambda: hvd.broadcast(np.ones(2), root_rank=0 if rank == 0 else 1, name="m.root"),
                "root_rank=0", "root_rank=1")
healthy("root")
# different collectives in the same position (unnamed)
expect_mismatch("collective", lambda: hvd.allreduce(np.ones(2)) if rank == 0 else hvd.broadcast(np.ones(2), 0),
                "allreduce", "broadcast")
healthy("collective")
# a named tensor that is already in the response cache, then changes shape on one rank
for _ in range(2):
    hvd.allreduce(np.ones(6), name="m.cached")
expect_mismatch("cached shape", lambda: hvd.allreduce(np.ones(6 if rank else 7), name="m.cached"), "(7,)", "(6,)")
healthy("cached")
# unnamed collectives whose two shapes are both cached, submitted crosswise
for _ in range(2):
    hvd.allreduce(np.ones(8))
    hvd.allreduce(np.ones(9))
expect_mismatch("cached unnamed", lambda: hvd.allreduce(np.ones(8 if rank == 0 else 9)), "(8,)", "(9,)")
healthy("cached unnamed")
# async: the error arrives through synchronize()
h = hvd.allreduce_async(np.ones(2 if rank == 0 else 3), name="m.async")
expect_mismatch("async", lambda: hvd.synchronize(h), "m.async")
healthy("async")
# allgather: trailing dimensions must agree (the first may differ)
expect_mismatch("allgather trailing", lambda: hvd.allgather(np.ones((2, 3 if rank == 0 else 4))), "allgather")
healthy("allgather")

hvd.barrier()
if rank == 0:
    print(f"MISMATCH OK {caught}", flush=True)
hvd.shutdown()
