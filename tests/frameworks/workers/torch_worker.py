"""PyTorch checks, run under ``mpiexec -n 2`` by tests/frameworks/test_torch.py (one launch for all of them)."""

from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import torch
from _harness import Checks, output_path
from sklearn.datasets import load_digits

import hpcvod.torch as hvd
from hpcvod.frameworks.torch.mpi_ops import _as_numpy

torch.set_num_threads(1)
hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
check = Checks()


def rank_data(r: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rank r's input: every rank can build every other rank's, so references need no communication."""
    g = torch.Generator().manual_seed(1000 + r)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def all_data(shape, dtype=torch.float32):
    return [rank_data(r, shape, dtype) for r in range(SIZE)]


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    assert diff <= tol * max(1.0, b.double().abs().max().item() if b.numel() else 0.0), f"max diff {diff}"


@check
def ops_allreduce_every_op_and_dtype():
    ops = {hvd.Average: lambda xs: sum(x.double() for x in xs) / SIZE, hvd.Sum: lambda xs: sum(x.double() for x in xs),
           hvd.Min: lambda xs: torch.stack(xs).min(0).values.double(),
           hvd.Max: lambda xs: torch.stack(xs).max(0).values.double(),
           hvd.Product: lambda xs: torch.stack([x.double() for x in xs]).prod(0)}
    done = []
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        for op, ref in ops.items():
            xs = all_data((3, 5), dtype)
            out = hvd.allreduce(xs[RANK], op=op, name=f"ar.{dtype}.{op}")
            expected = ref(xs)
            if not dtype.is_floating_point and op == hvd.Average:
                assert out.dtype == dtype
                continue  # integer averaging rounds; the sum is checked above
            tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
            close(out.double(), expected, tol)
            assert out.dtype == dtype
            done.append((dtype, op))
    return f"{len(done)} (dtype, op) pairs"


@check
def ops_allreduce_inplace_writes_into_tensor_zero_copy():
    t = rank_data(RANK, (64, 33))
    array, staged = _as_numpy(t)
    assert staged is None and np.shares_memory(array, t.numpy()), "contiguous CPU tensor was copied"
    ptr = t.data_ptr()
    out = hvd.allreduce_(t, op=hvd.Sum, name="inplace")
    assert out is t and t.data_ptr() == ptr
    close(t, sum(all_data((64, 33))))
    # non-contiguous and bfloat16 tensors go through a staging copy and are written back
    nc = rank_data(RANK, (8, 6)).t()
    assert not nc.is_contiguous()
    hvd.allreduce_(nc, op=hvd.Sum, name="inplace.nc")
    close(nc, sum(x.t() for x in all_data((8, 6))))
    bf = rank_data(RANK, (7,), torch.bfloat16)
    hvd.allreduce_(bf, op=hvd.Max, name="inplace.bf16")
    close(bf, torch.stack(all_data((7,), torch.bfloat16)).max(0).values)


@check
def ops_async_poll_synchronize():
    a, b = rank_data(RANK, (100,)), rank_data(RANK, (100,))
    h1 = hvd.allreduce_async(a, name="async.a")
    h2 = hvd.allreduce_async_(b, op=hvd.Sum, name="async.b")
    h3 = hvd.allgather_async(rank_data(RANK, (RANK + 1, 2)), name="async.gather")
    c = rank_data(RANK, (9,))
    h4 = hvd.broadcast_async_(c, root_rank=SIZE - 1, name="async.bcast")
    out1 = hvd.synchronize(h1)
    assert hvd.poll(h2) in (True, False)
    out2 = hvd.synchronize(h2)
    out3 = hvd.synchronize(h3)
    out4 = hvd.synchronize(h4)
    close(out1, sum(all_data((100,))) / SIZE)
    assert out2 is b
    close(b, sum(all_data((100,))))
    assert out3.shape == (sum(r + 1 for r in range(SIZE)), 2)
    assert out4 is c
    close(c, rank_data(SIZE - 1, (9,)))
    try:
        hvd.synchronize(h1)
    except ValueError:
        pass
    else:
        raise AssertionError("synchronizing a handle twice did not raise")


@check
def ops_grouped_allreduce():
    shapes = [(3,), (4, 5), (1,)]
    tensors = [rank_data(RANK + 10 * i, s) for i, s in enumerate(shapes)]
    refs = [sum(rank_data(r + 10 * i, s) for r in range(SIZE)) / SIZE for i, s in enumerate(shapes)]
    outs = hvd.grouped_allreduce(tensors, name="grouped")
    for o, ref in zip(outs, refs):
        close(o, ref)
    same = hvd.grouped_allreduce_(tensors, op=hvd.Average, name="grouped_")
    for o, t, ref in zip(same, tensors, refs):
        assert o is t
        close(t, ref)


@check
def ops_allgather_broadcast_alltoall_reducescatter():
    gathered = hvd.allgather(rank_data(RANK, (RANK + 1, 3)), name="gather")
    close(gathered, torch.cat([rank_data(r, (r + 1, 3)) for r in range(SIZE)]))
    grouped = hvd.grouped_allgather([rank_data(RANK, (2,)), rank_data(RANK + 5, (RANK + 1, 2))], name="ggather")
    close(grouped[0], torch.cat([rank_data(r, (2,)) for r in range(SIZE)]))
    close(grouped[1], torch.cat([rank_data(r + 5, (r + 1, 2)) for r in range(SIZE)]))

    root = SIZE - 1
    b = hvd.broadcast(rank_data(RANK, (4, 4)), root_rank=root, name="bcast")
    close(b, rank_data(root, (4, 4)))
    b_ = rank_data(RANK, (4,))
    assert hvd.broadcast_(b_, root_rank=0, name="bcast_") is b_
    close(b_, rank_data(0, (4,)))

    # alltoall: rank r sends (dst + 1) rows to each dst, every row tagged with (sender, dst)
    def sent_by(r):
        return torch.cat([torch.full((dst + 1, 2), float(10 * r + dst)) for dst in range(SIZE)])
    splits = [dst + 1 for dst in range(SIZE)]
    out, received = hvd.alltoall(sent_by(RANK), splits=splits, name="a2a")
    assert received.tolist() == [RANK + 1] * SIZE, received
    close(out, torch.cat([torch.full((RANK + 1, 2), float(10 * r + RANK)) for r in range(SIZE)]))
    even = hvd.alltoall(torch.arange(2 * SIZE, dtype=torch.float32) + 100 * RANK, name="a2a.even")
    assert isinstance(even, torch.Tensor), "without splits alltoall returns only the tensor (Horovod)"
    close(even, torch.tensor([100.0 * r + 2 * RANK + k for r in range(SIZE) for k in range(2)]))

    rs = hvd.reducescatter(rank_data(RANK, (2 * SIZE, 3)), op=hvd.Sum, name="rs")
    full = sum(all_data((2 * SIZE, 3)))
    close(rs, full[2 * RANK:2 * RANK + 2])


@check
def ops_compression_fp16():
    x = rank_data(RANK, (50,))
    out = hvd.allreduce(x, compression=hvd.Compression.fp16, name="fp16")
    assert out.dtype == torch.float32
    close(out, sum(all_data((50,))) / SIZE, tol=2e-3)
    compressed, ctx = hvd.Compression.fp16.compress(x)
    assert compressed.dtype == torch.float16 and hvd.Compression.fp16.decompress(compressed, ctx).dtype == x.dtype


@check
def autograd_through_collectives():
    weights = [rank_data(r + 50, (5,)) for r in range(SIZE)]
    # allreduce(Average): d(sum_r loss_r)/dx = mean of the ranks' upstream gradients
    x = rank_data(RANK, (5,)).requires_grad_()
    (hvd.allreduce(x, name="g.ar") * weights[RANK]).sum().backward()
    close(x.grad, sum(weights) / SIZE)
    # Horovod's convention (tests/frameworks/test_torch_fidelity.py has the full set): the gradients of allgather
    # and broadcast are the *average* over ranks of the upstream gradients; reducescatter(Sum)'s is size times it.
    # allgather: each rank's rows get the average over ranks of the gradient at those rows
    x = rank_data(RANK, (RANK + 1, 2)).requires_grad_()
    coeff = [rank_data(r + 70, (sum(k + 1 for k in range(SIZE)), 2)) for r in range(SIZE)]
    (hvd.allgather(x, name="g.ag") * coeff[RANK]).sum().backward()
    offset = sum(k + 1 for k in range(RANK))
    close(x.grad, (sum(coeff) / SIZE)[offset:offset + RANK + 1])
    # broadcast: only the root's input receives the averaged gradient
    x = rank_data(RANK, (5,)).requires_grad_()
    (hvd.broadcast(x, root_rank=0, name="g.bc") * weights[RANK]).sum().backward()
    close(x.grad, sum(weights) / SIZE if RANK == 0 else torch.zeros(5))
    # reducescatter(Sum): every input row gets size x the gradient of the rank that owns that slice
    x = rank_data(RANK, (2 * SIZE, 2)).requires_grad_()
    coeff = [rank_data(r + 90, (2, 2)) for r in range(SIZE)]
    (hvd.reducescatter(x, op=hvd.Sum, name="g.rs") * coeff[RANK]).sum().backward()
    close(x.grad, torch.cat(coeff) * SIZE)
    # alltoall: gradients travel back to the rows' senders
    x = rank_data(RANK, (SIZE, 3)).requires_grad_()
    coeff = [rank_data(r + 110, (SIZE, 3)) for r in range(SIZE)]
    out, _ = hvd.alltoall(x, splits=[1] * SIZE, name="g.a2a")
    (out * coeff[RANK]).sum().backward()
    close(x.grad, torch.stack([coeff[dst][RANK] for dst in range(SIZE)]))


@check
def objects_join_barrier():
    got = hvd.broadcast_object({"from": RANK, "t": torch.arange(3) + RANK}, root_rank=SIZE - 1)
    assert got["from"] == SIZE - 1 and got["t"].tolist() == [SIZE - 1, SIZE, SIZE + 1]
    everyone = hvd.allgather_object(("rank", RANK))
    assert everyone == [("rank", r) for r in range(SIZE)]
    hvd.barrier()
    last = hvd.join()
    assert isinstance(last, int) and 0 <= last < SIZE, last


# ---------------------------------------------------------------------------------------------- training
digits = load_digits()
X_ALL = torch.tensor(digits.data / 16.0, dtype=torch.float32)
Y_ALL = torch.tensor(digits.target, dtype=torch.long)
X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = X_ALL[:1400], Y_ALL[:1400], X_ALL[1400:], Y_ALL[1400:]
GLOBAL_BATCH = 64


def make_model(seed: int = 0, sparse_embedding: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    if sparse_embedding:
        # digits pixels are 0..16: embed each pixel value, sum over pixels
        return torch.nn.Sequential(_PixelEmbedding(), torch.nn.Linear(16, 10))
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


class _PixelEmbedding(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(17 * 64, 16, sparse=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = (x * 16).round().long() + 17 * torch.arange(64)
        return self.emb(ids).sum(1)


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    idx = torch.randperm(len(X_TRAIN), generator=g)[:GLOBAL_BATCH]
    return X_TRAIN[idx], Y_TRAIN[idx]


def local_part(x: torch.Tensor) -> torch.Tensor:
    per = x.shape[0] // SIZE
    return x[RANK * per:(RANK + 1) * per]


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()]).double()


def assert_identical_on_every_rank(model: torch.nn.Module, what: str) -> None:
    flat = flat_params(model)
    gathered = hvd.allgather(flat.unsqueeze(0), name=None).view(SIZE, -1)
    spread = (gathered - gathered[0]).abs().max().item()
    assert spread == 0.0, f"{what}: parameters differ across ranks by {spread}"


def accuracy(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return (model(X_TEST).argmax(1) == Y_TEST).float().mean().item()


def train_pair(steps: int, opt_factory, wrap_kwargs: dict, lr: float = 0.1, sparse: bool = False,
               bpps: int = 1, check_every_step: bool = True):
    """Trains a distributed model on this rank's share of each global batch and, beside it, a single-process
    reference on the whole global batch. Returns (distributed model, reference model, steps checked)."""
    model, ref = make_model(1, sparse), make_model(1, sparse)
    opt = hvd.DistributedOptimizer(opt_factory(model.parameters(), lr), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=bpps, **wrap_kwargs)
    ref_opt = opt_factory(ref.parameters(), lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(steps):
        for micro in range(bpps):
            x, y = global_batch(step * bpps + micro)
            loss_fn(model(local_part(x)), local_part(y)).backward()
            loss_fn(ref(x), y).backward()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        if check_every_step:
            assert_identical_on_every_rank(model, f"step {step}")
    return model, ref


def sgd(params, lr):
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


@check
def train_matches_single_rank_and_ranks_stay_identical():
    model, ref = train_pair(60, sgd, {})
    diff = (flat_params(model) - flat_params(ref)).abs().max().item()
    acc, ref_acc = accuracy(model), accuracy(ref)
    assert diff < 1e-4, f"2-rank parameters differ from the 1-rank reference by {diff}"
    assert abs(acc - ref_acc) <= 0.01, (acc, ref_acc)
    assert acc > 0.8, acc
    return f"accuracy 2 ranks {acc:.4f}, 1 rank {ref_acc:.4f}, max param diff {diff:.2e}"


class _Probe(torch.autograd.Function):
    """Identity whose backward records which buckets are already being reduced at that point of backward."""

    seen: list = []
    optimizer = None

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _Probe.seen.append(sorted(_Probe.optimizer._hvd_inflight))
        return grad


@check
def optimizer_starts_reductions_during_backward():
    first, second = torch.nn.Linear(64, 32), torch.nn.Linear(32, 10)
    params = list(first.parameters()) + list(second.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                   groups=[list(second.parameters()), list(first.parameters())])
    _Probe.optimizer, _Probe.seen = opt, []
    x, y = global_batch(0)
    # backward runs second's backward, then the probe, then first's: second's bucket must already be in flight
    out = second(torch.relu(_Probe.apply(first(local_part(x)))))
    torch.nn.functional.cross_entropy(out, local_part(y)).backward()
    after = sorted(opt._hvd_inflight)
    opt.step()
    assert _Probe.seen == [[0]], f"buckets in flight in the middle of backward: {_Probe.seen}"
    assert after == [0, 1], f"buckets started by the end of backward: {after}"
    assert not opt._hvd_inflight
    # the default buckets: this small model is one bucket, started by the last gradient's hook
    model = make_model(2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    assert len(opt._hvd_buckets) == 1
    torch.nn.functional.cross_entropy(model(local_part(x)), local_part(y)).backward()
    assert sorted(opt._hvd_inflight) == [0]
    opt.step()


@check
def optimizer_options_keep_ranks_identical():
    results = []
    variants = {
        "op=Sum": ({"op": hvd.Sum}, 0.1 / SIZE, 1e-4),
        "gradient_predivide_factor=2": ({"gradient_predivide_factor": 2.0}, 0.1, 1e-4),
        "groups=2": ({"groups": 2}, 0.1, 1e-4),
        "groups=lists": ("lists", 0.1, 1e-4),
        "fp16 compression": ({"compression": hvd.Compression.fp16}, 0.1, 5e-2),
    }
    for label, (kwargs, lr, tol) in variants.items():
        if kwargs == "lists":
            model, ref = make_model(1), make_model(1)
            params = list(model.parameters())
            opt = hvd.DistributedOptimizer(sgd(params, 0.1), named_parameters=model.named_parameters(),
                                           groups=[params[:2], params[2:]])
            ref_opt = sgd(ref.parameters(), 0.1)
            for step in range(10):
                x, y = global_batch(step)
                torch.nn.functional.cross_entropy(model(local_part(x)), local_part(y)).backward()
                torch.nn.functional.cross_entropy(ref(x), y).backward()
                opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
                assert_identical_on_every_rank(model, label)
        else:
            if label == "op=Sum":
                # the summed gradient with lr/size is the averaged gradient with lr
                model, ref = train_pair(10, lambda p, _: sgd(p, lr), kwargs)
                ref = make_model(1)
                ref_opt = sgd(ref.parameters(), 0.1)
                for step in range(10):
                    x, y = global_batch(step)
                    torch.nn.functional.cross_entropy(ref(x), y).backward()
                    ref_opt.step(), ref_opt.zero_grad()
            else:
                model, ref = train_pair(10, sgd, kwargs, lr=lr)
        diff = (flat_params(model) - flat_params(ref)).abs().max().item()
        assert diff < tol, f"{label}: differs from the 1-rank reference by {diff}"
        results.append(f"{label}: {diff:.1e}")
    return "; ".join(results)


@check
def optimizer_backward_passes_per_step():
    # Two local backward passes accumulate (sum) before one reduction: the reference sums two global batches.
    model, ref = make_model(1), make_model(1)
    opt = hvd.DistributedOptimizer(sgd(model.parameters(), 0.05), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    ref_opt = sgd(ref.parameters(), 0.05)
    for step in range(8):
        for micro in range(2):
            x, y = global_batch(100 + 2 * step + micro)
            torch.nn.functional.cross_entropy(model(local_part(x)), local_part(y)).backward()
            torch.nn.functional.cross_entropy(ref(x), y).backward()
            if micro == 0:
                assert not opt._hvd_inflight, "reduced before the last backward pass"
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
        assert_identical_on_every_rank(model, f"bpps step {step}")
    diff = (flat_params(model) - flat_params(ref)).abs().max().item()
    assert diff < 1e-4, diff
    return f"max diff {diff:.1e}"


@check
def optimizer_sparse_gradients():
    out = []
    for sparse_as_dense in (False, True):
        model, ref = train_pair(8, lambda p, lr: torch.optim.SGD(p, lr=lr), {"sparse_as_dense": sparse_as_dense},
                                lr=0.5, sparse=True)
        diff = (flat_params(model) - flat_params(ref)).abs().max().item()
        assert diff < 1e-4, f"sparse_as_dense={sparse_as_dense}: {diff}"
        out.append(f"sparse_as_dense={sparse_as_dense}: {diff:.1e}")
    return "; ".join(out)


@check
def process_sets():
    # With 2 ranks the only proper subsets are single ranks: each rank gets its own set.
    sets = [hvd.add_process_set([r]) for r in range(SIZE)]
    mine, other = sets[RANK], sets[(RANK + 1) % SIZE]
    alone = hvd.allreduce(rank_data(RANK, (3,)), op=hvd.Sum, process_set=mine, name="ps.alone")
    close(alone, rank_data(RANK, (3,)))
    try:
        hvd.allreduce(torch.ones(3), process_set=other, name="ps.other")
    except hvd.HpcvodError:
        pass
    else:
        raise AssertionError("a collective on a process set this rank is not in did not raise")
    solo = hvd.DistributedOptimizer(sgd(make_model(3).parameters(), 0.1), process_set=mine)
    assert not solo._hvd_active, "a one-rank process set needs no reductions"
    # the global set, given explicitly, is the default behaviour
    model, ref = make_model(1), make_model(1)
    opt = hvd.DistributedOptimizer(sgd(model.parameters(), 0.1), named_parameters=model.named_parameters(),
                                   process_set=hvd.global_process_set)
    ref_opt = sgd(ref.parameters(), 0.1)
    for step in range(3):
        x, y = global_batch(500 + step)
        torch.nn.functional.cross_entropy(model(local_part(x)), local_part(y)).backward()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
        assert_identical_on_every_rank(model, f"global set step {step}")
    assert (flat_params(model) - flat_params(ref)).abs().max().item() < 1e-4
    for ps in sets:
        hvd.remove_process_set(ps)


@check
def optimizer_synchronize_skip_and_misuse():
    model = make_model(3)
    opt = hvd.DistributedOptimizer(sgd(model.parameters(), 0.1), named_parameters=model.named_parameters())
    x, y = global_batch(7)
    torch.nn.functional.cross_entropy(model(local_part(x)), local_part(y)).backward()
    try:
        opt.zero_grad()
    except AssertionError:
        pass
    else:
        raise AssertionError("zero_grad() between backward() and step() did not raise")
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
    opt.zero_grad()
    assert_identical_on_every_rank(model, "after clipping")
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    try:
        hvd.DistributedOptimizer(opt)
    except ValueError:
        pass
    else:
        raise AssertionError("wrapping twice did not raise")


@check
def lr_scheduler_created_before_wrapping():
    model, ref = make_model(4), make_model(4)
    base = sgd(model.parameters(), 0.2)
    sched = torch.optim.lr_scheduler.StepLR(base, step_size=2, gamma=0.5)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    ref_opt = sgd(ref.parameters(), 0.2)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
    for step in range(6):
        x, y = global_batch(200 + step)
        torch.nn.functional.cross_entropy(model(local_part(x)), local_part(y)).backward()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
        sched.step(), ref_sched.step()
        assert_identical_on_every_rank(model, f"sched step {step}")
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] == 0.2 * 0.5 ** 3
    diff = (flat_params(model) - flat_params(ref)).abs().max().item()
    assert diff < 1e-4, diff


@check
def checkpoint_restore_with_broadcast():
    """Rank 0 saves, everyone builds fresh (different) state, rank 0 loads, broadcasts restore the rest."""
    tmp = hvd.broadcast_object(tempfile.mkdtemp(prefix="hpcvod-torch-ckpt-") if RANK == 0 else None, root_rank=0)
    path = os.path.join(tmp, "ckpt.pt")
    model = make_model(5)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(3):
        x, y = global_batch(300 + step)
        torch.nn.functional.cross_entropy(model(local_part(x)), local_part(y)).backward()
        opt.step(), opt.zero_grad()
    if RANK == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    hvd.barrier()
    saved = torch.load(path)

    fresh = make_model(50 + RANK)  # different on every rank
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.5 + RANK)
    if RANK == 0:
        fresh.load_state_dict(saved["model"])
        fresh_opt.load_state_dict(saved["opt"])
    hvd.broadcast_parameters(fresh.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(fresh_opt, root_rank=0)
    for k, v in fresh.state_dict().items():
        close(v, saved["model"][k], 0.0)
    state = fresh_opt.state_dict()
    assert state["param_groups"][0]["lr"] == 0.01, state["param_groups"][0]["lr"]
    for pid, entries in saved["opt"]["state"].items():
        for key, value in entries.items():
            close(torch.as_tensor(state["state"][pid][key]), torch.as_tensor(value), 0.0)
    # Training on continues identically on every rank
    fresh_opt = hvd.DistributedOptimizer(fresh_opt, named_parameters=fresh.named_parameters())
    x, y = global_batch(400)
    torch.nn.functional.cross_entropy(fresh(local_part(x)), local_part(y)).backward()
    fresh_opt.step()
    assert_identical_on_every_rank(fresh, "after restore")
    hvd.barrier()
    if RANK == 0:
        os.remove(path)
        os.rmdir(tmp)


@check
def sync_batch_norm_matches_full_batch():
    torch.manual_seed(11)
    full = torch.randn(8 * SIZE, 3, 5, 4, dtype=torch.float64)
    upstream = torch.randn_like(full)
    sbn = hvd.SyncBatchNorm(3, momentum=0.3).double()
    bn = torch.nn.BatchNorm2d(3, momentum=0.3).double()
    with torch.no_grad():
        for m in (sbn, bn):
            m.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
            m.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
    rows = slice(8 * RANK, 8 * (RANK + 1))
    x_local = full[rows].clone().requires_grad_()
    x_full = full.clone().requires_grad_()
    out_local = sbn(x_local)
    out_full = bn(x_full)
    (out_local * upstream[rows]).sum().backward()
    (out_full * upstream).sum().backward()
    close(out_local.detach(), out_full.detach()[rows], 1e-10)
    close(x_local.grad, x_full.grad[rows], 1e-10)
    # parameter gradients: each rank holds its share, their sum is the full-batch gradient
    wgrad = hvd.allreduce(sbn.weight.grad, op=hvd.Sum, name="sbn.w")
    close(wgrad, bn.weight.grad, 1e-10)
    close(sbn.running_mean, bn.running_mean, 1e-10)
    close(sbn.running_var, bn.running_var, 1e-10)
    sbn.eval(), bn.eval()
    close(sbn(full[rows]).detach(), bn(full).detach()[rows], 1e-10)
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(4)))
    assert isinstance(converted[0], hvd.SyncBatchNorm)


check.report(output_path())
hvd.shutdown()
