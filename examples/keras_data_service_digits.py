"""Keras 3 training fed by the tf.data service compute job (Horovod's tensorflow2_mnist_data_service, on digits).

    CONFIG=/shared/path/service.json
    hpcvod run -np 2 python -m hpcvod.tensorflow.data.compute_worker $CONFIG &     # the compute job (CPU ranks)
    hpcvod run -np 2 python examples/keras_data_service_digits.py $CONFIG          # the training job

The input pipeline (shuffle, a pure-TF augmentation, batching) runs in the compute job's tf.data workers; each
training rank pulls ready batches (``distributed_epoch`` with a shared job: every batch reaches one rank once per
epoch). The seed's two variants, chosen by the compute job's ``--dispatcher-side`` (the config says which):
``compute`` (default: the compute job runs the dispatcher, the script calls ``send_to_data_service``) and
``training`` (rank 0 of the training job runs it inside ``with tf_data_service(...)`` and applies ``distribute``):

    hpcvod run -np 2 python -m hpcvod.tensorflow.data.compute_worker --dispatcher-side training $CONFIG &
    hpcvod run -np 2 python examples/keras_data_service_digits.py $CONFIG

Rank 0 tells the compute job to stop when training is done. ``--local`` trains the same model on the same pipeline
run in the training ranks themselves (each rank a disjoint shard of the batches), for comparison; no compute job.
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
    parser.add_argument("config", nargs="?", default=os.environ.get("HPCVOD_DATA_SERVICE_CONFIG"),
                        help="the compute job's config file (a shared path; default $HPCVOD_DATA_SERVICE_CONFIG, "
                        "set by `hpcvod submit --data-service-nodes N`)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="batch per rank")
    parser.add_argument("--local", action="store_true", help="no data service: the pipeline runs in each rank")
    args = parser.parse_args()
    if not args.local and not args.config:
        parser.error("CONFIG: the compute job's config file is needed (or --local to train without the service)")

    hvd.init()
    keras.utils.set_random_seed(hvd.rank())
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
    # every rank must run the same number of steps: the shared job splits batches unevenly
    steps = 1400 // args.batch // hvd.size() - 1

    def fit(dataset: tf.data.Dataset) -> None:
        model.fit(dataset.repeat(), steps_per_epoch=steps, epochs=args.epochs, verbose=2 if hvd.rank() == 0 else 0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])

    if args.local:
        fit(pipeline.shard(hvd.size(), hvd.rank()))
    else:
        config = TfDataServiceConfig.read(args.config, wait_for_file_creation=True)
        if config.dispatcher_side == "compute":
            fit(pipeline.send_to_data_service(config, hvd.rank(), hvd.size(), reuse_dataset=True))
        else:
            # this job runs the dispatcher (rank 0) for as long as the block lasts
            with tf_data_service(config, hvd.rank()) as address:
                fit(pipeline.apply(tf.data.experimental.service.distribute(
                    processing_mode="distributed_epoch", service=address, job_name="digits")))
    loss, accuracy = model.evaluate(x[1400:], y[1400:], verbose=0)
    if hvd.rank() == 0:
        where = "local pipeline" if args.local else f"data service, {config.dispatcher_side}-side dispatcher"
        print(f"test accuracy {accuracy:.4f} ({hvd.size()} ranks, {where})", flush=True)
        if not args.local:
            config.shutdown()


if __name__ == "__main__":
    main()
