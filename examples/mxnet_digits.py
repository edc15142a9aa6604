"""MXNet Gluon data-parallel training with hpcvod's Horovod API on scikit-learn's digits (offline data).

    mpiexec -n 2 python examples/mxnet_digits.py       # or: hpcvod run -np 2 python examples/mxnet_digits.py
    python examples/mxnet_digits.py                     # one rank, for comparison

A Horovod script with one changed line (``import horovod.mxnet as hvd`` -> ``import hpcvod.mxnet as hvd``;
import it before ``mxnet``: it makes MXNet 1.9 importable beside NumPy 1.26). Rank r takes samples
r, r+size, ... of every global batch, so any number of ranks trains on the same global batches.
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.datasets import load_digits

import hpcvod.mxnet as hvd  # before mxnet: adds the np.bool alias MXNet 1.9 needs

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    hvd.init()
    mx.random.seed(hvd.rank())  # different on purpose: broadcast_parameters makes rank 0's init everyone's
    if args.global_batch % hvd.size():
        raise SystemExit(f"--global-batch {args.global_batch} is not divisible by the {hvd.size()} ranks")

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.float32)
    x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]

    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)  # deferred shapes: broadcast as soon as they are initialised
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": args.lr, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    steps = len(x_train) // args.global_batch
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(len(x_train))  # same on every rank
        total = 0.0
        for step in range(steps):
            batch = order[step * args.global_batch:(step + 1) * args.global_batch][hvd.rank()::hvd.size()]
            data, label = mx.nd.array(x_train[batch]), mx.nd.array(y_train[batch])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(len(batch))  # the mean over the local batch; the trainer averages over ranks
            total += float(loss.mean().asscalar())
        mean_loss = hvd.allreduce(mx.nd.array([total / steps]), name="epoch_loss").asscalar()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:2d}  loss {mean_loss:.4f}", flush=True)

    mine = slice(hvd.rank(), None, hvd.size())
    correct = (net(mx.nd.array(x_test[mine])).argmax(axis=1) == mx.nd.array(y_test[mine])).sum()
    correct = hvd.allreduce(correct.astype(np.float64), op=hvd.Sum, name="correct").asscalar()
    if hvd.rank() == 0:
        print(f"test accuracy {correct / len(x_test):.4f} ({hvd.size()} ranks, global batch {args.global_batch})")
    hvd.shutdown()


if __name__ == "__main__":
    main()
