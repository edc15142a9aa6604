"""allreduce and its forms (in place, asynchronous, grouped, compressed, on device buffers).

The hot path of every training step: ``_allreduce_handle`` builds the request (a
:class:`~hpcvod.runtime.handles.Handle` with its :class:`~hpcvod.runtime.handles.Signature`) and
``Lane.run`` / ``Lane.submit`` hands it to the engine (docs/runtime.md follows one allreduce down to the
executor).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import context, gpu
from . import handles as K
from .adasum import check_size as check_adasum_size
from .compression import Compression, Compressor
from .engine import Lane
from .errors import HpcvodInputError, HpcvodNotInitializedError
from .handles import GroupHandle, Handle, Signature, synchronize
from .process_sets import ProcessSet, global_process_set
from .tables import ADASUM, AVERAGE, MAX, MIN, PRODUCT, SUM, arithmetic_dtype, mpi_reduce_op, mpi_type
from .tensors import (as_array, chain, check_out, contiguous_work, copy_into, decompress_into, device_out,
                      device_view, element_of, on_device)

_ndarray = np.ndarray
_new_sig = tuple.__new__   # builds a Signature from all its fields without NamedTuple's Python-level __new__
_NO_COMPRESSION = Compression.none
_VALID_OPS = (AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT)


def lane_of(process_set: ProcessSet) -> Lane:
    lane = process_set._lane
    if lane is None:
        if context._rt is None:
            raise HpcvodNotInitializedError("hpcvod has not been initialized; use hvd.init().")
        if process_set.process_set_id is None:
            raise HpcvodInputError(f"{process_set!r} is not registered; use hvd.add_process_set() first")
        raise HpcvodInputError(f"this rank ({context.rank()}) is not a member of {process_set!r}")
    return lane


def resolve_op(op: int | None, average: bool | None, default: int = AVERAGE) -> int:
    if average is not None:
        if op is not None:
            raise HpcvodInputError("pass either op= or the deprecated average=, not both")
        return AVERAGE if average else SUM
    if op is None:
        return default
    if op not in _VALID_OPS:
        raise HpcvodInputError(f"unknown reduction op {op!r}; expected hvd.Average, Sum, Min, Max or Product")
    return op


# -------------------------------------------------------------------------------------- allreduce
_plans: dict[tuple, tuple] = {}   # (dtype, op) -> (MPI datatype, MPI op): validated once


def reduction_plan(dtype: np.dtype, op: int) -> tuple:
    plan = _plans.get((dtype, op))
    if plan is None:
        if op not in _VALID_OPS:
            raise HpcvodInputError(f"unknown reduction op {op!r}; expected hvd.Average, Sum, Min, Max or Product")
        plan = _plans[(dtype, op)] = (mpi_type(dtype), mpi_reduce_op(op, dtype))
    return plan


def _allreduce_handle(tensor: Any, average: bool | None, name: str | None, op: int | None,
                      prescale_factor: float, postscale_factor: float, process_set: ProcessSet,
                      in_place: bool, out: Any) -> Handle:
    """The handle of an uncompressed allreduce.

    The hot path of every training step: fields equal to the Handle class defaults are not assigned.
    """
    lane = process_set._lane
    if lane is None:
        lane = lane_of(process_set)
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
        plan = reduction_plan(dtype, op)
    pre = float(prescale_factor)
    post = float(postscale_factor)
    flags = a.flags
    if flags.c_contiguous and (flags.writeable or not in_place):
        finish = None
    else:
        if in_place and not flags.writeable:
            raise HpcvodInputError("allreduce_: an in-place collective needs a writable array")
        a, copy_back = contiguous_work(a, in_place)
        finish = copy_into(copy_back) if copy_back is not None else None
    if in_place:
        output = a
    elif out is None:
        output = None
    else:
        output = check_out(out, a.shape, dtype)
        if output is a:
            in_place = True
        elif np.may_share_memory(output, a):
            raise HpcvodInputError("allreduce: out= overlaps the input; use allreduce_ to reduce in place")
    sig = _new_sig(Signature, (K.ALLREDUCE, dtype, a.shape, op, None, pre, post, False))   # Signature(...), faster
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
    else:
        if op == ADASUM:
            check_adasum_size(lane.size)
        if post != 1.0:
            h.postscale = post
    if finish is not None:
        h.finish = finish
    return h


def _device_allreduce_handle(lane: Lane, tensor: Any, average: bool | None, name: str | None,
                             op: int | None, prescale_factor: float, postscale_factor: float,
                             in_place: bool, out: Any) -> Handle:
    """An allreduce of GPU memory: negotiated like any other, executed by runtime/nccl.py."""
    d = device_view(tensor, in_place, "allreduce")
    elem = element_of(tensor, d)
    op = resolve_op(op, average)
    plan = reduction_plan(arithmetic_dtype(elem), op)   # for staging through host memory
    if op == ADASUM:
        check_adasum_size(lane.size)
    pre, post = float(prescale_factor), float(postscale_factor)
    output = d if in_place else (device_out(out, d, "allreduce") if out is not None else None)
    sig = Signature(K.ALLREDUCE, elem, d.shape, op, None, pre, post, True)
    h = Handle(name if name is not None else lane.auto_name(), K.ALLREDUCE, sig, d, output, name is None)
    h.lane = lane
    h.mpi_type, h.mpi_op = plan               # for staging through host memory
    h.prescale = pre
    h.postscale = post / lane.size if op == AVERAGE else post
    return on_device(h)


def _compressed_handle(tensor: Any, average: bool | None, name: str | None, op: int | None,
                       prescale_factor: float, postscale_factor: float, process_set: ProcessSet,
                       compression: type[Compressor], in_place: bool, out: Any) -> Handle:
    """allreduce with a compressor: reduce the compressed copy, restore into the caller's array/out."""
    device = tensor.__class__ is not _ndarray and gpu.is_device_buffer(tensor)
    if tensor.__class__ is gpu.Bfloat16Words:
        raise HpcvodInputError("allreduce: compression of bfloat16 words is not supported; compress the "
                               "framework's tensor first (the framework optimizers do)")
    a = device_view(tensor, in_place, "allreduce") if device else as_array(tensor, writable=in_place)
    compressed, ctx = compression.compress(a)      # NumPy and CuPy arrays alike (astype)
    if compressed is a:
        return _allreduce_handle(a, average, name, op, prescale_factor, postscale_factor, process_set,
                                 in_place, out)
    h = _allreduce_handle(compressed, average, name, op, prescale_factor, postscale_factor, process_set,
                          False, None)
    if in_place or out is None:
        target = a if in_place else None
    else:
        target = device_out(out, a, "allreduce") if device else check_out(out, a.shape, a.dtype)
    h.finish = chain(h.finish, decompress_into(compression, ctx, target))
    return h


