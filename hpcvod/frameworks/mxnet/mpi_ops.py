"""The runtime's collectives on MXNet NDArrays, with Horovod's signatures.

CPU NDArrays reach the runtime through DLPack as NumPy views of their own memory (``to_dlpack_for_write`` /
``_for_read`` first wait for MXNet's asynchronous engine), so in-place forms reduce straight into the NDArray;
``asnumpy()`` would copy (and costs ~150 ms per 64 MiB here). New results come back as NDArrays over the
runtime's output arrays (``nd.from_dlpack``, no copy). GPU NDArrays reach the runtime as CuPy views through DLPack
(the collective runs on the device, docs/gpu.md); without CuPy they go through one staging copy each way.
``priority`` is accepted for Horovod compatibility; the runtime's engine orders work by negotiation instead.
The ops are not differentiable (as in Horovod's MXNet binding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import hpcvod.runtime as rt
from hpcvod.frameworks._common import device_view_of_capsule, numpy_view_of_capsule, resolve_op
from hpcvod.frameworks.mxnet._mx import mx

global_process_set = rt.global_process_set


def _view(tensor: mx.nd.NDArray, writable: bool) -> tuple[Any, np.ndarray | None]:
    """A view of an NDArray's memory (after its pending writes): NumPy for CPU NDArrays, CuPy for GPU ones (the
    runtime then runs the collective on the device); else a staging copy (returned second)."""
    device = tensor.context.device_type
    if device in ("cpu", "gpu") and tensor.size:
        capsule = tensor.to_dlpack_for_write() if writable else tensor.to_dlpack_for_read()
        if device == "cpu":
            return numpy_view_of_capsule(capsule, writable=writable), None
        view = device_view_of_capsule(capsule, tensor.context.device_id)
        if view is not None:
            return view, None
    staged = tensor.asnumpy()
    return staged, staged


def _nd(array: Any, like: mx.nd.NDArray) -> mx.nd.NDArray:
    """An NDArray over ``array``'s memory (no copy on CPU, nor for a CuPy result), on ``like``'s context."""
    if not isinstance(array, np.ndarray):          # a CuPy array from the device path
        return mx.nd.from_dlpack(array.toDlpack())
    array = np.ascontiguousarray(array)
    out = None
    if array.size and array.flags.writeable:
        try:
            out = mx.nd.from_dlpack(array.__dlpack__())
        except Exception:  # noqa: BLE001 - dtypes DLPack lacks
            out = None
    if out is None:
        out = mx.nd.array(array, dtype=array.dtype)
    return out if out.context == like.context else out.as_in_context(like.context)


def _write_back(tensor: mx.nd.NDArray, staged: np.ndarray | None) -> mx.nd.NDArray:
    if staged is not None:
        tensor[:] = staged
    return tensor


def allreduce(tensor: mx.nd.NDArray, average: bool | None = None, name: str | None = None, priority: int = 0,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = global_process_set, op: Any = None) -> mx.nd.NDArray:
    """Reduces ``tensor`` over all ranks into a new NDArray."""
    array, _ = _view(tensor, writable=False)
    out = rt.allreduce(array, name=name, op=resolve_op(average, op), prescale_factor=prescale_factor,
                       postscale_factor=postscale_factor, process_set=process_set)
    return _nd(out, tensor)


def allreduce_(tensor: mx.nd.NDArray, average: bool | None = None, name: str | None = None, priority: int = 0,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: Any = global_process_set, op: Any = None) -> mx.nd.NDArray:
    """Reduces ``tensor`` over all ranks in place and returns it."""
    array, staged = _view(tensor, writable=True)
    rt.allreduce_(array, name=name, op=resolve_op(average, op), prescale_factor=prescale_factor,
                  postscale_factor=postscale_factor, process_set=process_set)
    return _write_back(tensor, staged)


def grouped_allreduce_(tensors: Sequence[mx.nd.NDArray], average: bool | None = None, name: str | None = None,
                       priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = global_process_set, op: Any = None) -> list[mx.nd.NDArray]:
    """Reduces several NDArrays in place, negotiated and fused together."""
    views = [_view(t, writable=True) for t in tensors]
    rt.grouped_allreduce_([v for v, _ in views], name=name, op=resolve_op(average, op),
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          process_set=process_set)
    return [_write_back(t, staged) for t, (_, staged) in zip(tensors, views)]


def grouped_allreduce(tensors: Sequence[mx.nd.NDArray], average: bool | None = None, name: str | None = None,
                      priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Any = global_process_set, op: Any = None) -> list[mx.nd.NDArray]:
    """Reduces several NDArrays together into new NDArrays."""
    outs = rt.grouped_allreduce([_view(t, writable=False)[0] for t in tensors], name=name,
                                op=resolve_op(average, op), prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set)
    return [_nd(o, t) for o, t in zip(outs, tensors)]


def allgather(tensor: mx.nd.NDArray, name: str | None = None, priority: int = 0,
              process_set: Any = global_process_set) -> mx.nd.NDArray:
    """Concatenates every rank's NDArray along the first dimension (sizes may differ)."""
    return _nd(rt.allgather(_view(tensor, writable=False)[0], name=name, process_set=process_set), tensor)


