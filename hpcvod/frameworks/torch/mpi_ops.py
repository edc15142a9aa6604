"""The runtime's collectives on torch tensors, with Horovod's signatures.

Contiguous CPU tensors reach the runtime as NumPy views of their own memory (``Tensor.numpy()`` shares storage), so
in-place forms write straight into the tensor and out-of-place results come back through ``torch.from_numpy``
without a copy. Other tensors (non-contiguous, bfloat16, which NumPy lacks, or on another device) go through one
contiguous CPU staging copy each way; contiguous CUDA tensors go to the runtime as they are (bfloat16 ones as their
int16 words in ``Bfloat16Words``) and run on NCCL. The blocking ``allreduce``, ``allgather``, ``broadcast``, ``alltoall`` and
``reducescatter`` are autograd functions: their backward pass is the matching collective on the gradient.
The conversions between tensors and the runtime's arrays are in bridge.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import hpcvod.runtime as rt
from hpcvod.frameworks._common import HandleTable, resolve_op, set_rank_size
from hpcvod.frameworks.torch.compression import Compression, Compressor
from hpcvod.frameworks.torch.bridge import (  # under their old names here (tests' torch_worker imports one)
    as_numpy as _as_numpy, splits_array as _splits_array, to_torch as _to_torch, write_back as _write_back,
)

global_process_set = rt.global_process_set
_handles = HandleTable()


# ---------------------------------------------------------------------------------------------- allreduce
def _allreduce(tensor: torch.Tensor, name: str | None, op: Any, prescale_factor: float, postscale_factor: float,
               process_set: Any) -> torch.Tensor:
    array, _ = _as_numpy(tensor)
    out = rt.allreduce(array, name=name, op=op, prescale_factor=prescale_factor,
                       postscale_factor=postscale_factor, process_set=process_set)
    return _to_torch(out, tensor)


class _AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: Any, prescale_factor: float,
                postscale_factor: float, process_set: Any) -> torch.Tensor:
        ctx.op, ctx.scale, ctx.process_set = op, (prescale_factor, postscale_factor), process_set
        return _allreduce(tensor, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        # y = post * op_r(pre * x_r) on every rank: the gradient of the summed loss is the same op on the grads.
        if ctx.op not in (rt.Average, rt.Sum):
            raise NotImplementedError(f"allreduce with op={ctx.op} has no gradient (only Average and Sum do)")
        grad = _allreduce(grad_output, None, ctx.op, *ctx.scale, ctx.process_set)
        return grad, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: Any = global_process_set) -> torch.Tensor:
    """Reduces ``tensor`` over all ranks and returns the result in a new tensor (differentiable)."""
    op = resolve_op(average, op)
    compressed, ctx = compression.compress(tensor)
    reduced = _AllreduceFunction.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: Any = global_process_set) -> torch.Tensor:
    """Reduces ``tensor`` over all ranks in place and returns it."""
    array, staged = _as_numpy(tensor)
    rt.allreduce_(array, name=name, op=resolve_op(average, op), prescale_factor=prescale_factor,
                  postscale_factor=postscale_factor, process_set=process_set)
    return _write_back(tensor, staged)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = global_process_set) -> int:
    """Starts an allreduce into a new tensor; ``synchronize(handle)`` returns it."""
    array, _ = _as_numpy(tensor)
    handle = rt.allreduce_async(array, name=name, op=resolve_op(average, op), prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set)
    return _handles.add(handle, lambda out: _to_torch(out, tensor), keepalive=array)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Any = global_process_set) -> int:
    """Starts an in-place allreduce of ``tensor``; ``synchronize(handle)`` returns the tensor once it is reduced."""
    array, staged = _as_numpy(tensor)
    handle = rt.allreduce_async_(array, name=name, op=resolve_op(average, op), prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor, process_set=process_set)
    return _handles.add(handle, lambda _: _write_back(tensor, staged), keepalive=(tensor, array))


# ---------------------------------------------------------------------------------------------- grouped allreduce
def _grouped_allreduce(tensors: Sequence[torch.Tensor], name: str | None, op: Any, prescale_factor: float,
                       postscale_factor: float, process_set: Any) -> list[torch.Tensor]:
    arrays = [_as_numpy(t)[0] for t in tensors]
    outs = rt.grouped_allreduce(arrays, name=name, op=op, prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set)
    return [_to_torch(o, t) for o, t in zip(outs, tensors)]


class _GroupedAllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: Any, prescale_factor: float, postscale_factor: float,
                process_set: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.op, ctx.scale, ctx.process_set = op, (prescale_factor, postscale_factor), process_set
        return tuple(_grouped_allreduce(tensors, name, op, prescale_factor, postscale_factor, process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        if ctx.op not in (rt.Average, rt.Sum):
            raise NotImplementedError(f"grouped_allreduce with op={ctx.op} has no gradient")
        reduced = _grouped_allreduce(grads, None, ctx.op, *ctx.scale, ctx.process_set)
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = Compression.none, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Any = global_process_set) -> list[torch.Tensor]:
    """Reduces a list of tensors as one fused operation; returns new tensors (differentiable)."""
    op = resolve_op(average, op)
    compressed = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduceFunction.apply(name, op, prescale_factor, postscale_factor, process_set,
                                           *[c for c, _ in compressed])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, compressed)]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = global_process_set) -> list[torch.Tensor]:
    """Reduces a list of tensors in place as one fused operation."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: Any = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set: Any = global_process_set) -> int:
    arrays = [_as_numpy(t)[0] for t in tensors]
    handle = rt.grouped_allreduce_async(arrays, name=name, op=resolve_op(average, op),
                                        prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                        process_set=process_set)
    return _handles.add(handle, lambda outs: [_to_torch(o, t) for o, t in zip(outs, tensors)], keepalive=arrays)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: Any = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set: Any = global_process_set) -> int:
    staged = [_as_numpy(t) for t in tensors]
    handle = rt.grouped_allreduce_async_([a for a, _ in staged], name=name, op=resolve_op(average, op),
                                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                         process_set=process_set)
    tensors = list(tensors)
    return _handles.add(handle, lambda _: [_write_back(t, s) for t, (_, s) in zip(tensors, staged)],
                        keepalive=(tensors, staged))


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None, op: Any,
                           process_set: Any = global_process_set) -> "_SparseHandle":
    """Allreduce of a sparse COO tensor as allgathers of its indices and values (Horovod's sparse path)."""
    if op not in (rt.Average, rt.Sum):
        raise ValueError(f"sparse allreduce supports op Average or Sum, got {op}")
    t = tensor.detach().coalesce()
    indices = np.ascontiguousarray(t.indices().t().numpy())  # (nnz, ndim): allgather concatenates along nnz
    values, staged = _as_numpy(t.values())
    suffix = "" if name is None else f".{name}"
    handles = [rt.allgather_async(indices, name=f"sparse.indices{suffix}" if name else None,
                                  process_set=process_set),
               rt.allgather_async(values, name=f"sparse.values{suffix}" if name else None,
                                  process_set=process_set)]

    def finish(outs: list[np.ndarray]) -> torch.Tensor:
        all_indices = torch.from_numpy(outs[0]).t()
        all_values = _to_torch(outs[1], t.values())
        if op == rt.Average:
            all_values = all_values / set_rank_size(process_set)[1]
        return torch.sparse_coo_tensor(all_indices, all_values, t.size(), dtype=t.dtype, check_invariants=False)

    return _SparseHandle(_handles.add(handles, finish, keepalive=(t, indices, values, staged)))


