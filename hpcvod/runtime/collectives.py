"""The collectives of ``hpcvod.runtime`` over NumPy-compatible buffers.

Every function accepts a ``numpy.ndarray`` or anything NumPy can view without a copy (buffer protocol,
``__array_interface__``, DLPack). In-place forms (``allreduce_``, ``allreduce_async_``, ``broadcast_``)
write into the caller's memory; the others return new arrays. ``*_async*`` forms return a
:class:`~hpcvod.runtime.handles.Handle` for :func:`poll` / :func:`synchronize`.

Framework wrappers: pass a NumPy view of the framework tensor's memory (``torch_tensor.numpy()``,
``np.from_dlpack(x)``), use the in-place forms, or pass ``out=`` (an array of the result's shape and dtype,
written in place) so that results land in framework-owned memory without an extra copy.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from . import context, gpu
from . import handles as K
from .compression import Compression, Compressor
from .engine import Lane, dumps, loads
from .tables import (
    ADASUM, AVERAGE, BFLOAT16, MAX, MIN, PRODUCT, SUM, arithmetic_dtype, check_dtype, mpi_reduce_op, mpi_type,
)
from .errors import HpcvodInputError, HpcvodNotInitializedError
from .handles import GroupHandle, Handle, Signature
from .process_sets import ProcessSet, global_process_set

# Reduction ops, numbered like Horovod's.
Average = AVERAGE
Sum = SUM
Adasum = ADASUM
Min = MIN
Max = MAX
Product = PRODUCT

_ndarray = np.ndarray
_NO_COMPRESSION = Compression.none
_VALID_OPS = (AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT)

AnyHandle = Union[Handle, GroupHandle]


def as_array(tensor: Any, *, writable: bool = False, what: str = "tensor") -> np.ndarray:
    """A NumPy view of ``tensor``'s memory (no copy for arrays, buffers, ``__array_interface__``, DLPack)."""
    if isinstance(tensor, _ndarray):
        a = tensor
    elif hasattr(tensor, "__array_interface__") or hasattr(tensor, "__array_struct__"):
        a = np.asarray(tensor)
    elif gpu.is_device_buffer(tensor):
        # Collectives run on device memory where they can (NCCL); what reaches this takes a host copy.
        if writable:
            raise HpcvodInputError(f"{what}: this in-place collective cannot write into GPU memory; only "
                                   f"allreduce_ and broadcast_ run in place on device buffers")
        return gpu.probe()[0].asnumpy(gpu.device_array(tensor))
    elif hasattr(tensor, "__dlpack__") and not isinstance(tensor, (list, tuple)):
        try:
            a = np.from_dlpack(tensor)
        except (TypeError, RuntimeError, BufferError) as exc:
            raise HpcvodInputError(f"{what}: cannot view {type(tensor).__name__} through DLPack: {exc}") from None
    else:
        try:
            memoryview(tensor)
            a = np.asarray(tensor)
        except TypeError:
            if writable:
                raise HpcvodInputError(
                    f"{what}: an in-place collective needs an array that exposes its memory (NumPy array, "
                    f"buffer protocol, __array_interface__ or DLPack), got {type(tensor).__name__}") from None
            a = np.asarray(tensor)
    if writable and not a.flags.writeable:
        raise HpcvodInputError(f"{what}: an in-place collective needs a writable array")
    check_dtype(a.dtype, what)
    return a


def _lane_of(process_set: ProcessSet) -> Lane:
    lane = process_set._lane
    if lane is None:
        if context._rt is None:
            raise HpcvodNotInitializedError("hpcvod has not been initialized; use hvd.init().")
        if process_set.process_set_id is None:
            raise HpcvodInputError(f"{process_set!r} is not registered; use hvd.add_process_set() first")
        raise HpcvodInputError(f"this rank ({context.rank()}) is not a member of {process_set!r}")
    return lane


def _resolve_op(op: Optional[int], average: Optional[bool], default: int = AVERAGE) -> int:
    if average is not None:
        if op is not None:
            raise HpcvodInputError("pass either op= or the deprecated average=, not both")
        return AVERAGE if average else SUM
    if op is None:
        return default
    if op not in _VALID_OPS:
        raise HpcvodInputError(f"unknown reduction op {op!r}; expected hvd.Average, Sum, Min, Max or Product")
    return op


