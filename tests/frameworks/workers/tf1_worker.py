"""TensorFlow v1 graph mode through tf.compat.v1 (issue 17), under ``mpiexec -n N`` (N = 1, 2, 4).

argv: RESULTS.json CHECKPOINT_BASE. Eager execution is off for the whole process, as in TF1 code.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf
from _harness import Checks

import hpcvod.runtime as rt
import hpcvod.tensorflow as hvd

tf.compat.v1.disable_eager_execution()
hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
check = Checks()
OUT, CKPT_BASE = sys.argv[1], sys.argv[2]

FEATURES, PER_RANK, STEPS, LR = 5, 8, 6, 0.05
DATA_RNG = np.random.default_rng(7)
X_ALL = DATA_RNG.normal(size=(SIZE * PER_RANK, FEATURES)).astype(np.float32)
Y_ALL = (X_ALL @ np.arange(1, FEATURES + 1, dtype=np.float32) + 0.5).astype(np.float32)


def linear_graph(init_seed: int, optimizer_factory, local_bias: bool = False, **wrap):
    """A linear regression (mean squared error) whose initial weights depend on ``init_seed``."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
        y = tf.compat.v1.placeholder(tf.float32, [None])
        init = np.random.default_rng(init_seed)
        w = tf.compat.v1.get_variable("w", initializer=init.normal(size=FEATURES).astype(np.float32))
        b = tf.compat.v1.get_variable("b", initializer=np.float32(init.normal()))
        loss = tf.reduce_mean(tf.square(tf.linalg.matvec(x, w) + b - y))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        opt = hvd.DistributedOptimizer(optimizer_factory(), **wrap)
        if local_bias:
            opt.register_local_var(b)      # before minimize(), which computes the gradients
        train_op = opt.minimize(loss, global_step=global_step)
    return graph, x, y, w, b, opt, train_op


def reference_sgd(w: np.ndarray, b: float, steps: int, lr: float) -> tuple[np.ndarray, float]:
    """One process, the combined batch of every rank, plain gradient descent (float64)."""
    w, b = w.astype(np.float64), float(b)
    x, y = X_ALL.astype(np.float64), Y_ALL.astype(np.float64)
    for _ in range(steps):
        r = x @ w + b - y
        w, b = w - lr * 2 * x.T @ r / len(y), b - lr * 2 * r.mean()
    return w, b


def my_batch() -> tuple[np.ndarray, np.ndarray]:
    return X_ALL[RANK * PER_RANK:(RANK + 1) * PER_RANK], Y_ALL[RANK * PER_RANK:(RANK + 1) * PER_RANK]


