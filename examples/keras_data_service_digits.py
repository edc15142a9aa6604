"""Keras 3 training fed by the tf.data service compute job (Horovod's tensorflow2_mnist_data_service, on digits).

    CONFIG=/shared/path/service.json
    hpcvod run -np 2 python -m hpcvod.tensorflow.data.compute_worker $CONFIG &     # the compute job (CPU ranks)
    hpcvod run -np 2 python examples/keras_data_service_digits.py $CONFIG          # the training job

The input pipeline (shuffle, a pure-TF augmentation, batching) runs in the compute job's tf.data workers; each
training rank pulls ready batches (``distributed_epoch`` with a shared job: every batch reaches one rank once per
epoch). ``--dispatcher-side training`` (on both commands) runs the dispatcher in the training job instead.
Rank 0 tells the compute job to stop when training is done.
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
from hpcvod.tensorflow.data.compute_service import TfDataServiceConfig, tf_data_service  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the compute job's config file (a shared path)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="batch per rank")
    parser.add_argument("--dispatcher-side", choices=["compute", "training"], default="compute")
    args = parser.parse_args()

    hvd.init()
    keras.utils.set_random_seed(hvd.rank())
    config = TfDataServiceConfig.read(args.config, wait_for_file_creation=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)

    # Runs in the service: pure TF ops only (a Python function cannot travel to the workers).
    def noisy(image, label):
        return image + tf.random.normal(tf.shape(image), stddev=0.02), label

    pipeline = (tf.data.Dataset.from_tensor_slices((x[:1400], y[:1400])).shuffle(1400, seed=0)
                .map(noisy).batch(args.batch))
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05 * hvd.size(), momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  jit_compile=False)
    with tf_data_service(config, hvd.rank()) as address:
        dataset = pipeline.apply(tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=address, job_name="digits"))
        # every rank must run the same number of steps: the shared job splits batches unevenly
        steps = 1400 // args.batch // hvd.size() - 1
        model.fit(dataset.repeat(), steps_per_epoch=steps, epochs=args.epochs, verbose=2 if hvd.rank() == 0 else 0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    loss, accuracy = model.evaluate(x[1400:], y[1400:], verbose=0)
    if hvd.rank() == 0:
        print(f"test accuracy {accuracy:.4f} ({hvd.size()} ranks, data service)", flush=True)
        config.shutdown()


if __name__ == "__main__":
    main()
