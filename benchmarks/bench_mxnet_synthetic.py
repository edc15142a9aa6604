"""Synthetic MXNet Gluon training throughput with hpcvod's DistributedTrainer: 1 rank against 2 ranks.

    .venv/bin/python benchmarks/bench_mxnet_synthetic.py [--batch-size 32] [--rounds 3]

In the spirit of Horovod's ``mxnet_imagenet_resnet50.py --benchmark``: the same 12.6 M-parameter MLP as
bench_torch_synthetic.py on synthetic 32x32x3 images, one compute thread per rank, warm-up batches then timed
iterations; img/sec per rank and in total, scaling efficiency = 2-rank total / (2 x 1-rank), medians of
interleaved rounds. There is no peer here (MXNet's own dist_sync kvstore needs parameter-server processes).
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


def worker(args: argparse.Namespace) -> None:
    import hpcvod.mxnet as hvd  # before mxnet (np.bool alias)

    import mxnet as mx
    from mxnet import autograd, gluon

    hvd.init()
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(2048, activation="relu", in_units=3 * 32 * 32),
            gluon.nn.Dense(2048, activation="relu", in_units=2048),
            gluon.nn.Dense(1024, activation="relu", in_units=2048), gluon.nn.Dense(10, in_units=1024))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    data = mx.nd.random.normal(shape=(args.batch_size, 3 * 32 * 32))
    target = mx.nd.array(mx.nd.random.uniform(0, 10, shape=(args.batch_size,)).floor())

    def step() -> None:
        with autograd.record():
            loss = loss_fn(net(data), target)
        loss.backward()
        trainer.step(args.batch_size)

    for _ in range(args.warmup):
        step()
    mx.nd.waitall()
    rates = []
    for _ in range(args.iters):
        hvd.barrier()
        start = time.perf_counter()
        for _ in range(args.batches_per_iter):
            step()
        mx.nd.waitall()
        hvd.barrier()
        rates.append(args.batch_size * args.batches_per_iter / (time.perf_counter() - start))
    if hvd.rank() == 0:
        print_result(rates, sum(p.data().size for p in params.values()))
    hvd.shutdown()


def driver(args: argparse.Namespace) -> None:
    worker_args = ["--batch-size", str(args.batch_size), "--warmup", str(args.warmup), "--iters", str(args.iters),
                   "--batches-per-iter", str(args.batches_per_iter)]
    med, params = interleaved(__file__, [("hpcvod", 1), ("hpcvod", 2)], worker_args, args.rounds)
    print()
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, mxnet {version('mxnet')}, MLP ({params / 1e6:.1f} M "
          f"parameters), batch {args.batch_size} per rank, 1 compute thread per rank (OMP_NUM_THREADS=1), "
          f"medians of {args.rounds} interleaved rounds")
    table([("hpcvod, 1 rank", med[("hpcvod", 1)], 1),
           ("hpcvod DistributedTrainer", med[("hpcvod", 2)], 2)], med[("hpcvod", 1)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--batches-per-iter", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", choices=["hpcvod"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
