"""TensorFlow 2 + Keras 3 checks, run under ``mpiexec -n 2`` by tests/frameworks/test_tensorflow.py."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _harness import Checks, output_path  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from tf_common import RANK, SIZE, rank_data  # noqa: E402

import hpcvod.tensorflow as hvd  # noqa: E402
import hpcvod.tensorflow.keras as hvdk  # noqa: E402
from hpcvod.frameworks._common import aligned_empty  # noqa: E402
from hpcvod.frameworks.tensorflow.bridge import numpy_in, tensor_out  # noqa: E402

check = Checks()


def close(a, b, tol: float = 1e-5) -> None:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    assert diff <= tol * max(1.0, float(np.abs(b).max()) if b.size else 0.0), f"max diff {diff}"


@check
def ops_eager_every_op_and_dtype():
    refs = {hvd.Average: lambda xs: np.mean(xs, 0), hvd.Sum: lambda xs: np.sum(xs, 0),
            hvd.Min: lambda xs: np.min(xs, 0), hvd.Max: lambda xs: np.max(xs, 0),
            hvd.Product: lambda xs: np.prod(xs, 0)}
    n = 0
    for dtype, tf_dtype, tol in ((np.float32, tf.float32, 1e-6), (np.float64, tf.float64, 1e-12),
                                 (np.float16, tf.float16, 2e-3), (np.float32, tf.bfloat16, 2e-2),
                                 (np.int32, tf.int32, 0), (np.int64, tf.int64, 0)):
        for op, ref in refs.items():
            if op == hvd.Average and np.issubdtype(dtype, np.integer):
                continue
            xs = [tf.cast(rank_data(r, (3, 4), dtype), tf_dtype).numpy().astype(np.float64) for r in range(SIZE)]
            out = hvd.allreduce(tf.cast(rank_data(RANK, (3, 4), dtype), tf_dtype), op=op)
            assert out.dtype == tf_dtype, out.dtype
            close(out.numpy().astype(np.float64), ref(xs), tol)
            n += 1
    return f"{n} (dtype, op) pairs"


@check
def ops_zero_copy_views():
    t = tf.constant(rank_data(RANK, (256, 256)))
    view = numpy_in(t)
    assert not view.flags.owndata and not view.flags.writeable, "input was copied instead of viewed"
    buf = aligned_empty(8, np.float32)
    buf[:] = 7
    out = tensor_out(buf)
    buf[0] = 42  # the tensor aliases the aligned buffer: no copy on the way out
    assert float(out[0]) == 42.0 and float(out[1]) == 7.0
    unaligned = np.arange(1025, dtype=np.float32)[1:]
    assert unaligned.ctypes.data % 64 != 0
    close(tensor_out(unaligned), np.arange(1, 1025))  # copied into an aligned buffer first


@check
def ops_eager_gather_broadcast_alltoall_reducescatter_sparse():
    g = hvd.allgather(tf.constant(rank_data(RANK, (RANK + 1, 3))))
    close(g, np.concatenate([rank_data(r, (r + 1, 3)) for r in range(SIZE)]))
    root = SIZE - 1
    close(hvd.broadcast(tf.constant(rank_data(RANK, (5,))), root_rank=root), rank_data(root, (5,)))
    sent = np.concatenate([np.full((dst + 1, 2), 10.0 * RANK + dst, np.float32) for dst in range(SIZE)])
    out, received = hvd.alltoall(tf.constant(sent), splits=[dst + 1 for dst in range(SIZE)])
    assert received.numpy().tolist() == [RANK + 1] * SIZE
    close(out, np.concatenate([np.full((RANK + 1, 2), 10.0 * r + RANK) for r in range(SIZE)]))
    rs = hvd.reducescatter(tf.constant(rank_data(RANK, (2 * SIZE, 3))), op=hvd.Sum)
    close(rs, sum(rank_data(r, (2 * SIZE, 3)) for r in range(SIZE))[2 * RANK:2 * RANK + 2])
    grouped = hvd.grouped_allreduce([tf.constant(rank_data(RANK, (3,))), tf.constant(rank_data(RANK + 7, (2, 2),
                                                                                              np.float64))])
    close(grouped[0], np.mean([rank_data(r, (3,)) for r in range(SIZE)], 0))
    close(grouped[1], np.mean([rank_data(r + 7, (2, 2), np.float64) for r in range(SIZE)], 0))
    assert grouped[1].dtype == tf.float64
    # IndexedSlices: rank r contributes rows {r, r+1} of a 4-row tensor
    slices = tf.IndexedSlices(tf.constant(rank_data(RANK, (2, 3))), tf.constant([RANK, RANK + 1]),
                              dense_shape=tf.constant([4, 3]))
    reduced = hvd.allreduce(slices, op=hvd.Average)
    assert isinstance(reduced, tf.IndexedSlices)
    dense = tf.convert_to_tensor(reduced).numpy()
    expected = np.zeros((4, 3))
    for r in range(SIZE):
        expected[r:r + 2] += rank_data(r, (2, 3)) / SIZE
    close(dense, expected)
    fp16 = hvd.allreduce(tf.constant(rank_data(RANK, (9,))), compression=hvd.Compression.fp16)
    assert fp16.dtype == tf.float32
    close(fp16, np.mean([rank_data(r, (9,)) for r in range(SIZE)], 0), 2e-3)


@check
def ops_inside_tf_function():
    @tf.function
    def step(x, uneven):
        return (hvd.allreduce(x, op=hvd.Sum), hvd.allgather(uneven), hvd.broadcast(x, root_rank=0),
                hvd.grouped_allreduce([x, 2 * x]))

    for repeat in range(3):  # the traced function runs several times, like a training step
        s, g, b, grouped = step(tf.constant(rank_data(RANK + repeat, (4,))),
                                tf.constant(rank_data(RANK, (RANK + 2, 2))))
        close(s, sum(rank_data(r + repeat, (4,)) for r in range(SIZE)))
        close(g, np.concatenate([rank_data(r, (r + 2, 2)) for r in range(SIZE)]))
        close(b, rank_data(0 + repeat, (4,)))
        close(grouped[1], 2 * np.mean([rank_data(r + repeat, (4,)) for r in range(SIZE)], 0))


@check
def gradients_through_collectives_eager_and_graph():
    weights = [rank_data(r + 50, (5,)) for r in range(SIZE)]

    for mode, wrap in (("eager", lambda f: f), ("tf.function", tf.function)):
        @wrap
        def allreduce_grad(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(hvd.allreduce(x) * weights[RANK])
            return tape.gradient(loss, x)

        @wrap
        def broadcast_grad(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(hvd.broadcast(x, root_rank=0) * weights[RANK])
            return tape.gradient(loss, x)

        @wrap
        def allgather_grad(x, c):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(hvd.allgather(x) * c)
            return tape.gradient(loss, x)

        @wrap
        def reducescatter_grad(x, c):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(hvd.reducescatter(x, op=hvd.Sum) * c)
            return tape.gradient(loss, x)

        @wrap
        def alltoall_grad(x, c):
            with tf.GradientTape() as tape:
                tape.watch(x)
                out, _ = hvd.alltoall(x, splits=[1] * SIZE)
                loss = tf.reduce_sum(out * c)
            return tape.gradient(loss, x)

        close(allreduce_grad(tf.constant(rank_data(RANK, (5,)))), sum(weights) / SIZE)
        # Horovod's gradients (tests/frameworks/test_tensorflow_horovod_semantics.py has the closed forms)
        close(broadcast_grad(tf.constant(rank_data(RANK, (5,)))), sum(weights) / SIZE if RANK == 0 else np.zeros(5))
        rows = sum(k + 1 for k in range(SIZE))
        coeff = [rank_data(r + 70, (rows, 2)) for r in range(SIZE)]
        offset = sum(k + 1 for k in range(RANK))
        close(allgather_grad(tf.constant(rank_data(RANK, (RANK + 1, 2))), tf.constant(coeff[RANK])),
              sum(coeff)[offset:offset + RANK + 1] / SIZE)
        coeff = [rank_data(r + 90, (2, 2)) for r in range(SIZE)]
        close(reducescatter_grad(tf.constant(rank_data(RANK, (2 * SIZE, 2))), tf.constant(coeff[RANK])),
              np.concatenate(coeff) * SIZE)
        coeff = [rank_data(r + 110, (SIZE, 3)) for r in range(SIZE)]
        close(alltoall_grad(tf.constant(rank_data(RANK, (SIZE, 3))), tf.constant(coeff[RANK])),
              np.stack([coeff[dst][RANK] for dst in range(SIZE)]))
    return "eager and tf.function"


@check
def broadcast_variables_and_objects():
    v = tf.Variable(rank_data(RANK, (3, 3)))
    w = tf.Variable(rank_data(RANK + 5, (2,), np.float64))
    hvd.broadcast_variables([v, w], root_rank=SIZE - 1)
    close(v.numpy(), rank_data(SIZE - 1, (3, 3)))
    close(w.numpy(), rank_data(SIZE - 1 + 5, (2,), np.float64))
    u = tf.Variable(rank_data(RANK + 9, (4,)))

    @tf.function
    def bcast():
        hvd.broadcast_variables([u], root_rank=0)
    bcast()
    close(u.numpy(), rank_data(9, (4,)))
    assert hvd.broadcast_object({"r": RANK}, root_rank=SIZE - 1) == {"r": SIZE - 1}
    assert hvd.allgather_object(RANK * 10) == [r * 10 for r in range(SIZE)]


# ---------------------------------------------------------------------------------------------- training
digits = load_digits()
X_ALL = (digits.data / 16.0).astype(np.float32)
Y_ALL = digits.target.astype(np.int64)
X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = X_ALL[:1408], Y_ALL[:1408], X_ALL[1408:], Y_ALL[1408:]
GLOBAL_BATCH = 64
LOCAL_BATCH = GLOBAL_BATCH // SIZE


def shard(a: np.ndarray) -> np.ndarray:
    """This rank's part of every global batch (global batch k = rows 64k..64k+63), in batch order."""
    n = len(a) // GLOBAL_BATCH * GLOBAL_BATCH
    blocks = a[:n].reshape(-1, GLOBAL_BATCH, *a.shape[1:])
    return blocks[:, RANK * LOCAL_BATCH:(RANK + 1) * LOCAL_BATCH].reshape(-1, *a.shape[1:])


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10)])