class _SparseHandle(int):
    """Horovod's ``sparse_allreduce_async`` returns a function that waits and returns the result; this handle is
    that function and also an ordinary handle for ``poll`` and ``synchronize``."""

    def __call__(self) -> torch.Tensor:
        return synchronize(self)


# ---------------------------------------------------------------------------------------------- allgather
def _allgather(tensor: torch.Tensor, name: str | None, process_set: Any) -> torch.Tensor:
    array, _ = _as_numpy(tensor)
    return _to_torch(rt.allgather(array, name=name, process_set=process_set), tensor)


def _own_rows(grad: torch.Tensor, first_dim: int, process_set: Any) -> torch.Tensor:
    """This rank's rows of an allgathered tensor's gradient: allgather concatenated every rank's first dims."""
    my_rank, _ = set_rank_size(process_set)
    dims = rt.allgather(np.array([first_dim], dtype=np.int64), process_set=process_set)
    offset = int(dims[:my_rank].sum())
    return grad.narrow(0, offset, first_dim)


class _AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: Any) -> torch.Tensor:
        ctx.first_dim, ctx.process_set = (tensor.shape[0] if tensor.dim() else 1), process_set
        return _allgather(tensor, name, process_set)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        # Horovod's convention for the gradients of collectives: the *average* over ranks of the incoming
        # gradients (the loss is taken as the mean of the ranks' losses), then this rank's rows.
        averaged = _allreduce(grad_output, None, rt.Average, 1.0, 1.0, ctx.process_set)
        return _own_rows(averaged, ctx.first_dim, ctx.process_set), None, None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: Any = global_process_set) -> torch.Tensor:
    """Concatenates every rank's tensor along the first dimension (sizes may differ; differentiable)."""
    return _AllgatherFunction.apply(tensor, name, process_set)


def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set) -> int:
    array, _ = _as_numpy(tensor)
    handle = rt.allgather_async(array, name=name, process_set=process_set)
    return _handles.add(handle, lambda out: _to_torch(out, tensor), keepalive=array)


