"""Data-parallel training with hpcvod.runtime and NumPy only: a small MLP on scikit-learn's digits.

    hpcvod submit --site local --tasks-per-node 2 --wait --show-output examples/demo_digits.py
    mpiexec -n 2 python examples/demo_digits.py          # the same, by hand
    python examples/demo_digits.py                       # one rank, for comparison

What every data-parallel script does, Horovod style:
  1. hvd.init(), then shard the data by rank;
  2. broadcast the initial parameters from rank 0 (every rank starts from rank 0's random init);
  3. each step: gradients on the local shard, averaged across ranks with hvd.allreduce, same update everywhere.
Rank r takes samples r, r+size, ... of every global batch, so with any number of ranks the averaged gradient
is the gradient of the same global batch: 1 rank and 2 ranks train the same model (up to rounding).
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.datasets import load_digits

import hpcvod.runtime as hvd

EPOCHS = 12
GLOBAL_BATCH = 64
HIDDEN = 64
LEARNING_RATE = 0.2
MOMENTUM = 0.9


def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "W1": (rng.standard_normal((64, HIDDEN)) * np.sqrt(2.0 / 64)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "W2": (rng.standard_normal((HIDDEN, 10)) * np.sqrt(2.0 / HIDDEN)).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }


def forward(p: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hidden = np.maximum(x @ p["W1"] + p["b1"], 0.0)
    logits = hidden @ p["W2"] + p["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    return hidden, probs


def loss_and_grads(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """Mean cross-entropy over the local samples and its gradients."""
    hidden, probs = forward(p, x)
    n = len(y)
    loss = float(-np.log(probs[np.arange(n), y] + 1e-12).mean())
    d_logits = probs
    d_logits[np.arange(n), y] -= 1.0
    d_logits /= n
    d_hidden = (d_logits @ p["W2"].T) * (hidden > 0)
    grads = {"W1": x.T @ d_hidden, "b1": d_hidden.sum(axis=0),
             "W2": hidden.T @ d_logits, "b2": d_logits.sum(axis=0)}
    return loss, {k: g.astype(np.float32) for k, g in grads.items()}


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    started = time.perf_counter()

    digits = load_digits()
    x_all = (digits.data / 16.0).astype(np.float32)
    y_all = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y_all))   # the same split on every rank
    n_test = len(y_all) // 5
    test_idx, train_idx = order[:n_test], order[n_test:]
    x_test, y_test = x_all[test_idx], y_all[test_idx]

    # Different seeds per rank on purpose: the broadcast below is what makes the ranks agree.
    params = init_params(np.random.default_rng(1000 + rank))
    for name in sorted(params):
        hvd.broadcast_(params[name], root_rank=0, name=f"init.{name}")
    velocity = {k: np.zeros_like(v) for k, v in params.items()}

    if rank == 0:
        print(f"hpcvod demo: MLP 64-{HIDDEN}-10 on scikit-learn digits, {size} rank(s), "
              f"{len(train_idx)} training samples (global batch {GLOBAL_BATCH}, {GLOBAL_BATCH // size} "
              f"per rank), {n_test} test samples")
    shuffle = np.random.default_rng(42)                       # the same sample order on every rank
    for epoch in range(1, EPOCHS + 1):
        epoch_order = train_idx[shuffle.permutation(len(train_idx))]
        loss_sum = 0.0
        steps = 0
        for start in range(0, len(epoch_order) - GLOBAL_BATCH + 1, GLOBAL_BATCH):
            mine = epoch_order[start:start + GLOBAL_BATCH][rank::size]   # this rank's shard of the batch
            loss, grads = loss_and_grads(params, x_all[mine], y_all[mine])
            handles = [hvd.allreduce_async_(grads[k], name=f"grad.{k}", op=hvd.Average) for k in sorted(grads)]
            for h in handles:
                hvd.synchronize(h)
            for k in params:
                velocity[k] = MOMENTUM * velocity[k] - LEARNING_RATE * grads[k]
                params[k] += velocity[k]
            loss_sum += loss
            steps += 1
        mean_loss = float(hvd.allreduce(np.array([loss_sum / steps]), name="epoch.loss", op=hvd.Average)[0])
        if rank == 0:
            print(f"epoch {epoch:2d}  loss {mean_loss:.4f}")

    _, probs = forward(params, x_test)
    accuracy = float((probs.argmax(axis=1) == y_test).mean())
    checksum = hvd.allgather_object(float(sum(v.sum() for v in params.values())))
    if rank == 0:
        agree = "identical on every rank" if max(checksum) - min(checksum) < 1e-6 else "DIFFERENT across ranks"
        print(f"test accuracy {accuracy:.4f} ({n_test} samples); parameters {agree}; "
              f"{time.perf_counter() - started:.1f} s")
    hvd.shutdown()


if __name__ == "__main__":
    main()