def _make_allreduce(tensor: Any, average: bool | None, name: str | None, op: int | None,
                    prescale_factor: float, postscale_factor: float, process_set: ProcessSet,
                    compression: type[Compressor], in_place: bool, out: Any) -> Handle:
    if compression is _NO_COMPRESSION:
        return _allreduce_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                                 in_place, out)
    return _compressed_handle(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                              compression, in_place, out)


def allreduce_async(tensor: Any, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
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


def allreduce_async_(tensor: Any, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
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


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
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


def allreduce_(tensor: Any, average: bool | None = None, name: str | None = None,
               compression: type[Compressor] = Compression.none, op: int | None = None,
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


def grouped_allreduce_async(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                            op: int | None = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
                            compression: type[Compressor] = Compression.none) -> GroupHandle:
    """Start an allreduce of several tensors that are negotiated and fused together."""
    return _grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                              compression, False)


def grouped_allreduce_async_(tensors: Sequence[Any], average: bool | None = None,
                             name: str | None = None, op: int | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set,
                             compression: type[Compressor] = Compression.none) -> GroupHandle:
    """In-place ``grouped_allreduce_async``."""
    return _grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                              compression, True)


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = Compression.none, op: int | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Allreduce several tensors together; returns the list of results."""
    return synchronize(_grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor,
                                          process_set, compression, False))


def grouped_allreduce_(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                       compression: type[Compressor] = Compression.none, op: int | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """In-place grouped allreduce."""
    return synchronize(_grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor,
                                          process_set, compression, True))


def group_names(lane: Lane, name: str | None, kind: str, n: int) -> list[str]:
    base = name if name is not None else lane.auto_name()
    return [f"{base}.{i}" for i in range(n)]


def _grouped_allreduce(tensors: Sequence[Any], average: bool | None, name: str | None,
                       op: int | None, pre: float, post: float, process_set: ProcessSet,
                       compression: type[Compressor], in_place: bool) -> GroupHandle:
    lane = lane_of(process_set)
    names = group_names(lane, name, "grouped_allreduce", len(tensors))
    hs = [_make_allreduce(t, average, n, op, pre, post, process_set, compression, in_place, None)
          for t, n in zip(tensors, names)]
    lane.submit_many(hs)
    return GroupHandle(hs)
