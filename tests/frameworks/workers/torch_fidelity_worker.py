"""Horovod's documented torch behaviour, check by check (issue 11), under ``mpiexec -n N`` (N = 1, 2, 4).

Every expectation is Horovod 0.28.1's behaviour, written in closed form (the comment of each check says where it
comes from: horovod/torch/mpi_ops.py, horovod/common/ops/collective_operations.h, test/parallel/test_torch.py).
"""

from __future__ import annotations

import numpy as np
import torch
from _harness import Checks, output_path

import hpcvod.torch as hvd

torch.set_num_threads(1)
hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
check = Checks()


def same(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Exact equality (values, dtype, shape): Horovod's users compare gradients and scaled sums exactly."""
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, expected {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    assert torch.equal(got, expected), f"{what}: got {got.flatten()[:8].tolist()}, expected " \
                                       f"{expected.flatten()[:8].tolist()}"


def upstream(r: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The gradient arriving at rank r's output: (r + 1) everywhere, so every rank's share is visible."""
    return torch.full(shape, float(r + 1), dtype=torch.float64)


MEAN_UPSTREAM = (SIZE + 1) / 2          # the average over ranks of upstream(r)


# ------------------------------------------------------------------------------------ gradients of collectives
@check
def grad_allgather_is_the_average_of_the_ranks_gradients():
    # Horovod: allreduce(grad, average=True), then this rank's rows. Ranks have different first dims (r + 1).
    x = torch.ones(RANK + 1, 3, dtype=torch.float64, requires_grad=True)
    y = hvd.allgather(x, name="fid.grad.allgather")
    assert y.shape == (SIZE * (SIZE + 1) // 2, 3)
    y.backward(upstream(RANK, tuple(y.shape)))
    same(x.grad, torch.full((RANK + 1, 3), MEAN_UPSTREAM, dtype=torch.float64), "allgather gradient")


@check
def grad_grouped_allgather_is_differentiable_and_averages():
    xs = [torch.ones(RANK + 1, 2, dtype=torch.float64, requires_grad=True),
          torch.ones(2, dtype=torch.float64, requires_grad=True)]
    ys = hvd.grouped_allgather(xs, name="fid.grad.grouped_allgather")
    torch.autograd.backward(ys, [upstream(RANK, tuple(y.shape)) * (i + 1) for i, y in enumerate(ys)])
    same(xs[0].grad, torch.full((RANK + 1, 2), MEAN_UPSTREAM, dtype=torch.float64), "grouped allgather grad 0")
    same(xs[1].grad, torch.full((2,), 2 * MEAN_UPSTREAM, dtype=torch.float64), "grouped allgather grad 1")


@check
def grad_broadcast_is_the_average_on_the_root_and_zero_elsewhere():
    # Horovod: allreduce(grad, average=True), times 0 off the root. d(sum of outputs)/dx on the root is 1.
    for root in range(SIZE):
        x = torch.full((4,), float(RANK), dtype=torch.float64, requires_grad=True)
        y = hvd.broadcast(x, root, name=f"fid.grad.broadcast.{root}")
        same(y.detach(), torch.full((4,), float(root), dtype=torch.float64), "broadcast value")
        y.sum().backward()
        same(x.grad, torch.full((4,), 1.0 if RANK == root else 0.0, dtype=torch.float64), f"root {root} gradient")
        x.grad = None
        hvd.broadcast(x, root, name=f"fid.grad.broadcast.{root}.b").backward(upstream(RANK, (4,)))
        same(x.grad, torch.full((4,), MEAN_UPSTREAM if RANK == root else 0.0, dtype=torch.float64),
             f"root {root} gradient of rank-dependent upstream")


def _reducescatter_expectation(op, pre: float, post: float, rows_per_rank: int) -> torch.Tensor:
    # Horovod: grad *= size (Sum only), *= prescale, *= postscale, then allgather: rank s's slice gets its grad.
    parts = []
    for s in range(SIZE):
        g = upstream(s, (rows_per_rank, 2))
        if op == hvd.Sum:
            g = g * SIZE
        if pre != 1.0:
            g = g * pre
        if post != 1.0:
            g = g * post
        parts.append(g)
    return torch.cat(parts)


@check
def grad_reducescatter_sum_and_average_match_horovod():
    for op in (hvd.Sum, hvd.Average):
        for pre, post in ((1.0, 1.0), (0.5, 3.0)):
            x = torch.ones(2 * SIZE, 2, dtype=torch.float64, requires_grad=True)
            y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post,
                                  name=f"fid.grad.rs.{op}.{pre}")
            y.backward(upstream(RANK, tuple(y.shape)))
            same(x.grad, _reducescatter_expectation(op, pre, post, 2), f"reducescatter op={op} pre={pre}")


@check
def grad_grouped_reducescatter_is_differentiable():
    for op in (hvd.Sum, hvd.Average):
        xs = [torch.ones(2 * SIZE, 2, dtype=torch.float64, requires_grad=True) for _ in range(2)]
        ys = hvd.grouped_reducescatter(xs, op=op, prescale_factor=2.0, name=f"fid.grad.grs.{op}")
        torch.autograd.backward(ys, [upstream(RANK, tuple(y.shape)) for y in ys])
        for i, x in enumerate(xs):
            same(x.grad, _reducescatter_expectation(op, 2.0, 1.0, 2), f"grouped reducescatter {i} op={op}")


@check
def grad_alltoall_equal_splits_with_rank_dependent_sizes():
    # Horovod's test: rank r sends (r + 1) rows to every rank, so ranks receive different row counts.
    rows = SIZE * (RANK + 1)
    x = torch.arange(rows, dtype=torch.float64).repeat(2, 1).t().contiguous().requires_grad_()
    y = hvd.alltoall(x, name="fid.grad.alltoall.equal")
    assert y.shape == (sum(s + 1 for s in range(SIZE)), 2), y.shape
    # upstream: rows that came from sender s carry 100 * RANK + s
    g = torch.cat([torch.full((s + 1, 2), 100.0 * RANK + s, dtype=torch.float64) for s in range(SIZE)])
    y.backward(g)
    expected = torch.cat([torch.full((RANK + 1, 2), 100.0 * d + RANK, dtype=torch.float64) for d in range(SIZE)])
    same(x.grad, expected, "alltoall gradient goes back where each row came from")


@check
def grad_alltoall_with_splits():
    splits = torch.tensor([d + 1 for d in range(SIZE)], dtype=torch.int32)     # d + 1 rows to rank d
    x = torch.ones(int(splits.sum()), dtype=torch.float64, requires_grad=True)
    y, received = hvd.alltoall(x, splits=splits, name="fid.grad.alltoall.splits")
    same(received, torch.full((SIZE,), RANK + 1, dtype=torch.int32), "received splits")
    y.backward(torch.full(y.shape, float(RANK + 1), dtype=torch.float64))
    same(x.grad, torch.cat([torch.full((d + 1,), float(d + 1), dtype=torch.float64) for d in range(SIZE)]),
         "alltoall(splits) gradient")


@check
def grad_allreduce_keeps_op_and_scaling():
    # Horovod: the backward is allreduce(grad, same op, same prescale/postscale).
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0, name="fid.grad.allreduce")
    y.backward(upstream(RANK, (3,)))
    same(x.grad, torch.full((3,), sum(0.5 * (s + 1) for s in range(SIZE)) * 4.0, dtype=torch.float64),
         "allreduce gradient")


# ------------------------------------------------------------------------------------ prescale / postscale
def _factor_math(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """Horovod's CPU scaling: float16 in float32 arithmetic, float32 in float32, integers in float64 (truncated)."""
    dtype = tensor.dtype
    work = torch.float32 if dtype in (torch.float16, torch.float32) else torch.float64
    return (torch.tensor(factor, dtype=torch.float64).to(work) * tensor.to(work)).to(dtype)


def _scaled_inputs(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.empty(17, 17, dtype=torch.float32).random_(-100, 100, generator=g).to(dtype)


SCALE_DTYPES = (torch.float16, torch.float32, torch.float64, torch.int32, torch.int64)
FACTOR = float(np.random.default_rng(1234).uniform())


@check
def prescale_matches_horovod_exactly():
    # Horovod's test_horovod_allreduce_prescale: the sum of the prescaled inputs (identical on every rank).
    for dtype in SCALE_DTYPES:
        t = _scaled_inputs(dtype)
        got = hvd.allreduce(t, op=hvd.Sum, prescale_factor=FACTOR, name=f"fid.pre.{dtype}")
        expected = _factor_math(t, FACTOR)
        if dtype == torch.float16:
            expected = expected.float() * SIZE
            got = got.float()
        else:
            expected = expected * SIZE
        if SIZE <= 3 or not dtype.is_floating_point:
            same(got, expected, f"prescale {dtype}")
        else:       # Horovod's own test allows a float tolerance from 4 ranks on (the sum is no longer exact)
            assert torch.allclose(got.double(), expected.double(), rtol=0, atol=5e-2), f"prescale {dtype}"


@check
def postscale_matches_horovod_exactly():
    for dtype in SCALE_DTYPES:
        t = _scaled_inputs(dtype)
        got = hvd.allreduce(t, op=hvd.Sum, postscale_factor=FACTOR, name=f"fid.post.{dtype}")
        summed = hvd.allreduce(t, op=hvd.Sum, name=f"fid.post.sum.{dtype}")
        same(got, _factor_math(summed, FACTOR), f"postscale {dtype}")


@check
def reducescatter_scaling_matches_horovod_exactly():
    for dtype in (torch.float16, torch.float32, torch.float64):
        t = _scaled_inputs(dtype)[: 2 * SIZE].contiguous()
        mine = slice(2 * RANK, 2 * RANK + 2)
        got = hvd.reducescatter(t, op=hvd.Sum, prescale_factor=FACTOR, name=f"fid.rs.pre.{dtype}")
        pre = _factor_math(t, FACTOR)
        expected = pre[mine].float() * SIZE if dtype == torch.float16 else pre[mine] * SIZE
        same(got.float() if dtype == torch.float16 else got, expected, f"reducescatter prescale {dtype}")
        got = hvd.reducescatter(t, op=hvd.Sum, postscale_factor=FACTOR, name=f"fid.rs.post.{dtype}")
        same(got, _factor_math((t[mine].float() * SIZE).to(dtype), FACTOR), f"reducescatter postscale {dtype}")
        outs = hvd.grouped_reducescatter([t, t], op=hvd.Sum, postscale_factor=FACTOR, name=f"fid.grs.{dtype}")
        for out in outs:
            same(out, _factor_math((t[mine].float() * SIZE).to(dtype), FACTOR), f"grouped postscale {dtype}")


@check
def grouped_reducescatter_async_returns_the_list():
    ts = [torch.full((2 * SIZE, 2), float(RANK + 1)), torch.arange(SIZE, dtype=torch.float64)]
    outs = hvd.synchronize(hvd.grouped_reducescatter_async(ts, op=hvd.Sum, name="fid.grs.async"))
    total = SIZE * (SIZE + 1) / 2
    same(outs[0], torch.full((2, 2), total), "first tensor's block")
    same(outs[1], torch.tensor([float(RANK * SIZE)], dtype=torch.float64), "second tensor's block")


# ------------------------------------------------------------------------------------ duplicate names
def _duplicate_raises(start, what: str, again=None) -> None:
    """Horovod's test_horovod_*_duplicate_name_error, deterministic: rank d submits twice while the others wait
    at a barrier (so its first is surely still in flight), and the second submission raises ValueError at once;
    then the others submit once and the first completes. Every rank takes its turn as d."""
    for d in range(SIZE):
        if RANK == d:
            first = start()
            try:
                (again or start)()
            except ValueError as exc:
                assert "still in flight" in str(exc), exc
            else:
                raise AssertionError(f"{what}: a second submission under a name in flight did not raise")
        hvd.barrier()
        if RANK != d:
            first = start()
        hvd.synchronize(first)


@check
def duplicate_names_in_flight_raise():
    if SIZE == 1:
        return "one rank: a collective completes before the next call (Horovod skips this too)"
    t = torch.ones(17, 17, 17)
    _duplicate_raises(lambda: hvd.allreduce_async(t, name="duplicate_name"), "allreduce_async")
    _duplicate_raises(lambda: hvd.allgather_async(t, name="duplicate_name.ag"), "allgather_async")
    _duplicate_raises(lambda: hvd.broadcast_async(t, 0, name="duplicate_name.bc"), "broadcast_async")
    _duplicate_raises(lambda: hvd.reducescatter_async(t, name="duplicate_name.rs"), "reducescatter_async")
    # and afterwards the ranks are in step: the same name again, now that nothing is in flight
    out = hvd.allreduce(torch.ones(2), name="duplicate_name", op=hvd.Sum)
    same(out, torch.full((2,), float(SIZE)), "allreduce after the refused duplicates")


@check
def duplicate_name_of_a_grouped_member_raises():
    if SIZE == 1:
        return "one rank: a collective completes before the next call (Horovod skips this too)"
    _duplicate_raises(lambda: hvd.grouped_allreduce_async_([torch.ones(2), torch.ones(2)], name="dup.group"),
                      "grouped", again=lambda: hvd.allreduce_async_(torch.ones(2), name="dup.group.1"))


# ------------------------------------------------------------------------------------ join
@check
def join_refuses_allgather_and_broadcast_on_the_other_ranks():
    if SIZE == 1:
        return "one rank: join returns at once"
    t = torch.ones(17, 3)
    for first in range(SIZE):
        if RANK == first:
            last = hvd.join()
        else:
            # named: the joined rank does not call them, so unnamed ones would count differently on it
            for name, call in (("allgather", lambda: hvd.allgather(t, name=f"fid.join.ag.{first}")),
                               ("broadcast", lambda: hvd.broadcast(t, (first + 1) % SIZE,
                                                                      name=f"fid.join.bc.{first}")),
                               ("reducescatter", lambda: hvd.reducescatter(torch.ones(2 * SIZE),
                                                                           name=f"fid.join.rs.{first}")),
                               ("alltoall", lambda: hvd.alltoall(torch.ones(SIZE), name=f"fid.join.a2a.{first}"))):
                try:
                    call()
                except RuntimeError as exc:
                    assert "joined" in str(exc), exc
                else:
                    raise AssertionError(f"{name} after another rank joined did not raise")
            # allreduce still works: the joined rank adds zeros
            same(hvd.allreduce(torch.ones(3), op=hvd.Sum, name="fid.join.ar"), torch.full((3,), SIZE - 1.0),
                 "allreduce with one rank joined")
            last = hvd.join()
        assert last != first or SIZE == 1, f"join returned {last}, the rank that joined first"
    out = hvd.allgather(torch.full((1,), float(RANK)), name="fid.after.join")
    same(out, torch.arange(SIZE, dtype=torch.float32), "allgather once every rank has joined")


@check
def join_then_unnamed_allgather_fails_and_allgather_object_still_pairs():
    # Horovod's test_horovod_join_allgather: each rank in turn joins first; the others' UNNAMED allgather fails
    # (the joined rank never submits it, so the ranks' counts of unnamed collectives now differ), they join, and
    # every rank then gathers join()'s result with allgather_object, which must pair on every rank
    if SIZE == 1:
        return "one rank: join returns at once"
    t = torch.ones(17, 17, 17)
    for first in range(SIZE):
        if RANK == first:
            last = hvd.join()
        else:
            try:
                hvd.allgather(t)
            except RuntimeError:
                pass
            else:
                raise AssertionError("an allgather after another rank joined did not raise")
            last = hvd.join()
        assert last != first, f"join returned {last}, the rank that joined first"
        gathered = hvd.allgather_object(last)
        assert gathered == [last] * SIZE, f"join's result gathered from every rank: {gathered}, expected all {last}"
    # objects of different types on different ranks still pair (Horovod names by type and would not)
    mixed = hvd.allgather_object(RANK if RANK % 2 else None)
    assert mixed == [r if r % 2 else None for r in range(SIZE)], mixed


# ------------------------------------------------------------------------------------ sparse
@check
def sparse_allreduce_async_returns_a_callable_handle():
    i = torch.tensor([[RANK % 3], [0]])
    t = torch.sparse_coo_tensor(i, torch.tensor([float(RANK + 1)]), (3, 2))
    handle = hvd.sparse_allreduce_async(t, name="fid.sparse", op=hvd.Sum)
    out = handle()
    assert out.is_sparse, "the result is a sparse tensor"
    expected = torch.zeros(3, 2)
    for r in range(SIZE):
        expected[r % 3, 0] += r + 1
    same(out.to_dense(), expected, "sparse allreduce")


@check
def sparse_embedding_trains_with_sparse_adam():
    # Horovod's test_sparse_embeddings (ranks look up different rows), with values: the reduced gradient is the
    # average of the ranks' gradients, kept sparse for SparseAdam also with sparse_as_dense=True (Horovod converts
    # it back after the dense allreduce).
    inputs = [torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]]) if r == 0 else torch.tensor([[1, 3, 4], [4, 7, 9]])
              for r in range(SIZE)]
    for sparse_as_dense in (False, True):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                       sparse_as_dense=sparse_as_dense)
        before = emb.weight.detach().clone()
        opt.zero_grad()
        emb(inputs[RANK]).sum().backward()
        opt.synchronize()
        grad = emb.weight.grad
        assert grad.is_sparse, f"sparse_as_dense={sparse_as_dense}: the reduced gradient is sparse"
        expected = torch.zeros(10, 3)
        for r in range(SIZE):
            expected.index_add_(0, inputs[r].flatten(), torch.ones(inputs[r].numel(), 3))
        same(grad.to_dense(), expected / SIZE, f"sparse_as_dense={sparse_as_dense}: averaged gradient")
        with opt.skip_synchronize():
            opt.step()
        assert not torch.equal(before, emb.weight.detach()), "the step moved the embedding"
        everyone = hvd.allgather(emb.weight.detach().unsqueeze(0), name=f"fid.sparse.weights.{sparse_as_dense}")
        for r in range(SIZE):
            same(everyone[r], everyone[0], f"rank {r}'s embedding equals rank 0's")


