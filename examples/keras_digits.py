"""Keras 3 (TensorFlow backend) data-parallel training with hpcvod's Horovod API on scikit-learn's digits.

    mpiexec -n 2 python examples/keras_digits.py       # or: hpcvod run -np 2 python examples/keras_digits.py
    python examples/keras_digits.py                     # one rank, for comparison

A Horovod script with one changed line (``import horovod.tensorflow.keras as hvd`` ->
``import hpcvod.tensorflow.keras as hvd``). Rank r takes samples r, r+size, ... of every global batch, so any
number of ranks trains on the same global batches and reaches the same accuracy (up to rounding).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import hpcvod.tensorflow.keras as hvd  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)  # one core per rank on a shared node
    keras.utils.set_random_seed(hvd.rank())  # different on purpose: the broadcast callback unifies them
    if args.global_batch % hvd.size():
        raise SystemExit(f"--global-batch {args.global_batch} is not divisible by the {hvd.size()} ranks")
    local_batch = args.global_batch // hvd.size()

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    n_train = len(x[:1400]) // args.global_batch * args.global_batch
    # This rank's samples of every global batch, in order (fit's batches of local_batch line up with them).
    mine = np.arange(n_train).reshape(-1, args.global_batch)[:, hvd.rank()::hvd.size()].reshape(-1)
    x_train, y_train = x[mine], y[mine]
    x_test, y_test = x[1400:], y[1400:]

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    model.fit(x_train, y_train, batch_size=local_batch, epochs=args.epochs, shuffle=False, callbacks=callbacks,
              verbose=2 if hvd.rank() == 0 else 0)

    correct = float((np.argmax(model.predict(x_test[hvd.rank()::hvd.size()], verbose=0), 1)
                     == y_test[hvd.rank()::hvd.size()]).sum())
    correct = float(hvd.allreduce(tf.constant(correct, tf.float64), op=hvd.Sum, name="correct"))
    if hvd.rank() == 0:
        print(f"test accuracy {correct / len(x_test):.4f} ({hvd.size()} ranks, global batch {args.global_batch})")
    hvd.shutdown()


if __name__ == "__main__":
    main()
