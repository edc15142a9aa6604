"""Each TensorFlow collective misused as Horovod's tests misuse it must raise the exception type Horovod raises
(issue 29, item 9), eagerly and (the misuses that reach the other ranks) in a TF1 graph, under ``mpiexec -n 2``;
checked by tests/frameworks/test_tensorflow_errors.py.

Horovod's types, from its TensorFlow ops (a failed status: InvalidArgument -> ``tf.errors.InvalidArgumentError``,
a precondition -> ``tf.errors.FailedPreconditionError``) and its test_tensorflow.py / test_tensorflow_process_sets.py:
ranks that disagree on shape, dtype, reduction op or root get FailedPreconditionError; bad alltoall splits, a
process set this rank is not in or one that is not registered get InvalidArgumentError; after shutdown an op gets
FailedPreconditionError ("not initialized"). ``allreduce`` and ``grouped_allreduce`` ask the set's size in Python
first (``process_set.size()``), so there an unregistered set and shutdown are ValueError, as in Horovod.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf
from _harness import Checks, output_path

import hpcvod.tensorflow as hvd

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
assert SIZE >= 2, "run on 2 or more ranks: most misuses are ranks that disagree"
check = Checks()
MISMATCH, INVALID = tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError

# collective name -> a call with well-formed tensors, taking extra keyword arguments (process_set...)
COLLECTIVES: dict[str, Callable[..., object]] = {
    "allreduce": lambda **kw: hvd.allreduce(tf.ones(4), **kw),
    "grouped_allreduce": lambda **kw: hvd.grouped_allreduce([tf.ones(4), tf.ones(2)], **kw),
    "allgather": lambda **kw: hvd.allgather(tf.ones([2, 3]), **kw),
    "broadcast": lambda **kw: hvd.broadcast(tf.ones(4), 0, **kw),
    "alltoall": lambda **kw: hvd.alltoall(tf.ones(2 * SIZE), **kw),
    "reducescatter": lambda **kw: hvd.reducescatter(tf.ones(2 * SIZE), **kw),
}
# where Horovod asks process_set.size() in Python before its op runs (a ValueError there)
SIZE_ASKED_FIRST = {"allreduce", "grouped_allreduce"}


def other_dtype(odd: tf.DType, even: tf.DType) -> tf.DType:
    return odd if RANK % 2 else even


# (case, expected type, the misuse); every rank runs each misuse, with its own rank-dependent argument.
# Built inside a function so that the same misuse can be built in a TF1 graph.
MISUSES: list[tuple[str, type, Callable[[], object]]] = [
    ("allreduce_shapes_differ", MISMATCH, lambda: hvd.allreduce(tf.ones(RANK + 1), name="e.ar.shape")),
    ("allreduce_dtypes_differ", MISMATCH,
     lambda: hvd.allreduce(tf.ones(3, dtype=other_dtype(tf.float32, tf.float64)), name="e.ar.dtype")),
    ("allreduce_ops_differ", MISMATCH,
     lambda: hvd.allreduce(tf.ones(3), op=hvd.Sum if RANK % 2 else hvd.Max, name="e.ar.op")),
    ("grouped_allreduce_shapes_differ", MISMATCH,
     lambda: hvd.grouped_allreduce([tf.ones(2), tf.ones(RANK + 1)], name="e.gar.shape")),
    ("allgather_trailing_shapes_differ", MISMATCH, lambda: hvd.allgather(tf.ones([2, RANK + 1]), name="e.ag.shape")),
    ("allgather_dtypes_differ", MISMATCH,
     lambda: hvd.allgather(tf.ones(2, dtype=other_dtype(tf.int32, tf.int64)), name="e.ag.dtype")),
    ("broadcast_shapes_differ", MISMATCH, lambda: hvd.broadcast(tf.ones(RANK + 1), 0, name="e.bc.shape")),
    ("broadcast_dtypes_differ", MISMATCH,
     lambda: hvd.broadcast(tf.ones(2, dtype=other_dtype(tf.float32, tf.float16)), 0, name="e.bc.dtype")),
    ("broadcast_roots_differ", MISMATCH, lambda: hvd.broadcast(tf.ones(2), RANK, name="e.bc.root")),
    ("broadcast_root_outside_the_job", INVALID, lambda: hvd.broadcast(tf.ones(2), SIZE, name="e.bc.bad")),
    ("alltoall_dtypes_differ", MISMATCH,
     lambda: hvd.alltoall(tf.ones(SIZE, dtype=other_dtype(tf.int32, tf.float32)), name="e.a2a.dtype")),
    ("alltoall_splits_do_not_add_up", INVALID,
     lambda: hvd.alltoall(tf.ones(SIZE), splits=tf.fill([SIZE], 2), name="e.a2a")),
    ("alltoall_splits_negative", INVALID,
     lambda: hvd.alltoall(tf.ones(SIZE), splits=tf.constant([-1] + [1] * (SIZE - 1)), name="e.a2a.neg")),
    ("alltoall_splits_wrong_length", INVALID,
     lambda: hvd.alltoall(tf.ones(SIZE), splits=tf.constant([SIZE]), name="e.a2a.len")),
    ("reducescatter_shapes_differ", MISMATCH,
     lambda: hvd.reducescatter(tf.ones([2 * SIZE, RANK + 1]), name="e.rs.shape")),
    ("reducescatter_dtypes_differ", MISMATCH,
     lambda: hvd.reducescatter(tf.ones(SIZE, dtype=other_dtype(tf.float32, tf.float64)), name="e.rs.dtype")),
]


def in_graph(misuse: Callable[[], object]) -> Callable[[], object]:
    """The misuse built in a TF1 graph and run by a session."""
    def run() -> object:
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            return session.run(misuse())
    return run


for case, expected, misuse in MISUSES:
    check.expect_raises(case, expected, misuse)
for case, expected, misuse in MISUSES:
    check.expect_raises(f"{case}_in_a_tf1_graph", expected, in_graph(misuse))

# A set without this rank or never registered: InvalidArgumentError; after shutdown: FailedPreconditionError;
# ValueError for allreduce and grouped_allreduce in the last two (they ask the set's size first)
check.expect_set_and_shutdown_misuses(
    hvd, COLLECTIVES, lambda c, kind: ValueError if c in SIZE_ASKED_FIRST and kind != "without_this_rank"
    else MISMATCH if kind == "after_shutdown" else INVALID)
check.report(output_path())
