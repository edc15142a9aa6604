"""One rank reuses a collective's name while it is in flight, catches the refusal and goes on (issue 11).

Rank 0 submits 'grad' twice in step 1 (a data-dependent branch gone wrong); the second is refused at once with a
ValueError, which it catches. Rank 1 submitted 'grad' and 'grad.extra'. The ranks are out of step: every rank
must end with an error, not a hang.
"""

import numpy as np

import hpcvod.runtime as hvd

hvd.init()
rank = hvd.rank()
try:
    first = hvd.allreduce_async(np.ones(4), name="grad")
    try:
        second = hvd.allreduce_async(np.ones(4), name="grad" if rank == 0 else "grad.extra")
    except ValueError as exc:
        print(f"rank {rank} refused at submission: {exc}", flush=True)
        second = None
    hvd.synchronize(first)
    if second is not None:
        hvd.synchronize(second)
    hvd.allreduce(np.ones(2), name="after")
    print(f"rank {rank} finished without an error", flush=True)
except hvd.HpcvodMismatchError as exc:
    print(f"rank {rank} HpcvodMismatchError: {exc}", flush=True)