def flat(variables) -> np.ndarray:
    return np.concatenate([np.asarray(v).reshape(-1).astype(np.float64) for v in variables])


def spread_across_ranks(variables) -> float:
    gathered = np.asarray(hvd.allgather(tf.constant(flat(variables)[None, :])))
    return float(np.abs(gathered - gathered[0]).max())


class RecordSpread(keras.callbacks.Callback):
    """Asserts after every batch that the weights are identical on every rank."""

    def __init__(self):
        super().__init__()
        self.worst, self.batches = 0.0, 0

    def on_train_batch_end(self, batch, logs=None):
        self.worst = max(self.worst, spread_across_ranks(self.model.weights))
        self.batches += 1


def accuracy(model) -> float:
    return float((np.argmax(model.predict(X_TEST, verbose=0), 1) == Y_TEST).mean())


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@check
def custom_loop_distributed_gradient_tape_matches_single_rank():
    model, ref = make_model(1), make_model(1)
    opt, ref_opt = keras.optimizers.SGD(0.1, momentum=0.9), keras.optimizers.SGD(0.1, momentum=0.9)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def ref_step(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, ref(x, training=True))
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))

    xs, ys = shard(X_TRAIN), shard(Y_TRAIN)
    worst = 0.0
    for k in range(len(X_TRAIN) // GLOBAL_BATCH * 4):  # four epochs
        b = k % (len(X_TRAIN) // GLOBAL_BATCH)
        step(xs[b * LOCAL_BATCH:(b + 1) * LOCAL_BATCH], ys[b * LOCAL_BATCH:(b + 1) * LOCAL_BATCH])
        ref_step(X_TRAIN[b * GLOBAL_BATCH:(b + 1) * GLOBAL_BATCH], Y_TRAIN[b * GLOBAL_BATCH:(b + 1) * GLOBAL_BATCH])
        worst = max(worst, spread_across_ranks(model.weights))
    assert worst == 0.0, f"weights differ across ranks by {worst}"
    diff = float(np.abs(flat(model.weights) - flat(ref.weights)).max())
    acc, ref_acc = accuracy(model), accuracy(ref)
    assert diff < 1e-4, f"differs from the 1-rank reference by {diff}"
    assert abs(acc - ref_acc) <= 0.01 and acc > 0.8, (acc, ref_acc)
    return f"accuracy 2 ranks {acc:.4f}, 1 rank {ref_acc:.4f}, max diff {diff:.1e}"


@check
def partial_tape_keeps_local_layer_local_and_sparse_grads():
    keras.utils.set_random_seed(3 + RANK)  # local layer differs per rank
    local = keras.layers.Dense(4)
    local.build((None, 3))
    keras.utils.set_random_seed(3)
    shared = keras.layers.Dense(2)
    shared.build((None, 4))
    emb = keras.layers.Embedding(10, 3)
    emb.build((None,))
    x = tf.constant(rank_data(RANK, (6, 3)))
    ids = tf.constant([RANK, RANK + 1, 5])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared(local(x))) + tf.reduce_sum(emb(ids) * 2.0)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
    variables = local.trainable_weights + shared.trainable_weights + emb.trainable_weights
    grads = tape.gradient(loss, variables)
    with tf.GradientTape() as raw_tape:
        raw = tf.reduce_sum(shared(local(x))) + tf.reduce_sum(emb(ids) * 2.0)
    raw_grads = raw_tape.gradient(raw, variables)
    # local kernel: own gradient scaled by 1/size; shared kernel: averaged; embedding: IndexedSlices, averaged
    close(grads[0], np.asarray(raw_grads[0]) / SIZE)
    all_shared = hvd.allgather_object(np.asarray(raw_grads[2]))
    close(grads[2], np.mean(all_shared, 0))
    assert isinstance(grads[4], tf.IndexedSlices), type(grads[4])
    expected = np.zeros((10, 3))
    for r in range(SIZE):
        for i in (r, r + 1, 5):
            expected[i] += 2.0 / SIZE
    close(tf.convert_to_tensor(grads[4]), expected)


@check
def keras_fit_matches_single_rank_with_callbacks():
    model, ref = make_model(100 + RANK), make_model(7)  # different inits: the broadcast callback fixes them
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss=LOSS,
                  metrics=["accuracy"])
    spread = RecordSpread()
    raw, averaged = [], []
    record_raw = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: raw.append(dict(logs)))
    record_avg = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: averaged.append(dict(logs)))
    model.fit(shard(X_TRAIN), shard(Y_TRAIN), batch_size=LOCAL_BATCH, epochs=3, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), spread, record_raw,
                         hvdk.callbacks.MetricAverageCallback(), record_avg])
    # the 1-rank reference starts from rank 0's initial weights
    keras.utils.set_random_seed(100)
    ref.set_weights(make_model(100).get_weights())
    ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=LOSS)
    ref.fit(X_TRAIN, Y_TRAIN, batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0)
    assert spread.batches == 3 * len(X_TRAIN) // GLOBAL_BATCH and spread.worst == 0.0, (spread.batches,
                                                                                         spread.worst)
    diff = float(np.abs(flat(model.weights) - flat(ref.weights)).max())
    acc, ref_acc = accuracy(model), accuracy(ref)
    assert diff < 1e-4, f"differs from the 1-rank reference by {diff}"
    assert abs(acc - ref_acc) <= 0.01 and acc > 0.8, (acc, ref_acc)
    everyone_raw = hvd.allgather_object(raw)
    everyone_avg = hvd.allgather_object(averaged)
    for epoch in range(3):
        for key in ("loss", "accuracy"):
            mean = np.mean([everyone_raw[r][epoch][key] for r in range(SIZE)])
            assert abs(everyone_avg[RANK][epoch][key] - mean) < 1e-6, (key, everyone_avg[RANK][epoch], mean)
    assert len({round(everyone_raw[r][0]["loss"], 9) for r in range(SIZE)}) == SIZE, "local losses were equal"
    return f"accuracy 2 ranks {acc:.4f}, 1 rank {ref_acc:.4f}, max diff {diff:.1e}"


