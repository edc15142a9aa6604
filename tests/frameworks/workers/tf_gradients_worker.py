"""Gradients of hpcvod.tensorflow's collectives against Horovod's closed forms, on any number of ranks
(tests/frameworks/test_tensorflow_horovod_semantics.py runs it on 1, 2 and 4).

Rank r's loss is c_r * sum(output) with c_r = r + 1, so the incoming gradient is c_r everywhere. With
n ranks, S = sum_k c_k and M = S / n, Horovod (horovod/tensorflow/mpi_ops.py) gives:
allreduce Sum -> S, Average -> M; allgather and grouped_allgather -> M (the Average allreduce of the gradient, cut
to this rank's rows); broadcast -> M on the root, 0 elsewhere; reducescatter -> the allgather of the gradient
times n for Sum (times 1 for Average), times prescale and postscale: block k is c_k * n (Sum) or c_k (Average);
alltoall -> alltoall back: block k is c_k.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _harness import Checks, output_path  # noqa: E402
from tf_common import RANK, SIZE, rank_data  # noqa: E402

import hpcvod.tensorflow as hvd  # noqa: E402

C = [float(r + 1) for r in range(SIZE)]
S = sum(C)
M = S / SIZE
check = Checks()
MODES = (("eager", lambda f: f), ("tf.function", tf.function))


def grads(fn, *xs):
    """d(c_r * sum(fn(*xs)))/dxs in eager mode and in a tf.function: the two must agree; returns the eager one."""
    def loss_grads(*args):
        with tf.GradientTape() as tape:
            for a in args:
                tape.watch(a)
            outs = fn(*args)
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            loss = sum(tf.reduce_sum(o) * (i + 1) for i, o in enumerate(outs)) * C[RANK]
        return tape.gradient(loss, list(args))
    results = []
    for _, wrap in MODES:
        results.append([g.numpy() for g in wrap(loss_grads)(*[tf.constant(x) for x in xs])])
    for eager, graph in zip(*results):
        np.testing.assert_allclose(graph, eager, rtol=1e-6)
    return results[0]


def expect(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def data(shape):
    return rank_data(RANK, shape)


@check
def allreduce_gradient_sum_and_average():
    expect(grads(lambda x: hvd.allreduce(x, op=hvd.Sum), data((3, 2)))[0], np.full((3, 2), S))
    expect(grads(lambda x: hvd.allreduce(x, op=hvd.Average), data((3, 2)))[0], np.full((3, 2), M))


@check
def allgather_gradient_is_the_average_cut_to_this_rank():
    # rank r contributes r + 1 rows: the gradient has this rank's rows only
    expect(grads(hvd.allgather, data((RANK + 1, 2)))[0], np.full((RANK + 1, 2), M))


@check
def grouped_allgather_gradient():
    g = grads(lambda a, b: hvd.grouped_allgather([a, b]), data((RANK + 1, 2)), data((2, 3)))
    expect(g[0], np.full((RANK + 1, 2), M))
    expect(g[1], np.full((2, 3), 2 * M))  # the second output carries twice the loss


@check
def broadcast_gradient_is_the_average_on_the_root_only():
    for root in sorted({0, SIZE - 1}):
        got = grads(lambda x: hvd.broadcast(x, root_rank=root), data((4,)))[0]
        expect(got, np.full((4,), M if RANK == root else 0.0))
    return "1 (not 2) on 2 ranks" if SIZE == 2 else ""


def block_rows(values, rows):
    return np.concatenate([np.full((rows, 3), v) for v in values])


@check
def reducescatter_gradient_sum_average_and_scaled():
    x = data((2 * SIZE, 3))
    expect(grads(lambda t: hvd.reducescatter(t, op=hvd.Sum), x)[0], block_rows([c * SIZE for c in C], 2))
    expect(grads(lambda t: hvd.reducescatter(t, op=hvd.Average), x)[0], block_rows(C, 2))
    expect(grads(lambda t: hvd.reducescatter(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), x)[0],
           block_rows([c * SIZE * 1.5 for c in C], 2))


@check
def grouped_reducescatter_gradient():
    x, y = data((2 * SIZE, 3)), data((SIZE, 3))
    for op, factor in ((hvd.Sum, SIZE), (hvd.Average, 1)):
        g = grads(lambda a, b: hvd.grouped_reducescatter([a, b], op=op), x, y)
        expect(g[0], block_rows([c * factor for c in C], 2))
        expect(g[1], block_rows([2 * c * factor for c in C], 1))


@check
def alltoall_gradient_equal_and_explicit_splits():
    x = data((2 * SIZE, 3))
    expect(grads(hvd.alltoall, x)[0], block_rows(C, 2))
    expect(grads(lambda t: hvd.alltoall(t, splits=[2] * SIZE)[0], x)[0], block_rows(C, 2))
    # equal parts of first dimensions that differ across ranks: r + 1 rows to each rank, and back
    uneven = data(((RANK + 1) * SIZE, 3))
    expect(grads(hvd.alltoall, uneven)[0], block_rows(C, RANK + 1))


check.report(output_path())
hvd.shutdown()