def _contiguous_work(a: np.ndarray, in_place: bool) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """(array the engine works on, caller array to copy the result back into or None)."""
    if a.flags.c_contiguous:
        return a, None
    return np.ascontiguousarray(a), (a if in_place else None)


def _check_out(out: Optional[np.ndarray], shape: tuple, dtype: np.dtype) -> Optional[np.ndarray]:
    if out is None:
        return None
    o = as_array(out, writable=True, what="out")
    if o.shape != shape or o.dtype != dtype or not o.flags.c_contiguous:
        raise HpcvodInputError(f"out= must be a C-contiguous {dtype} array of shape {shape}, "
                               f"got {o.dtype} {o.shape}")
    return o


def _chain(first: Optional[Callable[[Any], Any]], second: Callable[[Any], Any]) -> Callable[[Any], Any]:
    if first is None:
        return second
    return lambda r: second(first(r))


# -------------------------------------------------------------------------------------- allreduce
_plans: dict[tuple, tuple] = {}   # (dtype, op) -> (MPI datatype, MPI op): validated once


def _reduction_plan(dtype: np.dtype, op: int) -> tuple:
    plan = _plans.get((dtype, op))
    if plan is None:
        if op not in _VALID_OPS:
            raise HpcvodInputError(f"unknown reduction op {op!r}; expected hvd.Average, Sum, Min, Max or Product")
        plan = _plans[(dtype, op)] = (mpi_type(dtype), mpi_reduce_op(op, dtype))
    return plan


def _allreduce_handle(tensor: Any, average: Optional[bool], name: Optional[str], op: Optional[int],
                      prescale_factor: float, postscale_factor: float, process_set: ProcessSet,
                      in_place: bool, out: Any) -> Handle:
    """The handle of an uncompressed allreduce.

    The hot path of every training step: fields equal to the Handle class defaults are not assigned.
    """
    lane = process_set._lane
    if lane is None:
        lane = _lane_of(process_set)
    if tensor.__class__ is _ndarray:
        a = tensor
    elif gpu.is_device_buffer(tensor):
        return _device_allreduce_handle(lane, tensor, average, name, op, prescale_factor, postscale_factor,
                                        in_place, out)
    else:
        a = as_array(tensor, writable=in_place)
    if op is None:
        op = AVERAGE if average is None or average else SUM
    elif average is not None:
        raise HpcvodInputError("pass either op= or the deprecated average=, not both")
    dtype = a.dtype
    plan = _plans.get((dtype, op))
    if plan is None:
        plan = _reduction_plan(dtype, op)
    pre = float(prescale_factor)
    post = float(postscale_factor)
    flags = a.flags
    if flags.c_contiguous and (flags.writeable or not in_place):
        finish = None
    else:
        if in_place and not flags.writeable:
            raise HpcvodInputError("allreduce_: an in-place collective needs a writable array")
        a, copy_back = _contiguous_work(a, in_place)
        finish = _copy_into(copy_back) if copy_back is not None else None
    if in_place:
        output = a
    elif out is None:
        output = None
    else:
        output = _check_out(out, a.shape, dtype)
        if output is a:
            in_place = True
        elif np.may_share_memory(output, a):
            raise HpcvodInputError("allreduce: out= overlaps the input; use allreduce_ to reduce in place")
    sig = Signature(K.ALLREDUCE, dtype, a.shape, op, None, pre, post, False)
    if name is None:
        h = Handle(lane.auto_name(), K.ALLREDUCE, sig, a, output, True)
    else:
        h = Handle(name, K.ALLREDUCE, sig, a, output)
    h.lane = lane
    h.mpi_type, h.mpi_op = plan
    if pre != 1.0:
        h.prescale = pre
    if op == AVERAGE:
        h.postscale = post / lane.size
    elif post != 1.0:
        h.postscale = post
    if finish is not None:
        h.finish = finish
    return h