@check
def keras_backward_passes_per_step():
    model, ref = make_model(5), make_model(5)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05), backward_passes_per_step=2),
                  loss=LOSS)
    # summed accumulated gradients = Keras's averaged accumulation at twice the learning rate
    ref.compile(optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), loss=LOSS)
    spread = RecordSpread()
    n = 8 * GLOBAL_BATCH
    model.fit(shard(X_TRAIN[:n]), shard(Y_TRAIN[:n]), batch_size=LOCAL_BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[spread])
    ref.fit(X_TRAIN[:n], Y_TRAIN[:n], batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    assert spread.worst == 0.0
    diff = float(np.abs(flat(model.weights) - flat(ref.weights)).max())
    moved = float(np.abs(flat(model.weights) - flat(make_model(5).weights)).max())
    assert diff < 1e-4 and moved > 1e-3, (diff, moved)
    return f"max diff {diff:.1e}"


@check
def learning_rate_callbacks():
    model = make_model(9)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.4)), loss=LOSS)
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: seen.append(float(model.optimizer.learning_rate)))
    steps = 4
    n = steps * GLOBAL_BATCH
    model.fit(shard(X_TRAIN[:n]), shard(Y_TRAIN[:n]), batch_size=LOCAL_BATCH, epochs=3, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), record])
    # Horovod's warm-up: batch b of epoch e uses epoch e + (b + 1) / steps, so that an epoch ends on a round value
    expected = [0.4 / SIZE * ((e + (b + 1) / steps) * (SIZE - 1) / 2 + 1) for e in range(2) for b in range(steps)]
    close(seen[:2 * steps], expected, 1e-6)
    close(seen[2 * steps:], [0.4] * steps, 1e-6)

    seen.clear()
    history = model.fit(shard(X_TRAIN[:n]), shard(Y_TRAIN[:n]), batch_size=LOCAL_BATCH, epochs=3, shuffle=False,
                        verbose=0, callbacks=[hvdk.callbacks.LearningRateScheduleCallback(
                            initial_lr=0.4, multiplier=lambda epoch: 0.5 ** epoch, start_epoch=1), record])
    close(seen, [0.4] * steps + [0.2] * steps + [0.1] * steps, 1e-6)
    close(history.history["lr"], [0.4, 0.2, 0.1], 1e-6)