# ------------------------------------------------------------------------------------ optimizer state
@check
def broadcast_optimizer_state_with_parameters_without_gradients():
    # Horovod's test_broadcast_state_no_grad
    class ModelNoGrad(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
            self.b = torch.nn.Parameter(torch.rand(4))

    model = ModelNoGrad()
    opt = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    grad = opt.param_groups[0]["params"][1].grad
    assert grad is not None, "a trainable parameter without state gets a zero gradient, as in Horovod"
    same(hvd.broadcast(grad, root_rank=0, name="fid.nograd"), grad, "broadcast of that gradient")
    assert opt.param_groups[0]["params"][0].grad is None, "a frozen parameter keeps no gradient"


@check
def distributed_optimizer_has_horovods_parameter_names():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    named = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
    assert named._parameter_names == {p: n for n, p in model.named_parameters()}
    groups = [{"params": list(model[0].parameters())}, {"params": list(model[1].parameters())}]
    unnamed = hvd.DistributedOptimizer(torch.optim.SGD(groups, lr=0.1))
    # Horovod's test_optimizer_no_named_parameters: one name per parameter, unique over several groups
    assert sorted(unnamed._parameter_names.values()) == [
        "allreduce.noname.0.0", "allreduce.noname.0.1", "allreduce.noname.1.0", "allreduce.noname.1.1"]
    assert hvd.allgather_object(set(unnamed._parameter_names.values())) == [set(unnamed._parameter_names.values())] \
        * SIZE, "every rank names the parameters alike"
    # Horovod's full positional signature, num_groups (deprecated there, still accepted) included
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        positional = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                              hvd.Compression.none, 1, hvd.Average, 1.0, 2)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught), "num_groups warns as in Horovod"
    assert len(positional._hvd_buckets) == 2, "num_groups=2 makes two groups"
    hvd.broadcast_optimizer_state(positional, 0, model=model)


check.report(output_path())