def _grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None, process_set: Any) -> list[torch.Tensor]:
    arrays = [_as_numpy(t)[0] for t in tensors]
    outs = rt.grouped_allgather(arrays, name=name, process_set=process_set)
    return [_to_torch(o, t) for o, t in zip(outs, tensors)]


class _GroupedAllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, process_set: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.first_dims, ctx.process_set = [t.shape[0] if t.dim() else 1 for t in tensors], process_set
        return tuple(_grouped_allgather(tensors, name, process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        averaged = _grouped_allreduce(grads, None, rt.Average, 1.0, 1.0, ctx.process_set)
        return (None, None, *[_own_rows(g, d, ctx.process_set) for g, d in zip(averaged, ctx.first_dims)])


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: Any = global_process_set) -> list[torch.Tensor]:
    """Allgathers a list of tensors as one operation; returns new tensors (differentiable)."""
    return list(_GroupedAllgatherFunction.apply(name, process_set, *tensors))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: Any = global_process_set) -> int:
    arrays = [_as_numpy(t)[0] for t in tensors]
    handle = rt.grouped_allgather_async(arrays, name=name, process_set=process_set)
    return _handles.add(handle, lambda outs: [_to_torch(o, t) for o, t in zip(outs, tensors)], keepalive=arrays)


# ---------------------------------------------------------------------------------------------- broadcast
def _broadcast(tensor: torch.Tensor, root_rank: int, name: str | None, process_set: Any) -> torch.Tensor:
    array, _ = _as_numpy(tensor)
    return _to_torch(rt.broadcast(array, root_rank, name=name, process_set=process_set), tensor)


class _BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None, process_set: Any) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _broadcast(tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        # Every rank's output is the root's input: only the root's input gets a gradient, the average over
        # ranks of theirs (Horovod's convention, see _AllgatherFunction).
        grad = _allreduce(grad_output, None, rt.Average, 1.0, 1.0, ctx.process_set)
        if rt.rank() != ctx.root_rank:
            grad = torch.zeros_like(grad)
        return grad, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: Any = global_process_set) -> torch.Tensor:
    """Returns a new tensor holding ``root_rank``'s value of ``tensor`` (differentiable)."""
    return _BroadcastFunction.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: Any = global_process_set) -> torch.Tensor:
    """Overwrites ``tensor`` with ``root_rank``'s value in place and returns it."""
    array, staged = _as_numpy(tensor)
    rt.broadcast_(array, root_rank, name=name, process_set=process_set)
    return _write_back(tensor, staged)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: Any = global_process_set) -> int:
    array, _ = _as_numpy(tensor)
    handle = rt.broadcast_async(array, root_rank, name=name, process_set=process_set)
    return _handles.add(handle, lambda out: _to_torch(out, tensor), keepalive=array)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: Any = global_process_set) -> int:
    array, staged = _as_numpy(tensor)
    handle = rt.broadcast_async_(array, root_rank, name=name, process_set=process_set)
    return _handles.add(handle, lambda _: _write_back(tensor, staged), keepalive=(tensor, array))