@check
def seeds_example_hook_session_and_rank0_checkpoints():
    # Every rank starts from different weights: BroadcastGlobalVariablesHook(0) must give them rank 0's.
    graph, x, y, w, b, opt, train_op = linear_graph(100 + RANK, lambda: tf.compat.v1.train.GradientDescentOptimizer(LR))
    my_base = os.path.join(CKPT_BASE, f"rank{RANK}")
    os.makedirs(my_base, exist_ok=True)
    checkpoint_dir = os.path.join(my_base, "ckpt") if RANK == 0 else None
    rank0_init = np.random.default_rng(100)
    w0, b0 = rank0_init.normal(size=FEATURES).astype(np.float32), np.float32(rank0_init.normal())
    xb, yb = my_batch()
    with graph.as_default():
        hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.compat.v1.train.StopAtStepHook(last_step=STEPS)]
        with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks,
                                                         save_checkpoint_steps=STEPS) as sess:
            first = True
            while not sess.should_stop():
                if first:
                    got_w = sess.run(w)
                    np.testing.assert_array_equal(got_w, w0, err_msg="the hook broadcast rank 0's initial weights")
                    first = False
                sess.run(train_op, feed_dict={x: xb, y: yb})
        with tf.compat.v1.Session() as plain:
            saver = tf.compat.v1.train.Saver()
            everyone_dir = rt.broadcast_object(checkpoint_dir, root_rank=0)
            saver.restore(plain, tf.train.latest_checkpoint(everyone_dir))
            final_w, final_b = plain.run([w, b])
    ref_w, ref_b = reference_sgd(w0, b0, STEPS, LR)
    np.testing.assert_allclose(final_w, ref_w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(final_b, ref_b, rtol=1e-4, atol=1e-5)
    everyone = rt.allgather_object((final_w.tolist(), float(final_b)))
    assert all(e == everyone[0] for e in everyone), "every rank holds the same weights"
    files = rt.allgather_object(sorted(os.listdir(my_base)))
    assert files[0] == ["ckpt"] and all(f == [] for f in files[1:]), f"checkpoints only on rank 0: {files}"


@check
def broadcast_global_variables_after_initialization():
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("v", initializer=np.full(3, RANK, np.float32))
        step = tf.compat.v1.train.get_or_create_global_step()
        bcast = hvd.broadcast_global_variables(SIZE - 1)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(bcast)
            np.testing.assert_array_equal(sess.run(v), np.full(3, SIZE - 1, np.float32))
            assert sess.run(step) == 0


@check
def every_graph_collective_gives_the_eager_values():
    # The eager forms are the runtime's collectives on the same arrays: compare with those.
    mine = np.arange(6, dtype=np.float32).reshape(3, 2) + 10 * RANK
    graph = tf.Graph()
    with graph.as_default():
        t = tf.constant(mine)
        ops = {
            "allreduce": hvd.allreduce(t, op=hvd.Sum),
            "average": hvd.allreduce(t),
            "grouped": hvd.grouped_allreduce([t, t * 2], op=hvd.Sum),
            "allgather": hvd.allgather(t),
            "broadcast": hvd.broadcast(t, SIZE - 1),
            "alltoall": hvd.alltoall(tf.constant(np.repeat(mine[:1], SIZE, 0))),
            "reducescatter": hvd.reducescatter(tf.constant(np.repeat(mine[:1], SIZE, 0)), op=hvd.Sum),
        }
        with tf.compat.v1.Session() as sess:
            got = sess.run(ops)
    np.testing.assert_array_equal(got["allreduce"], rt.allreduce(mine, op=rt.Sum, name="ref.ar"))
    np.testing.assert_allclose(got["average"], rt.allreduce(mine, op=rt.Average, name="ref.avg"), rtol=1e-6)
    np.testing.assert_array_equal(got["grouped"][1], rt.allreduce(mine * 2, op=rt.Sum, name="ref.grouped"))
    np.testing.assert_array_equal(got["allgather"], rt.allgather(mine, name="ref.ag"))
    np.testing.assert_array_equal(got["broadcast"], rt.broadcast(mine, SIZE - 1, name="ref.bc"))
    np.testing.assert_array_equal(got["alltoall"], rt.alltoall(np.repeat(mine[:1], SIZE, 0), name="ref.a2a"))
    np.testing.assert_array_equal(got["reducescatter"],
                                  rt.reducescatter(np.repeat(mine[:1], SIZE, 0), op=rt.Sum, name="ref.rs"))


@check
def optimizer_options_sum_local_vars_and_aggregation():
    xb, yb = my_batch()
    # op=Sum: the update is SIZE times the averaged one, for SGD from identical weights
    graph, x, y, w, b, opt, train_op = linear_graph(5, lambda: tf.compat.v1.train.GradientDescentOptimizer(LR),
                                                    op=hvd.Sum)
    with graph.as_default(), tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        w_start, b_start = sess.run([w, b])
        sess.run(train_op, feed_dict={x: xb, y: yb})
        summed_step = sess.run(w) - w_start
    ref_w, _ = reference_sgd(w_start, b_start, 1, LR)
    np.testing.assert_allclose(summed_step, SIZE * (ref_w - w_start), rtol=1e-4, atol=1e-5)
    # register_local_var: that variable's gradient stays local (scaled by 1/size), so ranks drift apart on it
    graph, x, y, w, b, opt, train_op = linear_graph(5, lambda: tf.compat.v1.train.GradientDescentOptimizer(LR),
                                                    local_bias=True)
    with graph.as_default():
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            w_start, b_start = sess.run([w, b])
            sess.run(train_op, feed_dict={x: xb, y: yb})
            local_b_step, w_now = sess.run(b) - b_start, sess.run(w)
    r = xb @ w_start + b_start - yb
    np.testing.assert_allclose(local_b_step, -LR * 2 * r.mean() / SIZE, rtol=1e-4, atol=1e-6)
    everyone = rt.allgather_object(w_now.tolist())
    assert all(e == everyone[0] for e in everyone), "the reduced variable stays identical on every rank"
    # backward_passes_per_step=2: nothing moves after one run, the summed gradient of both applies after two
    graph, x, y, w, b, opt, train_op = linear_graph(5, lambda: tf.compat.v1.train.AdagradOptimizer(LR),
                                                    backward_passes_per_step=2, average_aggregated_gradients=True)
    with graph.as_default(), tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
        start = sess.run(w)
        sess.run(train_op, feed_dict={x: xb, y: yb})
        np.testing.assert_array_equal(sess.run(w), start, err_msg="no update after the first of two passes")
        sess.run(train_op, feed_dict={x: xb, y: yb})
        moved = sess.run(w)
    assert not np.array_equal(moved, start), "the update came after the second pass"
    everyone = rt.allgather_object(moved.tolist())
    assert all(e == everyone[0] for e in everyone), "every rank applied the same aggregated update"


@check
def fetching_one_op_runs_only_what_it_depends_on():
    # Horovod's graph ops are independent kernels: running `later` must neither run `counted` (its py_function
    # counter stays 0) nor need the placeholder that only `fed` reads (hpcvod once chained every op to the one
    # built before it)
    runs = [0]

    def count(x):
        runs[0] += 1
        return x

    graph = tf.Graph()
    with graph.as_default():
        feed = tf.compat.v1.placeholder(tf.float32, [2])
        fed = hvd.allreduce(feed, op=hvd.Sum)
        counted = hvd.allreduce(tf.py_function(count, [tf.constant([1.0, 2.0])], tf.float32), op=hvd.Sum)
        later = hvd.allreduce(tf.constant([RANK, 1.0]), op=hvd.Sum)
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(later), [SIZE * (SIZE - 1) / 2, SIZE])
            assert runs[0] == 0, f"fetching one allreduce ran an unrelated one ({runs[0]} runs)"
            np.testing.assert_array_equal(sess.run(counted), [SIZE, 2 * SIZE])
            assert runs[0] == 1
            np.testing.assert_array_equal(sess.run(fed, feed_dict={feed: [1.0, 1.0]}), [SIZE] * 2)


