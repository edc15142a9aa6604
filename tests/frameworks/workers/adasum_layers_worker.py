"""op=hvd.Adasum through the TensorFlow/Keras and MXNet layers (argument: ``tensorflow`` or ``mxnet``), 2 ranks.

Each layer's result must equal the runtime's Adasum of the same NumPy arrays (tests/runtime/test_adasum_mpi.py
checks that one against Horovod's formula). Keras reduces gradients with Adasum, as Horovod's Keras optimizer does
with op=Adasum; MXNet's Adasum is an extension (Horovod's MXNet binding refuses op=Adasum).
"""

from __future__ import annotations

import sys

import numpy as np
from _harness import Checks

import hpcvod.runtime as rt

FRAMEWORK = sys.argv[2]
check = Checks()


def mine(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, rt.rank()]).standard_normal(n).astype(np.float32)


if FRAMEWORK == "tensorflow":
    import keras
    import tensorflow as tf

    import hpcvod.tensorflow as hvd
    import hpcvod.tensorflow.keras as hvd_keras

    hvd.init()

    @check
    def tensorflow_allreduce_and_grouped_allreduce_are_the_runtimes_adasum():
        got = hvd.allreduce(tf.constant(mine(1, 37)), op=hvd.Adasum, name="tf.one").numpy()
        group = hvd.grouped_allreduce([tf.constant(mine(2, 5)), tf.constant(mine(3, 300))], op=hvd.Adasum,
                                      name="tf.group")
        want = rt.allreduce(mine(1, 37), op=rt.Adasum, name="np.one")
        wants = rt.grouped_allreduce([mine(2, 5), mine(3, 300)], op=rt.Adasum, name="np.group")
        assert np.array_equal(got, want), (got[:4], want[:4])
        for g, w in zip(group, wants):
            assert np.array_equal(g.numpy(), w)

    @check
    def keras_distributed_optimizer_with_adasum_trains_and_ranks_stay_identical():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        model.compile(hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05), op=hvd.Adasum), "mse")
        x = np.random.default_rng(rt.rank()).standard_normal((128, 4)).astype(np.float32)
        y = x @ np.ones((4, 1), np.float32)
        history = model.fit(x, y, epochs=4, batch_size=32, verbose=0,
                            callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
        losses = history.history["loss"]
        weights = np.concatenate([w.ravel() for w in model.get_weights()])[None]
        everyone = rt.allgather(weights, name="keras.weights")
        assert all(np.array_equal(everyone[0], row) for row in everyone), "the ranks' weights differ"
        assert losses[-1] < 0.5 * losses[0], losses
        return f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
else:
    import hpcvod.mxnet as hvd  # before mxnet (NumPy alias)
    import mxnet as mx

    hvd.init()

    @check
    def mxnet_allreduce_in_and_out_of_place_is_the_runtimes_adasum():
        got = hvd.allreduce(mx.nd.array(mine(4, 41)), op=hvd.Adasum, name="mx.one").asnumpy()
        in_place = mx.nd.array(mine(5, 9))
        hvd.allreduce_(in_place, op=hvd.Adasum, name="mx.in_place")
        assert np.array_equal(got, rt.allreduce(mine(4, 41), op=rt.Adasum, name="np.mx.one"))
        assert np.array_equal(in_place.asnumpy(), rt.allreduce(mine(5, 9), op=rt.Adasum, name="np.mx.in_place"))

check.report(sys.argv[1])
