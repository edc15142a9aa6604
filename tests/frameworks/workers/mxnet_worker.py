"""MXNet 1.9 checks, run under ``mpiexec -n 2`` by tests/frameworks/test_mxnet.py."""

from __future__ import annotations

import os
import tempfile

import numpy as np
from _harness import Checks, output_path
from sklearn.datasets import load_digits

import hpcvod.mxnet as hvd  # applies the np.bool alias before importing mxnet
from hpcvod.frameworks.mxnet.mpi_ops import _view

import mxnet as mx  # noqa: E402  (after hpcvod.mxnet, which makes it importable with NumPy 1.26)
from mxnet import autograd, gluon  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
check = Checks()


def rank_data(r: int, shape, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(1000 + r)
    if np.issubdtype(dtype, np.floating):
        return (rng.random(shape) * 4 - 2).astype(dtype)
    return rng.integers(-50, 50, shape).astype(dtype)


def close(a, b, tol: float = 1e-5) -> None:
    a = a.asnumpy() if isinstance(a, mx.nd.NDArray) else np.asarray(a)
    a, b = a.astype(np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    assert diff <= tol * max(1.0, float(np.abs(b).max()) if b.size else 0.0), f"max diff {diff}"


@check
def ops_every_op_and_dtype():
    refs = {hvd.Average: lambda xs: np.mean(xs, 0), hvd.Sum: lambda xs: np.sum(xs, 0),
            hvd.Min: lambda xs: np.min(xs, 0), hvd.Max: lambda xs: np.max(xs, 0),
            hvd.Product: lambda xs: np.prod(xs, 0)}
    n = 0
    for dtype, tol in ((np.float32, 1e-6), (np.float64, 1e-12), (np.float16, 2e-3), (np.int32, 0), (np.int64, 0)):
        for op, ref in refs.items():
            if op == hvd.Average and np.issubdtype(dtype, np.integer):
                continue
            xs = [rank_data(r, (3, 4), dtype).astype(np.float64) for r in range(SIZE)]
            out = hvd.allreduce(mx.nd.array(rank_data(RANK, (3, 4), dtype), dtype=dtype), op=op)
            assert out.dtype == dtype, out.dtype
            close(out, ref(xs), tol)
            n += 1
    return f"{n} (dtype, op) pairs"


@check
def ops_in_place_zero_copy_and_others():
    t = mx.nd.array(rank_data(RANK, (64, 3)))
    view, staged = _view(t, writable=True)
    assert staged is None and not view.flags.owndata, "a CPU NDArray was copied instead of viewed"
    same = hvd.allreduce_(t, op=hvd.Sum, name="inplace")
    assert same is t
    close(t, sum(rank_data(r, (64, 3)) for r in range(SIZE)))
    # a pending MXNet write is finished before the in-place reduction reads the memory
    u = mx.nd.ones((1000,)) * (RANK + 1)
    hvd.allreduce_(u, op=hvd.Sum, name="pending")
    close(u, np.full(1000, sum(r + 1 for r in range(SIZE))))
    close(hvd.allgather(mx.nd.array(rank_data(RANK, (RANK + 1, 2)))),
          np.concatenate([rank_data(r, (r + 1, 2)) for r in range(SIZE)]))
    close(hvd.broadcast(mx.nd.array(rank_data(RANK, (5,))), root_rank=SIZE - 1), rank_data(SIZE - 1, (5,)))
    b = mx.nd.array(rank_data(RANK, (5,)))
    assert hvd.broadcast_(b, root_rank=0) is b
    close(b, rank_data(0, (5,)))
    sent = np.concatenate([np.full((dst + 1, 2), 10.0 * RANK + dst, np.float32) for dst in range(SIZE)])
    out, received = hvd.alltoall(mx.nd.array(sent), splits=[dst + 1 for dst in range(SIZE)])
    assert received.asnumpy().tolist() == [RANK + 1] * SIZE
    close(out, np.concatenate([np.full((RANK + 1, 2), 10.0 * r + RANK) for r in range(SIZE)]))
    rs = hvd.reducescatter(mx.nd.array(rank_data(RANK, (2 * SIZE, 3))), op=hvd.Sum)
    close(rs, sum(rank_data(r, (2 * SIZE, 3)) for r in range(SIZE))[2 * RANK:2 * RANK + 2])
    grs = hvd.grouped_reducescatter([mx.nd.array(rank_data(RANK, (2 * SIZE, 3))),
                                     mx.nd.array(rank_data(RANK + 5, (SIZE,)))], op=hvd.Sum)
    close(grs[0], rs.asnumpy())
    close(grs[1], sum(rank_data(r + 5, (SIZE,)) for r in range(SIZE))[RANK:RANK + 1])
    grouped = [mx.nd.array(rank_data(RANK, (3,))), mx.nd.array(rank_data(RANK + 9, (2, 2)))]
    hvd.grouped_allreduce_(grouped)
    close(grouped[1], np.mean([rank_data(r + 9, (2, 2)) for r in range(SIZE)], 0))
    assert hvd.broadcast_object({"r": RANK}, root_rank=SIZE - 1) == {"r": SIZE - 1}
    assert hvd.allgather_object(RANK) == list(range(SIZE))


# ---------------------------------------------------------------------------------------------- training
digits = load_digits()
X_ALL = (digits.data / 16.0).astype(np.float32)
Y_ALL = digits.target.astype(np.float32)
X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = X_ALL[:1408], Y_ALL[:1408], X_ALL[1408:], Y_ALL[1408:]
GLOBAL_BATCH = 64
LOCAL_BATCH = GLOBAL_BATCH // SIZE
LOSS = gluon.loss.SoftmaxCrossEntropyLoss()


def make_net(seed: int, deferred: bool = False) -> gluon.nn.HybridSequential:
    mx.random.seed(seed)
    np.random.seed(seed)
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Dense(32, activation="relu", in_units=0 if deferred else 64))
        net.add(gluon.nn.Dense(10, in_units=0 if deferred else 32))
    net.initialize(mx.init.Xavier())
    return net


def flat(net) -> np.ndarray:
    return np.concatenate([p.data().asnumpy().reshape(-1).astype(np.float64)
                           for _, p in sorted(net.collect_params().items())])


def spread(net) -> float:
    gathered = hvd.allgather(mx.nd.array(flat(net)[None, :], dtype=np.float64)).asnumpy()
    return float(np.abs(gathered - gathered[0]).max())


def accuracy(net) -> float:
    return float((net(mx.nd.array(X_TEST)).argmax(axis=1).asnumpy() == Y_TEST).mean())


def train(net, trainer, batches, local: bool):
    for b in batches:
        lo, hi = b * GLOBAL_BATCH, (b + 1) * GLOBAL_BATCH
        if local:
            lo, hi = lo + RANK * LOCAL_BATCH, lo + (RANK + 1) * LOCAL_BATCH
        x, y = mx.nd.array(X_TRAIN[lo:hi]), mx.nd.array(Y_TRAIN[lo:hi])
        with autograd.record():
            loss = LOSS(net(x), y)
        loss.backward()
        trainer.step(hi - lo)
        yield


def compare_to_single_rank(make_trainer, label: str):
    net, ref = make_net(100 + RANK), make_net(7)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    assert spread(net) == 0.0, "broadcast_parameters left ranks different"
    ref_params = ref.collect_params()
    for (_, p), (_, q) in zip(sorted(net.collect_params().items()), sorted(ref_params.items())):
        q.set_data(p.data())
    trainer = make_trainer(net)
    ref_trainer = gluon.Trainer(ref_params, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    batches = list(range(len(X_TRAIN) // GLOBAL_BATCH)) * 3
    worst = 0.0
    for _ in train(net, trainer, batches, local=True):
        worst = max(worst, spread(net))
    for _ in train(ref, ref_trainer, batches, local=False):
        pass
    diff = float(np.abs(flat(net) - flat(ref)).max())
    acc, ref_acc = accuracy(net), accuracy(ref)
    assert worst == 0.0, f"{label}: parameters differ across ranks by {worst}"
    assert diff < 1e-4, f"{label}: differs from the 1-rank reference by {diff}"
    assert abs(acc - ref_acc) <= 0.01 and acc > 0.8, (acc, ref_acc)
    return f"{label}: accuracy 2 ranks {acc:.4f}, 1 rank {ref_acc:.4f}, max diff {diff:.1e}"


@check
def distributed_trainer_matches_single_rank():
    return compare_to_single_rank(
        lambda net: hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9}),
        "DistributedTrainer")


@check
def distributed_optimizer_in_gluon_trainer_matches_single_rank():
    def make(net):
        opt = hvd.DistributedOptimizer(mx.optimizer.create("sgd", learning_rate=0.1, momentum=0.9))
        return gluon.Trainer(net.collect_params(), opt, kvstore=None)
    return compare_to_single_rank(make, "DistributedOptimizer + gluon.Trainer")


@check
def broadcast_parameters_after_deferred_init():
    net = make_net(200 + RANK, deferred=True)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)  # shapes unknown yet: broadcast after init
    net(mx.nd.array(X_TRAIN[:4]))
    assert spread(net) == 0.0
    module_style = {"w": mx.nd.array(rank_data(RANK, (3,))), "b": mx.nd.array(rank_data(RANK + 1, (2,)))}
    hvd.broadcast_parameters(module_style, root_rank=SIZE - 1)
    close(module_style["w"], rank_data(SIZE - 1, (3,)))


@check
def checkpoint_restore_with_broadcast():
    tmp = hvd.broadcast_object(tempfile.mkdtemp(prefix="hpcvod-mx-ckpt-") if RANK == 0 else None, root_rank=0)
    params_file, states_file = os.path.join(tmp, "net.params"), os.path.join(tmp, "trainer.states")
    net = make_net(300)
    trainer = hvd.DistributedTrainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    for _ in train(net, trainer, range(4), local=True):
        pass
    if RANK == 0:
        net.save_parameters(params_file)
        trainer.save_states(states_file)
    hvd.barrier()
    saved = flat(net)
    fresh = make_net(400 + RANK)
    if RANK == 0:
        fresh.load_parameters(params_file)
    hvd.broadcast_parameters(fresh.collect_params(), root_rank=0)
    close(flat(fresh), saved, 0.0)
    fresh_trainer = hvd.DistributedTrainer(fresh.collect_params(), "adam", {"learning_rate": 0.5})
    fresh_trainer.load_states(states_file)  # shared file system: every rank reads the same states
    assert fresh_trainer.learning_rate == 0.01, fresh_trainer.learning_rate
    for _ in train(fresh, fresh_trainer, range(4, 6), local=True):
        pass
    for _ in train(net, trainer, range(4, 6), local=True):
        pass
    assert spread(fresh) == 0.0
    close(flat(fresh), flat(net), 1e-6)  # resumed training continues exactly like the uninterrupted one
    hvd.barrier()
    if RANK == 0:
        os.remove(params_file)
        os.remove(states_file)
        os.rmdir(tmp)


check.report(output_path())
hvd.shutdown()