def grouped_allgather(tensors: Sequence[mx.nd.NDArray], name: str | None = None, priority: int = 0,
                      process_set: Any = global_process_set) -> list[mx.nd.NDArray]:
    outs = rt.grouped_allgather([_view(t, writable=False)[0] for t in tensors], name=name, process_set=process_set)
    return [_nd(o, t) for o, t in zip(outs, tensors)]


def broadcast(tensor: mx.nd.NDArray, root_rank: int, name: str | None = None, priority: int = 0,
              process_set: Any = global_process_set) -> mx.nd.NDArray:
    """Returns a new NDArray with ``root_rank``'s value of ``tensor``."""
    out = rt.broadcast(_view(tensor, writable=False)[0], root_rank, name=name, process_set=process_set)
    return _nd(out, tensor)


def broadcast_(tensor: mx.nd.NDArray, root_rank: int, name: str | None = None, priority: int = 0,
               process_set: Any = global_process_set) -> mx.nd.NDArray:
    """Overwrites ``tensor`` with ``root_rank``'s value in place and returns it."""
    array, staged = _view(tensor, writable=True)
    rt.broadcast_(array, root_rank, name=name, process_set=process_set)
    return _write_back(tensor, staged)


def alltoall(tensor: mx.nd.NDArray, splits: Any = None, name: str | None = None, priority: int = 0,
             process_set: Any = global_process_set) -> Any:
    """Scatters slices of ``tensor`` (first dimension) to every rank and gathers what they send; returns the
    gathered NDArray, plus the received splits when ``splits`` is given."""
    if isinstance(splits, mx.nd.NDArray):
        if not np.issubdtype(splits.dtype, np.integer):
            # Horovod's op refuses them too (MXNetError): a RuntimeError that is also the ValueError its tests allow
            raise rt.HpcvodInputError(f"alltoall: splits must be an integer NDArray (int32), got {splits.dtype}")
        splits = splits.asnumpy()
    result = rt.alltoall(_view(tensor, writable=False)[0], splits=splits, name=name, process_set=process_set)
    if splits is None:
        return _nd(result[0] if isinstance(result, tuple) else result, tensor)
    output, received = result
    return _nd(output, tensor), mx.nd.array(np.asarray(received), dtype=np.int32)


def reducescatter(tensor: mx.nd.NDArray, op: Any = None, name: str | None = None, priority: int = 0,
                  process_set: Any = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> mx.nd.NDArray:
    """Reduces ``tensor`` over all ranks and returns this rank's block of the first dimension."""
    out = rt.reducescatter(_view(tensor, writable=False)[0], name=name, op=rt.Average if op is None else op,
                           prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                           process_set=process_set)
    return _nd(out, tensor)


def grouped_reducescatter(tensors: Sequence[mx.nd.NDArray], op: Any = None, name: str | None = None,
                          priority: int = 0, process_set: Any = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[mx.nd.NDArray]:
    """Reducescatters a list of NDArrays as one operation; returns this rank's block of each."""
    outs = rt.grouped_reducescatter([_view(t, writable=False)[0] for t in tensors], name=name,
                                    op=rt.Average if op is None else op, prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor, process_set=process_set)
    return [_nd(o, t) for o, t in zip(outs, tensors)]


def join() -> int:
    return rt.join()


def barrier(process_set: Any = global_process_set) -> None:
    rt.barrier(process_set=process_set)