@check
def ops_run_in_different_orders_pair_by_name_and_fuse():
    # Each rank delays its inputs so that it submits the collectives in a different order (rank 0 first to last,
    # rank 1 last to first): the engine pairs them by their graph names, and those ready together are fused
    import json
    import tempfile
    import time

    n = 40

    def delayed(i):
        def late(x):
            time.sleep(0.005 * (i if RANK % 2 == 0 else n - i))
            return x
        return tf.py_function(late, [tf.constant(np.full(4, i * (RANK + 1), np.float32))], tf.float32)

    graph = tf.Graph()
    with graph.as_default():
        ops = [hvd.allreduce(delayed(i), op=hvd.Sum) for i in range(n)]
        path = os.path.join(tempfile.mkdtemp(), "timeline.json")
        with tf.compat.v1.Session() as sess:
            hvd.start_timeline(path)
            for _ in range(8):   # fusion needs two ops ready in one engine cycle: eight chances on a loaded node
                # (three were too few once in CI: every op of the three runs reduced alone)
                got = sess.run(ops)
            hvd.stop_timeline()
    for i, value in enumerate(got):
        np.testing.assert_array_equal(value, np.full(4, i * SIZE * (SIZE + 1) / 2, np.float32))
    if RANK == 0 and SIZE > 1:
        with open(path) as f:
            events = json.load(f)
        names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
        assert sum("HorovodAllreduce" in name for name in names) == n, sorted(names)
        fused = [e["args"].get("fused", 1) for e in events if e.get("name") == "MPI_ALLREDUCE" and e.get("args")]
        assert max(fused) > 1, f"no two graph allreduces were fused: {fused}"


check.report(OUT)
