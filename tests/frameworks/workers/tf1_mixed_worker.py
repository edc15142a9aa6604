"""TF v1 graph code and TF2 eager Keras code in one process (issue 17), under ``mpiexec -n 2``: a compat.v1 graph
with its session trains between Keras ``fit`` calls; each side's collectives pair with the same side's on the other
ranks, and both end with identical weights on every rank."""

from __future__ import annotations

import sys

import keras
import numpy as np
import tensorflow as tf
from _harness import Checks

import hpcvod.runtime as rt
import hpcvod.tensorflow as hvd
import hpcvod.tensorflow.keras as hvd_keras

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
check = Checks()
rng = np.random.default_rng(RANK)


@check
def graph_and_eager_in_one_process():
    assert tf.executing_eagerly()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        w = tf.compat.v1.get_variable("w", initializer=rng.normal(size=4).astype(np.float32))
        loss = tf.reduce_mean(tf.square(tf.linalg.matvec(x, w) - 1.0))
        train_op = hvd.DistributedOptimizer(tf.compat.v1.train.AdamOptimizer(0.01)).minimize(loss)
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(hvd.broadcast_global_variables(0))
    keras.utils.set_random_seed(RANK)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse",
                  jit_compile=False)
    hvd_keras.broadcast_variables(model.variables, root_rank=0)
    for _ in range(3):
        sess.run(train_op, feed_dict={x: rng.normal(size=(8, 4)).astype(np.float32)})
        model.fit(rng.normal(size=(16, 4)), rng.normal(size=(16, 3)), batch_size=8, epochs=1, verbose=0)
        assert tf.executing_eagerly(), "the graph session left eager mode on"
    graph_w = sess.run(w)
    sess.close()
    keras_w = [v.numpy().tolist() for v in model.trainable_variables]
    everyone = rt.allgather_object((graph_w.tolist(), keras_w))
    assert all(e == everyone[0] for e in everyone), "graph and Keras weights are identical on every rank"


check.report(sys.argv[1])