@check
def checkpoint_restore_with_load_model_and_broadcast_callback():
    tmp = hvd.broadcast_object(tempfile.mkdtemp(prefix="hpcvod-keras-ckpt-") if RANK == 0 else None, root_rank=0)
    path = os.path.join(tmp, "model.keras")
    model = make_model(11)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss=LOSS)
    n = 4 * GLOBAL_BATCH
    model.fit(shard(X_TRAIN[:n]), shard(Y_TRAIN[:n]), batch_size=LOCAL_BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
    if RANK == 0:
        model.save(path)
    hvd.barrier()
    saved_weights = flat(model.weights)
    saved_opt = flat(model.optimizer.variables)
    assert int(model.optimizer.iterations) == 4

    # rank 0 resumes from the file; the others start from scratch with other weights and a fresh optimizer
    if RANK == 0:
        resumed = hvdk.load_model(path)
        assert hasattr(resumed.optimizer, "_hvd"), "load_model did not make the optimizer distributed"
        assert type(resumed.optimizer).__name__ == "Adam"
    else:
        resumed = make_model(500 + RANK)
        resumed.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.Adam(0.5)), loss=LOSS)
    state = {}

    def after_broadcast(logs=None):
        state["weights"] = flat(resumed.weights)
        state["opt"] = flat(resumed.optimizer.variables)
        state["lr"] = float(resumed.optimizer.learning_rate)

    spread = RecordSpread()
    resumed.fit(shard(X_TRAIN[:n]), shard(Y_TRAIN[:n]), batch_size=LOCAL_BATCH, epochs=1, shuffle=False,
                verbose=0, callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                                      keras.callbacks.LambdaCallback(on_train_begin=after_broadcast), spread])
    close(state["weights"], saved_weights, 0.0)
    close(state["opt"], saved_opt, 0.0)
    assert state["lr"] == np.float32(0.01), state["lr"]
    assert spread.worst == 0.0
    assert int(resumed.optimizer.iterations) == 8
    hvd.barrier()
    if RANK == 0:
        os.remove(path)
        os.rmdir(tmp)


@check
def xla_compiled_step_gives_a_clear_error():
    model = make_model(13)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=LOSS, jit_compile=True)
    try:
        model.fit(shard(X_TRAIN[:GLOBAL_BATCH]), shard(Y_TRAIN[:GLOBAL_BATCH]), batch_size=LOCAL_BATCH, verbose=0)
    except Exception as exc:  # noqa: BLE001
        assert "jit_compile=False" in str(exc), str(exc)[:500]
        return "raised: " + str(exc).splitlines()[0][:120]
    raise AssertionError("an XLA-compiled train step ran hpcvod collectives without an error")


check.report(output_path())
hvd.shutdown()
