"""Synthetic TensorFlow 2 / Keras 3 training throughput with hpcvod: 1 rank against 2 ranks.

    .venv/bin/python benchmarks/bench_keras_synthetic.py [--batch-size 32] [--rounds 3]

In the spirit of Horovod's ``tensorflow2_synthetic_benchmark.py``: a ``tf.function`` training step with
``hvd.DistributedGradientTape`` on synthetic 32x32x3 images (the same 12.6 M-parameter MLP as
bench_torch_synthetic.py), one compute thread per rank, warm-up batches then timed iterations; img/sec per
rank and in total, scaling efficiency = 2-rank total / (2 x 1-rank), medians of interleaved rounds. There is
no peer here (tf.distribute's MultiWorkerMirroredStrategy needs a cluster spec and gRPC workers).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic_driver import interleaved, print_result, table  # noqa: E402


def build_model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(),
                             keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(2048, activation="relu"),
                             keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])


def timed(args: argparse.Namespace, step, barrier) -> list[float]:
    """img/sec per rank of each timed iteration, after the warm-up steps."""
    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.iters):
        barrier()
        start = time.perf_counter()
        for _ in range(args.batches_per_iter):
            step()
        barrier()
        rates.append(args.batch_size * args.batches_per_iter / (time.perf_counter() - start))
    return rates


def mwms_worker(args: argparse.Namespace) -> None:
    """The same model and step under tf.distribute.MultiWorkerMirroredStrategy: one worker per rank (the rank
    from the launcher's PMI variables), gRPC on localhost, ports ``--port + rank``."""
    import json

    import keras
    import tensorflow as tf

    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{args.port + r}" for r in range(size)]},
                                          "task": {"type": "worker", "index": rank}})
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    data = tf.random.normal((args.batch_size, 32, 32, 3))
    target = tf.random.uniform((args.batch_size,), 0, 10, dtype=tf.int64)

    def replica_step() -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))   # all-reduced across the workers

    @tf.function
    def step() -> None:
        strategy.run(replica_step)

    @tf.function
    def ones() -> tf.Tensor:
        return strategy.run(lambda: tf.constant(1.0))

    def barrier() -> None:       # a cross-worker reduction: returns once every worker got here
        strategy.reduce(tf.distribute.ReduceOp.SUM, ones(), axis=None).numpy()

    rates = timed(args, step, barrier)
    if rank == 0:
        print_result(rates, int(sum(v.numpy().size for v in model.trainable_variables)))


def worker(args: argparse.Namespace) -> None:
    if args.worker == "mwms":
        mwms_worker(args)
        return
    import keras
    import tensorflow as tf

    import hpcvod.tensorflow as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    hvd.init()
    model = build_model()
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    data = tf.random.normal((args.batch_size, 32, 32, 3))
    target = tf.random.uniform((args.batch_size,), 0, 10, dtype=tf.int64)

    @tf.function
    def step(first: bool) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first:  # after the first step, so that the optimizer's variables exist
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)

    step(True)
    rates = timed(args, lambda: step(False), hvd.barrier)
    if hvd.rank() == 0:
        print_result(rates, int(sum(v.numpy().size for v in model.trainable_variables)))
    hvd.shutdown()


def driver(args: argparse.Namespace) -> None:
    worker_args = ["--batch-size", str(args.batch_size), "--warmup", str(args.warmup), "--iters", str(args.iters),
                   "--batches-per-iter", str(args.batches_per_iter)]
    med, params = interleaved(__file__, [("hpcvod", 1), ("hpcvod", 2)], worker_args, args.rounds)
    print()
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, tensorflow {version('tensorflow-cpu')}, MLP "
          f"({params / 1e6:.1f} M parameters), batch {args.batch_size} per rank, 1 compute thread per rank, "
          f"medians of {args.rounds} interleaved rounds")
    table([("hpcvod, 1 rank", med[("hpcvod", 1)], 1),
           ("hpcvod DistributedGradientTape", med[("hpcvod", 2)], 2)], med[("hpcvod", 1)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--batches-per-iter", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", choices=["hpcvod", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
