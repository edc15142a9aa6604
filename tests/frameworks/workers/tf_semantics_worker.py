"""Horovod's TensorFlow behaviours beyond gradients, on 2 ranks (tests/frameworks/test_tensorflow_horovod_semantics.py).

Each check states the Horovod behaviour it matches. Every rank issues the same collectives in every check, and
errors are expected on every rank together, so that a failing check cannot leave the ranks out of step.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _harness import Checks, output_path  # noqa: E402
from tf_common import RANK, SIZE, rank_data  # noqa: E402

import hpcvod.tensorflow as hvd  # noqa: E402
import hpcvod.tensorflow.keras as hvdk  # noqa: E402
from hpcvod.runtime.errors import HpcvodInputError, HpcvodMismatchError  # noqa: E402

check = Checks()
data = rank_data


def raises(fn, cls):
    try:
        fn()
    except cls as exc:
        return exc
    raise AssertionError(f"expected {cls.__name__}")


def in_tf1_graph(build):
    """Builds ``build()`` in a TF1 graph and runs it in a session with 2 inter-op threads (few threads and many
    independent collectives: the case where executors on different ranks pick different orders)."""
    with tf.Graph().as_default():
        fetches = build()
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return session.run(fetches)


@check
def mismatch_is_failed_precondition_eager_function_and_graph():
    # Horovod: tf.errors.FailedPreconditionError when ranks disagree on shape, dtype or root (every rank raises)
    mismatched = {
        "shape": lambda: hvd.allreduce(tf.ones([RANK + 1])),
        "dtype": lambda: hvd.allgather(tf.ones([2], tf.float32 if RANK == 0 else tf.int32)),
        "root": lambda: hvd.broadcast(tf.ones([2]), root_rank=RANK),
        "reducescatter shape": lambda: hvd.reducescatter(tf.ones([2 * SIZE, RANK + 1])),
    }
    for what, fn in mismatched.items():
        exc = raises(fn, tf.errors.FailedPreconditionError)
        assert isinstance(exc, HpcvodMismatchError), (what, type(exc))  # still hpcvod's own class too
        raises(tf.function(fn), tf.errors.FailedPreconditionError)
        raises(lambda: in_tf1_graph(fn), tf.errors.FailedPreconditionError)
    # the ranks are still in step afterwards
    assert float(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)[0]) == SIZE


@check
def input_errors_are_invalid_argument():
    # Horovod: tf.errors.InvalidArgumentError for splits that do not divide the first dimension
    uneven = tf.ones([SIZE + 1, 2])
    exc = raises(lambda: hvd.alltoall(uneven), tf.errors.InvalidArgumentError)
    assert isinstance(exc, HpcvodInputError)
    raises(tf.function(lambda: hvd.alltoall(uneven)), tf.errors.InvalidArgumentError)
    raises(lambda: hvd.alltoall(tf.ones([4, 2]), splits=[5] * SIZE), tf.errors.InvalidArgumentError)
    assert float(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)[0]) == SIZE


@check
def tf1_graph_unnamed_ops_pair_by_graph_name():
    # Horovod names graph ops after their input tensor: equal shapes must not pair the wrong tensors
    def build():
        base = tf.constant(np.full(4, RANK + 1, np.float32))
        return [hvd.allreduce(base * (i + 1), op=hvd.Sum) for i in range(12)] + \
               [hvd.allgather(tf.fill([RANK + 1, 3], float(i))) for i in range(4)]
    out = in_tf1_graph(build)
    total = SIZE * (SIZE + 1) // 2
    for i in range(12):
        np.testing.assert_array_equal(out[i], np.full(4, (i + 1) * total, np.float32))
    for i in range(4):
        np.testing.assert_array_equal(out[12 + i], np.full((total, 3), float(i)))


@check
def reducescatter_scaled_and_grouped_values():
    # block r of the reduction, scaled: prescale * postscale * sum (or the mean for Average)
    rows = 2
    xs = [[data(r * 10 + i, (rows * SIZE, 3), dt) for r in range(SIZE)]
          for i, dt in enumerate((np.float32, np.float64, np.int32))]
    mine = slice(RANK * rows, (RANK + 1) * rows)

    def expected(i, op, pre, post):
        total = sum(x.astype(np.float64) for x in xs[i])[mine] * pre * post
        return total / SIZE if op == hvd.Average else total

    cases = ((hvd.Sum, 1.0, 1.0), (hvd.Sum, 2.0, 1.0), (hvd.Sum, 1.0, 3.0), (hvd.Average, 1.0, 1.0),
             (hvd.Average, 2.0, 0.5))
    for op, pre, post in cases:
        for name, run in (("eager", lambda f: f()), ("TF1 graph", in_tf1_graph)):
            single = run(lambda: hvd.reducescatter(tf.constant(xs[0][RANK]), op=op, prescale_factor=pre,
                                                   postscale_factor=post))
            np.testing.assert_allclose(np.asarray(single), expected(0, op, pre, post), rtol=1e-5,
                                       err_msg=f"{name} {op} {pre} {post}")
            floats = run(lambda: hvd.grouped_reducescatter([tf.constant(xs[i][RANK]) for i in (0, 1)], op=op,
                                                           prescale_factor=pre, postscale_factor=post))
            for i in (0, 1):
                np.testing.assert_allclose(np.asarray(floats[i]), expected(i, op, pre, post), rtol=1e-5,
                                           err_msg=f"{name} grouped {i} {op} {pre} {post}")
            if op == hvd.Sum:
                ints = run(lambda: hvd.grouped_reducescatter([tf.constant(xs[2][RANK])] * 2, op=op,
                                                             prescale_factor=pre, postscale_factor=post))
                for got in ints:
                    np.testing.assert_array_equal(np.asarray(got), expected(2, op, pre, post).astype(np.int32))


@check
def broadcast_inplace_eager_and_graph():
    # Horovod's broadcast_: the variables (and the returned values) hold the root's values afterwards
    for root in range(SIZE):
        for dtype in (tf.float32, tf.int32, tf.bool, tf.float16):
            var = tf.Variable(tf.cast(tf.fill([3, 2], RANK % 2 if dtype == tf.bool else RANK), dtype))
            want = np.full((3, 2), root % 2 if dtype == tf.bool else root).astype(dtype.as_numpy_dtype)
            returned, = hvd.broadcast_([var], root)
            np.testing.assert_array_equal(var.numpy(), want)
            np.testing.assert_array_equal(returned.numpy(), want)

            def build():
                v = tf.Variable(tf.cast(tf.fill([3, 2], RANK % 2 if dtype == tf.bool else RANK), dtype))
                out = hvd.broadcast_([v], root)
                with tf.control_dependencies(out):
                    return out + [v.read_value()]
            returned, read = in_tf1_graph(build)
            np.testing.assert_array_equal(returned, want)
            np.testing.assert_array_equal(read, want)


@check
def indexed_slices_grouped_and_scaling_refused():
    # Horovod: IndexedSlices are allgathered (values / size for Average), also in grouped_allreduce and without
    # dense_shape; prescale/postscale and ops other than Sum/Average raise NotImplementedError
    def slices(r):
        return data(r, (2, 3)), np.array([r, r + 1], np.int64)
    values, indices = slices(RANK)
    sparse = tf.IndexedSlices(tf.constant(values), tf.constant(indices))  # no dense_shape
    dense = tf.constant(data(RANK + 40, (2, 2)))
    for op in (hvd.Sum, hvd.Average):
        out_sparse, out_dense = hvd.grouped_allreduce([sparse, dense], op=op)
        all_values = np.concatenate([slices(r)[0] for r in range(SIZE)])
        assert isinstance(out_sparse, tf.IndexedSlices) and out_sparse.dense_shape is None
        np.testing.assert_allclose(out_sparse.values.numpy(), all_values / (SIZE if op == hvd.Average else 1),
                                   rtol=1e-6)
        np.testing.assert_array_equal(out_sparse.indices.numpy(), np.concatenate([slices(r)[1] for r in
                                                                                   range(SIZE)]))
        dense_sum = sum(data(r + 40, (2, 2)) for r in range(SIZE))
        np.testing.assert_allclose(out_dense.numpy(), dense_sum / (SIZE if op == hvd.Average else 1), rtol=1e-6)
    refused = [lambda: hvd.allreduce(sparse, prescale_factor=2.0),
               lambda: hvd.allreduce(sparse, postscale_factor=2.0),
               lambda: hvd.grouped_allreduce([sparse, dense], prescale_factor=2.0),
               lambda: hvd.allreduce(sparse, op=hvd.Min)]
    for fn in refused:
        raises(fn, NotImplementedError)
    assert float(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)[0]) == SIZE


def small_model(seed: int) -> keras.Model:
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Dense(4, kernel_initializer=keras.initializers.Constant(seed + 1.0)),
                              keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.5))])
    return model


@check
def partial_tape_with_keras3_layers():
    # Horovod's PartialDistributedGradientTape: local layers' gradients stay local (divided by size with
    # scale_local_gradients=True), the others are averaged
    model = small_model(RANK)
    x = tf.constant(data(RANK, (5, 3)))
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    plain = tape.gradient(loss, model.trainable_weights)
    local_ids = {id(w) for w in model.layers[0].trainable_weights}
    partial = hvd.PartialDistributedGradientTape(tape, local_layers=[model.layers[0]])
    got = partial.gradient(loss, model.trainable_weights)
    for w, g, p in zip(model.trainable_weights, got, plain):
        want = p / SIZE if id(w) in local_ids else hvd.allreduce(p, op=hvd.Average)
        np.testing.assert_allclose(g.numpy(), np.asarray(want), rtol=1e-5)
    # the Keras optimizer form (horovod.keras.PartialDistributedOptimizer)
    opt = hvdk.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[model.layers[0]])
    before = [w.numpy().copy() for w in model.trainable_weights]
    opt.apply(plain, model.trainable_weights)
    for w, b, p in zip(model.trainable_weights, before, plain):
        want = p / SIZE if id(w) in local_ids else hvd.allreduce(p, op=hvd.Average)
        np.testing.assert_allclose(b - w.numpy(), np.asarray(want), rtol=1e-5, atol=1e-6)


@check
def sync_batch_normalization_matches_global_batch():
    # Horovod's SyncBatchNormalization(fused=False): training statistics of the global batch
    raises(lambda: hvd.SyncBatchNormalization(fused=True), ValueError)
    xs = [data(r + 60, (4, 3)) for r in range(SIZE)]
    sync_bn = hvd.SyncBatchNormalization(fused=False, axis=-1, momentum=0.5)
    bn = keras.layers.BatchNormalization(axis=-1, momentum=0.5)
    x = tf.constant(xs[RANK])
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = sync_bn(x, training=True)
        loss = tf.reduce_sum(out * tf.range(3, dtype=tf.float32))
    grad = tape.gradient(loss, x)
    full = bn(tf.constant(np.concatenate(xs)), training=True).numpy()
    np.testing.assert_allclose(out.numpy(), full[RANK * 4:(RANK + 1) * 4], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sync_bn.moving_mean.numpy(), bn.moving_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(sync_bn.moving_variance.numpy(), bn.moving_variance.numpy(), rtol=1e-4)
    assert grad is not None and np.all(np.isfinite(grad.numpy()))
    assert hvdk.SyncBatchNormalization is hvd.SyncBatchNormalization


@check
def keras_collectives_take_value_and_name():
    # horovod.tensorflow.keras: allreduce(value, name, average, ...), reducescatter(value, name, op=Average)
    values = [data(r + 80, (2 * SIZE, 2)) for r in range(SIZE)]
    np.testing.assert_allclose(np.asarray(hvdk.allreduce(values[RANK], "k.allreduce")),
                               sum(values) / SIZE, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(hvdk.allreduce(values[RANK], "k.sum", op=hvdk.Sum)), sum(values),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(hvdk.reducescatter(values[RANK], "k.rs")),
                               (sum(values) / SIZE)[RANK * 2:(RANK + 1) * 2], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(hvdk.allgather(values[RANK], "k.ag")), np.concatenate(values))
    np.testing.assert_allclose(np.asarray(hvdk.broadcast(values[RANK], SIZE - 1, "k.b")), values[SIZE - 1])


@check
def broadcast_callback_keeps_local_variables():
    # Horovod's BroadcastGlobalVariablesCallback(root_rank, device, local_variables): those stay per rank
    root = SIZE - 1
    init = keras.initializers.Constant(float(RANK))
    model = keras.Sequential([keras.Input((3,))] + [
        keras.layers.Dense(3, kernel_initializer=init, bias_initializer=init, trainable=False) for _ in range(3)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    local = list(model.layers[0].variables)
    callback = hvdk.callbacks.BroadcastGlobalVariablesCallback(root, "", local)
    model.fit(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), batch_size=2, epochs=1, verbose=0,
              callbacks=[callback])
    local_ids = {id(v) for v in local}
    for v in model.variables:
        want = float(RANK) if id(v) in local_ids else float(root)
        np.testing.assert_array_equal(np.asarray(v), np.full(v.shape, want, np.float32))


@check
def tensorflow_signatures_as_horovod():
    # Horovod's positional orders and return types in horovod.tensorflow
    x = tf.constant(data(RANK, (2 * SIZE, 2)))
    out, = hvd.grouped_reducescatter([x], "", hvd.Compression.none, hvd.Sum, hvd.global_process_set, 2.0)
    total = sum(data(r, (2 * SIZE, 2)) for r in range(SIZE))
    np.testing.assert_allclose(out.numpy(), 2.0 * total[RANK * 2:(RANK + 1) * 2], rtol=1e-6)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), None, False)  # (optimizer, name, use_locking)
    assert hasattr(opt, "_hvd")
    assert int(hvd.size_op()) == SIZE and int(hvd.process_set_included_op()) == 1
    last = hvd.join()  # a scalar int32 tensor, as Horovod's op
    assert isinstance(last, tf.Tensor) and last.dtype == tf.int32, type(last)
    assert hvd.allgather_object(int(last)) == [int(last)] * SIZE and 0 <= int(last) < SIZE


check.report(output_path())
hvd.shutdown()