def _device_view(tensor: Any, in_place: bool, what: str) -> Any:
    """A contiguous CuPy view of a device buffer (a contiguous copy for out-of-place forms)."""
    d = gpu.device_array(tensor)
    if not d.flags.c_contiguous:
        if in_place:
            raise HpcvodInputError(f"{what}: an in-place device collective needs a contiguous tensor")
        d = gpu.probe()[0].ascontiguousarray(d)
    return d


def _element(tensor: Any, d: Any) -> Any:
    """The element type a device request's signature carries: BFLOAT16 for wrapped bfloat16 words, else the
    array's dtype (reductions on the words would be integer sums)."""
    return BFLOAT16 if tensor.__class__ is gpu.Bfloat16Words else d.dtype


def _on_device(h: Handle) -> Handle:
    from .nccl import current_stream_ptr
    h.device = True
    h.stream = current_stream_ptr()        # ordered after the kernels that produced the tensor
    return h


def _device_out(out: Any, like: Any, what: str) -> Any:
    o = _device_view(out, True, what)
    if o.shape != like.shape or o.dtype != like.dtype:
        raise HpcvodInputError(f"{what}: out= must be a {like.dtype} device array of shape {like.shape}, "
                               f"got {o.dtype} {o.shape}")
    return o


def _device_allreduce_handle(lane: Lane, tensor: Any, average: Optional[bool], name: Optional[str],
                             op: Optional[int], prescale_factor: float, postscale_factor: float,
                             in_place: bool, out: Any) -> Handle:
    """An allreduce of GPU memory: negotiated like any other, executed by runtime/nccl.py."""
    d = _device_view(tensor, in_place, "allreduce")
    elem = _element(tensor, d)
    op = _resolve_op(op, average)
    plan = _reduction_plan(arithmetic_dtype(elem), op)   # for staging through host memory
    pre, post = float(prescale_factor), float(postscale_factor)
    output = d if in_place else (_device_out(out, d, "allreduce") if out is not None else None)
    sig = Signature(K.ALLREDUCE, elem, d.shape, op, None, pre, post, True)
    h = Handle(name if name is not None else lane.auto_name(), K.ALLREDUCE, sig, d, output, name is None)
    h.lane = lane
    h.mpi_type, h.mpi_op = plan               # for staging through host memory
    h.prescale = pre
    h.postscale = post / lane.size if op == AVERAGE else post
    return _on_device(h)


def _copy_into(target: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    def finish(result: np.ndarray) -> np.ndarray:
        np.copyto(target, result, casting="unsafe")
        return target
    return finish


def _decompress_into(compression: type[Compressor], ctx: Any,
                     target: Optional[np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    def finish(result: np.ndarray) -> np.ndarray:
        restored = compression.decompress(result, ctx)
        if target is None:
            return restored
        target[...] = restored                     # NumPy or CuPy target
        return target
    return finish


def _compressed_handle(tensor: Any, average: Optional[bool], name: Optional[str], op: Optional[int],
                       prescale_factor: float, postscale_factor: float, process_set: ProcessSet,
                       compression: type[Compressor], in_place: bool, out: Any) -> Handle:
    """allreduce with a compressor: reduce the compressed copy, restore into the caller's array/out."""
    device = tensor.__class__ is not _ndarray and gpu.is_device_buffer(tensor)
    if tensor.__class__ is gpu.Bfloat16Words:
        raise HpcvodInputError("allreduce: compression of bfloat16 words is not supported; compress the "
                               "framework's tensor first (the framework optimizers do)")
    a = _device_view(tensor, in_place, "allreduce") if device else as_array(tensor, writable=in_place)
    compressed, ctx = compression.compress(a)      # NumPy and CuPy arrays alike (astype)
    if compressed is a:
        return _allreduce_handle(a, average, name, op, prescale_factor, postscale_factor, process_set,
                                 in_place, out)
    h = _allreduce_handle(compressed, average, name, op, prescale_factor, postscale_factor, process_set,
                          False, None)
    if in_place or out is None:
        target = a if in_place else None
    else:
        target = _device_out(out, a, "allreduce") if device else _check_out(out, a.shape, a.dtype)
    h.finish = _chain(h.finish, _decompress_into(compression, ctx, target))
    return h


def _make_allreduce(tensor: Any, average: Optional[bool], name: Optional[str], op: Optional[int],
                    prescale_factor: float, postscale_factor: float, process_set: ProcessSet,
                    compression: type[Compressor], in_place: bool, out: Any) -> Handle:
    if compression is _NO_COMPRESSION:
        return _allreduce_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                                 in_place, out)
    return _compressed_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                              compression, in_place, out)


def allreduce_async(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set,
                    compression: type[Compressor] = Compression.none, *, out: Any = None) -> Handle:
    """Start reducing ``tensor`` over the process set (default op Average); returns a handle."""
    if compression is _NO_COMPRESSION:
        h = _allreduce_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set, False, out)
    else:
        h = _compressed_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                               compression, False, out)
    h.lane.submit(h)
    return h


