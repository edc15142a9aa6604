"""Each torch collective misused as Horovod's tests misuse it must raise the exception type Horovod raises
(issue 29, item 9), under ``mpiexec -n 2``; checked by tests/frameworks/test_torch_errors.py.

Horovod's types, from its torch binding (a failed enqueue: InvalidArgument -> ValueError, others ->
RuntimeError) and its test/parallel/test_torch.py: ranks that disagree on shape, dtype, reduction op or root get
RuntimeError; a process set that is not registered, a root outside the set, bad alltoall splits and a name
still in flight get ValueError; a call after shutdown gets RuntimeError (a precondition error).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from _harness import Checks, output_path

import hpcvod.torch as hvd

torch.set_num_threads(1)
hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
assert SIZE >= 2, "run on 2 or more ranks: most misuses are ranks that disagree"
check = Checks()

# collective name -> a call with a well-formed tensor, taking extra keyword arguments (process_set, name...)
COLLECTIVES: dict[str, Callable[..., object]] = {
    "allreduce": lambda **kw: hvd.allreduce(torch.ones(4), **kw),
    "grouped_allreduce": lambda **kw: hvd.grouped_allreduce([torch.ones(4), torch.ones(2)], **kw),
    "allgather": lambda **kw: hvd.allgather(torch.ones(2, 3), **kw),
    "broadcast": lambda **kw: hvd.broadcast(torch.ones(4), 0, **kw),
    "alltoall": lambda **kw: hvd.alltoall(torch.ones(2 * SIZE), **kw),
    "reducescatter": lambda **kw: hvd.reducescatter(torch.ones(2 * SIZE), **kw),
}

# (case, expected type, the misuse); every rank runs each misuse, with its own rank-dependent argument
MISUSES: list[tuple[str, type, Callable[[], object]]] = [
    ("allreduce_shapes_differ", RuntimeError, lambda: hvd.allreduce(torch.ones(RANK + 1), name="e.ar.shape")),
    ("allreduce_dtypes_differ", RuntimeError,
     lambda: hvd.allreduce(torch.ones(3, dtype=torch.float32 if RANK % 2 else torch.float64), name="e.ar.dtype")),
    ("allreduce_ops_differ", RuntimeError,
     lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum if RANK % 2 else hvd.Max, name="e.ar.op")),
    ("allgather_trailing_shapes_differ", RuntimeError,
     lambda: hvd.allgather(torch.ones(2, RANK + 1), name="e.ag.shape")),
    ("allgather_dtypes_differ", RuntimeError,
     lambda: hvd.allgather(torch.ones(2, dtype=torch.int32 if RANK % 2 else torch.int64), name="e.ag.dtype")),
    ("broadcast_shapes_differ", RuntimeError, lambda: hvd.broadcast(torch.ones(RANK + 1), 0, name="e.bc.shape")),
    ("broadcast_dtypes_differ", RuntimeError,
     lambda: hvd.broadcast(torch.ones(2, dtype=torch.float32 if RANK % 2 else torch.float16), 0, name="e.bc.dtype")),
    ("broadcast_roots_differ", RuntimeError, lambda: hvd.broadcast(torch.ones(2), RANK, name="e.bc.root")),
    ("broadcast_root_outside_the_job", ValueError, lambda: hvd.broadcast(torch.ones(2), SIZE, name="e.bc.bad")),
    ("alltoall_splits_do_not_add_up", ValueError,
     lambda: hvd.alltoall(torch.ones(SIZE), splits=torch.full((SIZE,), 2, dtype=torch.int32), name="e.a2a")),
    ("alltoall_splits_negative", ValueError,
     lambda: hvd.alltoall(torch.ones(SIZE), splits=torch.tensor([-1] + [1] * (SIZE - 1), dtype=torch.int32),
                          name="e.a2a.neg")),
    ("reducescatter_shapes_differ", RuntimeError,
     lambda: hvd.reducescatter(torch.ones(2 * SIZE, RANK + 1), name="e.rs.shape")),
    ("reducescatter_dtypes_differ", RuntimeError,
     lambda: hvd.reducescatter(torch.ones(SIZE, dtype=torch.float32 if RANK % 2 else torch.float64),
                               name="e.rs.dtype")),
]


for case, expected, misuse in MISUSES:
    check.expect_raises(case, expected, misuse)

# A process set never registered (Horovod: "does not exist, or has not been registered": ValueError); after
# shutdown (Horovod: a precondition error, RuntimeError)
check.expect_set_and_shutdown_misuses(hvd, COLLECTIVES, lambda c, kind: ValueError if kind == "unregistered"
                                      else RuntimeError, without_this_rank=False)
check.report(output_path())
