"""Each MXNet collective misused as Horovod's tests misuse it must raise the exception type Horovod raises
(issue 29, item 9), under ``mpiexec -n 2``; checked by tests/frameworks/test_mxnet_errors.py.

Horovod's MXNet ops surface every failed status of its core as ``MXNetError``, a RuntimeError (its
test_mxnet*.py accept ``(MXNetError, RuntimeError)``): ranks that disagree on shape, dtype, op or root, bad
alltoall splits, a process set without this rank or never registered, a call after shutdown. Its Python side
refuses before any op: alltoall splits that are not integers and a reducescatter of a scalar, with ValueError.
"""

from __future__ import annotations

from collections.abc import Callable

import hpcvod.mxnet as hvd  # before mxnet (np.bool alias)

import mxnet as mx
import numpy as np
from _harness import Checks, output_path

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
assert SIZE >= 2, "run on 2 or more ranks: most misuses are ranks that disagree"
check = Checks()


def ones(shape: object, dtype: object = np.float32) -> mx.nd.NDArray:
    return mx.nd.ones(shape, dtype=dtype)


def other_dtype(odd: object, even: object) -> object:
    return odd if RANK % 2 else even


# collective name -> a call with well-formed NDArrays, taking extra keyword arguments (process_set...)
COLLECTIVES: dict[str, Callable[..., object]] = {
    "allreduce": lambda **kw: hvd.allreduce(ones(4), **kw),
    "grouped_allreduce": lambda **kw: hvd.grouped_allreduce([ones(4), ones(2)], **kw),
    "allgather": lambda **kw: hvd.allgather(ones((2, 3)), **kw),
    "broadcast": lambda **kw: hvd.broadcast(ones(4), 0, **kw),
    "alltoall": lambda **kw: hvd.alltoall(ones(2 * SIZE), **kw),
    "reducescatter": lambda **kw: hvd.reducescatter(ones(2 * SIZE), **kw),
}

# (case, expected type, the misuse); every rank runs each misuse, with its own rank-dependent argument
MISUSES: list[tuple[str, type, Callable[[], object]]] = [
    ("allreduce_shapes_differ", RuntimeError, lambda: hvd.allreduce(ones(RANK + 1), name="e.ar.shape")),
    ("allreduce_dtypes_differ", RuntimeError,
     lambda: hvd.allreduce(ones(3, other_dtype(np.float32, np.float64)), name="e.ar.dtype")),
    ("allreduce_ops_differ", RuntimeError,
     lambda: hvd.allreduce(ones(3), op=hvd.Sum if RANK % 2 else hvd.Max, name="e.ar.op")),
    ("allreduce__shapes_differ", RuntimeError, lambda: hvd.allreduce_(ones(RANK + 1), name="e.ar_.shape")),
    ("grouped_allreduce_shapes_differ", RuntimeError,
     lambda: hvd.grouped_allreduce([ones(2), ones(RANK + 1)], name="e.gar.shape")),
    ("grouped_allreduce__shapes_differ", RuntimeError,
     lambda: hvd.grouped_allreduce_([ones(2), ones(RANK + 1)], name="e.gar_.shape")),
    ("allgather_trailing_shapes_differ", RuntimeError, lambda: hvd.allgather(ones((2, RANK + 1)), name="e.ag.shape")),
    ("allgather_dtypes_differ", RuntimeError,
     lambda: hvd.allgather(ones(2, other_dtype(np.int32, np.int64)), name="e.ag.dtype")),
    ("broadcast_shapes_differ", RuntimeError, lambda: hvd.broadcast(ones(RANK + 1), 0, name="e.bc.shape")),
    ("broadcast_dtypes_differ", RuntimeError,
     lambda: hvd.broadcast(ones(2, other_dtype(np.float32, np.float16)), 0, name="e.bc.dtype")),
    ("broadcast_roots_differ", RuntimeError, lambda: hvd.broadcast(ones(2), RANK, name="e.bc.root")),
    ("broadcast__roots_differ", RuntimeError, lambda: hvd.broadcast_(ones(2), RANK, name="e.bc_.root")),
    ("broadcast_root_outside_the_job", RuntimeError, lambda: hvd.broadcast(ones(2), SIZE, name="e.bc.bad")),
    ("alltoall_dtypes_differ", RuntimeError,
     lambda: hvd.alltoall(ones(SIZE, other_dtype(np.int32, np.float32)), name="e.a2a.dtype")),
    ("alltoall_splits_do_not_add_up", RuntimeError,
     lambda: hvd.alltoall(ones(SIZE), splits=mx.nd.array([2] * SIZE, dtype=np.int32), name="e.a2a")),
    ("alltoall_splits_negative", RuntimeError,
     lambda: hvd.alltoall(ones(SIZE), splits=mx.nd.array([-1] + [1] * (SIZE - 1), dtype=np.int32),
                          name="e.a2a.neg")),
    ("alltoall_splits_wrong_length", RuntimeError,
     lambda: hvd.alltoall(ones(SIZE), splits=mx.nd.array([SIZE], dtype=np.int32), name="e.a2a.len")),
    ("alltoall_splits_not_integers", ValueError,
     lambda: hvd.alltoall(ones(SIZE), splits=mx.nd.ones([SIZE], dtype="float32"), name="e.a2a.float")),
    ("reducescatter_shapes_differ", RuntimeError,
     lambda: hvd.reducescatter(ones((2 * SIZE, RANK + 1)), name="e.rs.shape")),
    ("reducescatter_dtypes_differ", RuntimeError,
     lambda: hvd.reducescatter(ones(SIZE, other_dtype(np.float32, np.float64)), name="e.rs.dtype")),
    ("reducescatter_of_a_scalar", ValueError,
     lambda: hvd.reducescatter(mx.nd.array(RANK, dtype=np.float32), op=hvd.Average, name="e.rs.scalar")),
    ("grouped_reducescatter_with_a_scalar", ValueError,
     lambda: hvd.grouped_reducescatter([mx.nd.zeros((3, 1)), mx.nd.array(RANK, dtype=np.float32)],
                                       op=hvd.Average, name="e.grs.scalar")),
]


for case, expected, misuse in MISUSES:
    check.expect_raises(case, expected, misuse)

# A set without this rank, one never registered, after shutdown: all MXNetError (RuntimeError) in Horovod
check.expect_set_and_shutdown_misuses(hvd, COLLECTIVES, lambda c, kind: RuntimeError)
check.report(output_path())
