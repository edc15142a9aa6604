"""PyTorch data-parallel training with hpcvod's Horovod API: an MLP on scikit-learn's digits (offline data).

    mpiexec -n 2 python examples/torch_digits.py       # or: hpcvod run -np 2 python examples/torch_digits.py
    python examples/torch_digits.py                     # one rank, for comparison

A Horovod script with one changed line (``import horovod.torch as hvd`` -> ``import hpcvod.torch as hvd``).
Rank r takes samples r, r+size, ... of every global batch of ``--global-batch`` samples, so any number of ranks
trains on the same global batches: 1 and 2 ranks reach the same accuracy (up to rounding).
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits

import hpcvod.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)  # one core per rank on a shared node
    torch.manual_seed(hvd.rank())  # different on purpose: broadcast_parameters makes rank 0's init everyone's
    if args.global_batch % hvd.size():
        raise SystemExit(f"--global-batch {args.global_batch} is not divisible by the {hvd.size()} ranks")

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    loss_fn = torch.nn.CrossEntropyLoss()
    steps = len(x_train) // args.global_batch
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))  # same on every rank
        total = 0.0
        for step in range(steps):
            batch = order[step * args.global_batch:(step + 1) * args.global_batch][hvd.rank()::hvd.size()]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            total += loss.item()
        mean_loss = hvd.allreduce(torch.tensor(total / steps), name="epoch_loss").item()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:2d}  loss {mean_loss:.4f}", flush=True)

    # Each rank scores its share of the test set; the counts are summed.
    mine = slice(hvd.rank(), None, hvd.size())
    with torch.no_grad():
        correct = (model(x_test[mine]).argmax(1) == y_test[mine]).sum()
    correct = hvd.allreduce(correct.double(), op=hvd.Sum, name="correct").item()
    if hvd.rank() == 0:
        print(f"test accuracy {correct / len(x_test):.4f} ({hvd.size()} ranks, global batch {args.global_batch})")
    hvd.shutdown()


if __name__ == "__main__":
    main()