def allreduce_async_(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set,
                     compression: type[Compressor] = Compression.none) -> Handle:
    """In-place ``allreduce_async``: ``tensor`` receives the result."""
    if compression is _NO_COMPRESSION:
        h = _allreduce_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set, True, None)
    else:
        h = _compressed_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                               compression, True, None)
    h.lane.submit(h)
    return h


def allreduce(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
              compression: type[Compressor] = Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set, *, out: Any = None) -> np.ndarray:
    """Reduce ``tensor`` over the process set and return the result as a new array (default op Average)."""
    if compression is _NO_COMPRESSION:
        h = _allreduce_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set, False, out)
    else:
        h = _compressed_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                               compression, False, out)
    result = h.lane.run(h)
    return result if h.finish is None else synchronize(h)


def allreduce_(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
               compression: type[Compressor] = Compression.none, op: Optional[int] = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> np.ndarray:
    """In-place allreduce: ``tensor`` receives the result and is returned."""
    if compression is _NO_COMPRESSION:
        h = _allreduce_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set, True, None)
    else:
        h = _compressed_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                               compression, True, None)
    result = h.lane.run(h)
    return result if h.finish is None else synchronize(h)


def grouped_allreduce_async(tensors: Sequence[Any], average: Optional[bool] = None, name: Optional[str] = None,
                            op: Optional[int] = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
                            compression: type[Compressor] = Compression.none) -> GroupHandle:
    """Start an allreduce of several tensors that are negotiated and fused together."""
    return _grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                              compression, False)


def grouped_allreduce_async_(tensors: Sequence[Any], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set,
                             compression: type[Compressor] = Compression.none) -> GroupHandle:
    """In-place ``grouped_allreduce_async``."""
    return _grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                              compression, True)


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None, name: Optional[str] = None,
                      compression: type[Compressor] = Compression.none, op: Optional[int] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Allreduce several tensors together; returns the list of results."""
    return synchronize(_grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor,
                                          process_set, compression, False))


def grouped_allreduce_(tensors: Sequence[Any], average: Optional[bool] = None, name: Optional[str] = None,
                       compression: type[Compressor] = Compression.none, op: Optional[int] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """In-place grouped allreduce."""
    return synchronize(_grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor,
                                          process_set, compression, True))


def _group_names(lane: Lane, name: Optional[str], kind: str, n: int) -> list[str]:
    base = name if name is not None else lane.auto_name()
    return [f"{base}.{i}" for i in range(n)]


def _grouped_allreduce(tensors: Sequence[Any], average: Optional[bool], name: Optional[str],
                       op: Optional[int], pre: float, post: float, process_set: ProcessSet,
                       compression: type[Compressor], in_place: bool) -> GroupHandle:
    lane = _lane_of(process_set)
    names = _group_names(lane, name, "grouped_allreduce", len(tensors))
    hs = [_make_allreduce(t, average, n, op, pre, post, process_set, compression, in_place, None)
          for t, n in zip(tensors, names)]
    lane.submit_many(hs)
    return GroupHandle(hs)


# ------------------------------------------------------------------------- allgather & friends
def _plain_handle(kind: int, tensor: Any, name: Optional[str], process_set: ProcessSet, a: np.ndarray,
                  output: Optional[np.ndarray] = None, **fields: Any) -> Handle:
    """The handle of a collective other than allreduce; ``fields``: its signature's (shape, op, root...)."""
    lane = _lane_of(process_set)
    t = mpi_type(a.dtype)
    sig = Signature(kind, _element(tensor, a), **fields)
    if name is None:
        h = Handle(lane.auto_name(), kind, sig, a, output, True)
    else:
        h = Handle(name, kind, sig, a, output)
    h.mpi_type = t
    h.lane = lane
    return h