# ---------------------------------------------------------------------------------------------- alltoall
def _alltoall(tensor: torch.Tensor, splits: Any, name: str | None,
              process_set: Any) -> tuple[torch.Tensor, torch.Tensor]:
    array, _ = _as_numpy(tensor)
    size = set_rank_size(process_set)[1]   # None for a set never registered: the runtime says so below
    if splits is None and size and array.ndim and array.shape[0] % size == 0:
        # Equal splits, spelled out: the runtime then reports what each rank sent here (the ranks' first
        # dimensions may differ), which the backward pass sends back. (Indivisible: the runtime refuses.)
        splits = [array.shape[0] // size] * size
    result = rt.alltoall(array, splits=_splits_array(splits), name=name, process_set=process_set)
    return _alltoall_result(result, tensor, process_set)


def _alltoall_result(result: Any, like: torch.Tensor, process_set: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, received splits): the runtime returns the splits only when splits were given (even otherwise)."""
    if isinstance(result, tuple):
        output, received = result
    else:
        n = set_rank_size(process_set)[1]
        output, received = result, np.full(n, len(result) // n)
    return _to_torch(output, like), torch.from_numpy(np.asarray(received, dtype=np.int32).copy())


class _AlltoallFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None,
                process_set: Any) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = _alltoall(tensor, splits, name, process_set)
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor, _unused: Any) -> tuple[Any, ...]:
        # Send each gradient slice back where its rows came from.
        grad, _ = _alltoall(grad_output.contiguous(), ctx.received, None, ctx.process_set)
        return grad, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: Any = global_process_set) -> Any:
    """Scatters slices of ``tensor`` (first dimension, by ``splits`` or evenly) to every rank and gathers what
    they send. Returns the gathered tensor, plus the received splits when ``splits`` is given (Horovod's shape)."""
    output, received = _AlltoallFunction.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: Any = global_process_set) -> int:
    array, _ = _as_numpy(tensor)
    handle = rt.alltoall_async(array, splits=_splits_array(splits), name=name, process_set=process_set)

    def finish(result: Any) -> Any:
        output, received = _alltoall_result(result, tensor, process_set)
        return output if splits is None else (output, received)

    return _handles.add(handle, finish, keepalive=array)


# ---------------------------------------------------------------------------------------------- reducescatter
def _reducescatter(tensor: torch.Tensor, name: str | None, op: Any, prescale_factor: float,
                   postscale_factor: float, process_set: Any) -> torch.Tensor:
    array, _ = _as_numpy(tensor)
    out = rt.reducescatter(array, name=name, op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set)
    return _to_torch(out, tensor)


class _ReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: Any, prescale_factor: float,
                postscale_factor: float, process_set: Any) -> torch.Tensor:
        ctx.op, ctx.scale, ctx.process_set = op, (prescale_factor, postscale_factor), process_set
        return _reducescatter(tensor, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        grad = _reducescatter_grad_scale(grad_output, ctx)
        return _allgather(grad, None, ctx.process_set), None, None, None, None, None


def _reducescatter_grad_scale(grad: torch.Tensor, ctx: Any) -> torch.Tensor:
    """Horovod's gradient of reducescatter before the allgather: Sum multiplies by the set size, Average by 1
    (the loss taken as the mean of the ranks' losses), then by the prescale and postscale factors, in that order
    (so float values match Horovod's exactly)."""
    if ctx.op not in (rt.Average, rt.Sum):
        raise NotImplementedError(f"reducescatter with op={ctx.op} has no gradient")
    grad = grad.contiguous()
    if ctx.op == rt.Sum:
        grad = grad * set_rank_size(ctx.process_set)[1]
    pre, post = ctx.scale
    if pre != 1.0:
        grad = grad * pre
    if post != 1.0:
        grad = grad * post
    return grad


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: type[Compressor] = Compression.none,
                  op: Any = None, process_set: Any = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduces ``tensor`` over all ranks and returns this rank's slice of the first dimension (differentiable)."""
    op = rt.Average if op is None else op
    compressed, ctx = compression.compress(tensor)
    out = _ReducescatterFunction.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: Any = None,
                        process_set: Any = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    array, _ = _as_numpy(tensor)
    handle = rt.reducescatter_async(array, name=name, op=rt.Average if op is None else op,
                                    prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                    process_set=process_set)
    return _handles.add(handle, lambda out: _to_torch(out, tensor), keepalive=array)


class _GroupedReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: Any, prescale_factor: float, postscale_factor: float,
                process_set: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.op, ctx.scale, ctx.process_set = op, (prescale_factor, postscale_factor), process_set
        arrays = [_as_numpy(t)[0] for t in tensors]
        outs = rt.grouped_reducescatter(arrays, name=name, op=op, prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor, process_set=process_set)
        return tuple(_to_torch(o, t) for o, t in zip(outs, tensors))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        scaled = [_reducescatter_grad_scale(g, ctx) for g in grads]
        return (None, None, None, None, None, *_grouped_allgather(scaled, None, ctx.process_set))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: Any = None,
                          process_set: Any = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reducescatters a list of tensors as one operation; returns new tensors (differentiable)."""
    compressed = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatterFunction.apply(name, rt.Average if op is None else op, prescale_factor,
                                               postscale_factor, process_set, *[c for c, _ in compressed])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, compressed)]


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None, op: Any = None,
                                process_set: Any = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Starts reducescatters of a list of tensors as one operation; ``synchronize(handle)`` returns the list."""
    arrays = [_as_numpy(t)[0] for t in tensors]
    handle = rt.grouped_reducescatter_async(arrays, name=name, op=rt.Average if op is None else op,
                                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                            process_set=process_set)
    return _handles.add(handle, lambda outs: [_to_torch(o, t) for o, t in zip(outs, tensors)], keepalive=arrays)


# ---------------------------------------------------------------------------------------------- handles, control
def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (``synchronize`` will not block)."""
    return _handles.poll(handle)


def synchronize(handle: int) -> Any:
    """Waits for the operation behind ``handle`` and returns its result (the tensor, for in-place forms)."""
    return _handles.synchronize(handle)


def join(device: int = -1) -> int:
    """Waits until every rank has joined (ranks that ran out of data keep contributing zeros to the others'
    allreduces meanwhile) and returns the rank that joined last. ``device`` is accepted for Horovod compatibility."""
    return rt.join()


def barrier(process_set: Any = global_process_set) -> None:
    """Blocks until every rank of ``process_set`` has reached it."""
    rt.barrier(process_set=process_set)