def _device_input(tensor: Any, what: str) -> Any:
    """A contiguous CuPy view (or copy) of a device buffer, or None for host memory: allgather, alltoall and
    reducescatter of device buffers run on the device (runtime/nccl.py), their signatures marked DEVICE so that
    a device request never pairs with a host one."""
    if tensor.__class__ is not _ndarray and gpu.is_device_buffer(tensor):
        return _device_view(tensor, False, what)
    return None


def _allgather_handle(tensor: Any, name: Optional[str], process_set: ProcessSet) -> Handle:
    d = _device_input(tensor, "allgather")
    if d is not None:
        d = d.reshape(1) if d.ndim == 0 else d
        return _on_device(_plain_handle(K.ALLGATHER, tensor, name, process_set, d, shape=d.shape[1:], device=True))
    a = as_array(tensor)
    if a.ndim == 0:
        a = a.reshape(1)
    a, _ = _contiguous_work(a, False)
    return _plain_handle(K.ALLGATHER, tensor, name, process_set, a, shape=a.shape[1:])


def allgather_async(tensor: Any, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start concatenating every rank's ``tensor`` along the first dimension (which may differ per rank)."""
    h = _allgather_handle(tensor, name, process_set)
    h.lane.submit(h)
    return h


def allgather(tensor: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order."""
    h = _allgather_handle(tensor, name, process_set)
    return h.lane.run(h)


def grouped_allgather_async(tensors: Sequence[Any], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> GroupHandle:
    """Start allgathers of several tensors, negotiated together."""
    lane = _lane_of(process_set)
    names = _group_names(lane, name, "grouped_allgather", len(tensors))
    hs = [_allgather_handle(t, n, process_set) for t, n in zip(tensors, names)]
    lane.submit_many(hs)
    return GroupHandle(hs)


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Allgather several tensors; returns the list of results."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def _broadcast_handle(tensor: Any, root_rank: int, name: Optional[str], process_set: ProcessSet,
                      in_place: bool, out: Any = None) -> Handle:
    lane = _lane_of(process_set)
    try:
        root_index = lane.ranks.index(int(root_rank))
    except (ValueError, TypeError):
        raise HpcvodInputError(f"broadcast: root_rank={root_rank!r} is not a rank of {process_set!r} "
                               f"(ranks {lane.ranks})") from None
    if tensor.__class__ is not _ndarray and gpu.is_device_buffer(tensor):
        d = _device_view(tensor, in_place, "broadcast")
        output = d if in_place else (_device_out(out, d, "broadcast") if out is not None else None)
        h = _plain_handle(K.BROADCAST, tensor, name, process_set, d, output, shape=d.shape, root=int(root_rank),
                          device=True)
        h.root = root_index
        return _on_device(h)
    a = as_array(tensor, writable=in_place)
    a, copy_back = _contiguous_work(a, in_place)
    output = a if in_place else (_check_out(out, a.shape, a.dtype) if out is not None else None)
    h = _plain_handle(K.BROADCAST, tensor, name, process_set, a, output, shape=a.shape, root=int(root_rank))
    h.root = root_index
    if copy_back is not None:
        h.finish = _copy_into(copy_back)
    return h


def broadcast_async(tensor: Any, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set, *, out: Any = None) -> Handle:
    """Start sending ``root_rank``'s ``tensor`` to every rank (result: a new array)."""
    h = _broadcast_handle(tensor, root_rank, name, process_set, False, out)
    h.lane.submit(h)
    return h


def broadcast_async_(tensor: Any, root_rank: int, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """In-place ``broadcast_async``: ``tensor`` receives root's data."""
    h = _broadcast_handle(tensor, root_rank, name, process_set, True)
    h.lane.submit(h)
    return h


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set, *, out: Any = None) -> np.ndarray:
    """Return ``root_rank``'s ``tensor`` on every rank."""
    h = _broadcast_handle(tensor, root_rank, name, process_set, False, out)
    h.lane.run(h)
    return synchronize(h)


def broadcast_(tensor: Any, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> np.ndarray:
    """In-place broadcast: ``tensor`` receives root's data and is returned."""
    h = _broadcast_handle(tensor, root_rank, name, process_set, True)
    h.lane.run(h)
    return synchronize(h)


def _alltoall_handle(tensor: Any, splits: Any, name: Optional[str], process_set: ProcessSet) -> Handle:
    lane = _lane_of(process_set)
    d = _device_input(tensor, "alltoall")
    a = d if d is not None else as_array(tensor)
    if a.ndim == 0:
        raise HpcvodInputError("alltoall: the tensor needs at least one dimension")
    if d is None:
        a, _ = _contiguous_work(a, False)
    n = lane.size
    if splits is None:
        if a.shape[0] % n:
            raise HpcvodInputError(f"alltoall: first dimension {a.shape[0]} is not divisible by the "
                                   f"{n} ranks of the process set; pass splits=")
        s = np.full(n, a.shape[0] // n, np.int64)
    else:
        s = np.asarray(as_array(splits) if not isinstance(splits, (list, tuple)) else splits).astype(np.int64)
        if s.shape != (n,) or (s < 0).any() or int(s.sum()) != a.shape[0]:
            raise HpcvodInputError(f"alltoall: splits must be {n} non-negative integers summing to the first "
                                   f"dimension {a.shape[0]}, got {s.tolist()}")
    h = _plain_handle(K.ALLTOALL, tensor, name, process_set, a, shape=a.shape[1:], device=d is not None)
    if d is not None:
        _on_device(h)
    h.splits = np.ascontiguousarray(s)
    if splits is None:
        h.finish = _first_of_pair
    return h


def _first_of_pair(result: tuple) -> Any:
    return result[0]


def alltoall_async(tensor: Any, splits: Any = None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start an alltoall (see :func:`alltoall`)."""
    h = _alltoall_handle(tensor, splits, name, process_set)
    h.lane.submit(h)
    return h


def alltoall(tensor: Any, splits: Any = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[i]`` rows of ``tensor`` to rank i (equal parts without ``splits``).

    Returns the rows received, concatenated in rank order; with ``splits`` given, returns
    ``(received, received_splits)``.
    """
    h = _alltoall_handle(tensor, splits, name, process_set)
    h.lane.run(h)
    return synchronize(h)


def _reducescatter_handle(tensor: Any, name: Optional[str], op: Optional[int], process_set: ProcessSet,
                          prescale_factor: float, postscale_factor: float,
                          compression: type[Compressor]) -> Handle:
    lane = _lane_of(process_set)
    d = _device_input(tensor, "reducescatter") if compression is Compression.none else None
    a = d if d is not None else as_array(tensor)
    if a.ndim == 0:
        raise HpcvodInputError("reducescatter: the tensor needs at least one dimension")
    finish = None
    if d is None and compression is not Compression.none:   # (compressed reducescatters stay on the host)
        compressed, ctx = compression.compress(a)
        if compressed is not a:
            finish = _decompress_into(compression, ctx, None)
            a = compressed
    if d is None:
        a, _ = _contiguous_work(a, False)
    op = _resolve_op(op, None)
    mpi_op = mpi_reduce_op(op, a.dtype)
    pre, post = float(prescale_factor), float(postscale_factor)
    h = _plain_handle(K.REDUCESCATTER, tensor, name, process_set, a, shape=a.shape, op=op, prescale=pre,
                      postscale=post, device=d is not None)
    if d is not None:
        _on_device(h)
    h.mpi_op = mpi_op
    h.prescale = pre
    h.postscale = post / lane.size if op == AVERAGE else post
    h.finish = finish
    return h


def reducescatter_async(tensor: Any, name: Optional[str] = None, op: Optional[int] = None,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0,
                        compression: type[Compressor] = Compression.none) -> Handle:
    """Start a reducescatter (see :func:`reducescatter`)."""
    h = _reducescatter_handle(tensor, name, op, process_set, prescale_factor, postscale_factor, compression)
    h.lane.submit(h)
    return h


def reducescatter(tensor: Any, name: Optional[str] = None, compression: type[Compressor] = Compression.none,
                  op: Optional[int] = None, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce ``tensor`` over the ranks (default Average) and return this rank's block of the first dimension.

    The first dimension is split as evenly as possible; the first ``dim0 % size`` ranks get one extra row.
    """
    h = _reducescatter_handle(tensor, name, op, process_set, prescale_factor, postscale_factor, compression)
    h.lane.run(h)
    return synchronize(h)


def grouped_reducescatter_async(tensors: Sequence[Any], name: Optional[str] = None, op: Optional[int] = None,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0,
                                compression: type[Compressor] = Compression.none) -> GroupHandle:
    """Start reducescatters of several tensors, negotiated together."""
    lane = _lane_of(process_set)
    names = _group_names(lane, name, "grouped_reducescatter", len(tensors))
    hs = [_reducescatter_handle(t, n, op, process_set, prescale_factor, postscale_factor, compression)
          for t, n in zip(tensors, names)]
    lane.submit_many(hs)
    return GroupHandle(hs)


def grouped_reducescatter(tensors: Sequence[Any], name: Optional[str] = None,
                          compression: type[Compressor] = Compression.none, op: Optional[int] = None,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[np.ndarray]:
    """Reducescatter several tensors; returns the list of results."""
    return synchronize(grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                                   postscale_factor, compression))


# ------------------------------------------------------------------------------- synchronisation
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the process set has called barrier()."""
    lane = _lane_of(process_set)
    h = Handle(lane.auto_name(), K.BARRIER, Signature(K.BARRIER), None, None, True)
    lane.run(h)


def join(device: int = -1) -> int:
    """Declare that this rank has no more data (global process set).

    Until every rank has joined, this rank keeps taking part in the collectives the others run, contributing
    neutral values (zeros for Sum/Average, so Average still divides by the full size; an empty block to an
    allgather). Returns the rank that joined last.
    """
    rt = context.runtime()
    lane = rt.global_lane
    h = Handle("join", K.JOIN, Signature(K.JOIN), None)
    return lane.run(h)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s picklable ``obj`` on every rank."""
    lane = _lane_of(process_set)
    is_root = lane.ranks[lane.rank] == root_rank
    data = dumps(obj) if is_root else None
    length = np.array([data.size if data is not None else 0], np.int64)
    # unnamed without a name: then the response cache knows the length broadcast from one call to the next
    broadcast_(length, root_rank, name=None if name is None else f"{name}.size", process_set=process_set)
    buf = data.copy() if data is not None else np.empty(int(length[0]), np.uint8)
    broadcast_(buf, root_rank, name=None if name is None else f"{name}.data", process_set=process_set)
    return obj if is_root else loads(buf)


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return the list of every rank's picklable ``obj``, in rank order."""
    _lane_of(process_set)
    data = dumps(obj)
    sizes = allgather(np.array([data.size], np.int64), name=None if name is None else f"{name}.size",
                      process_set=process_set)
    gathered = allgather(data, name=None if name is None else f"{name}.data", process_set=process_set)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [loads(gathered[bounds[i]:bounds[i + 1]]) for i in range(len(sizes))]


def poll(handle: AnyHandle) -> bool:
    """True when the operation behind ``handle`` has finished (successfully or not)."""
    return handle.done


def synchronize(handle: AnyHandle) -> Any:
    """Wait for ``handle`` and return its result (raises the HpcvodError it failed with)."""
    if handle.__class__ is not Handle:
        if isinstance(handle, GroupHandle):
            return [synchronize(h) for h in handle.handles]
        raise HpcvodInputError(f"synchronize() expects a handle from an *_async call, got {handle!r}")
    if not handle.done:
        handle.lane.wait(handle)
    if handle.error is not None:
        raise handle.error
    finish = handle.finish
    if finish is None:
        return handle.result
    handle.finish = None
    handle.result = finish(handle.result)
    return handle.result
