"""The caller's tensors as the engine's arrays: NumPy views without copies, CuPy views of device buffers, the
``out=`` checks, and the finishers that copy or decompress a result into the caller's memory.

Every collective accepts a ``numpy.ndarray`` or anything NumPy can view without a copy (buffer protocol,
``__array_interface__``, DLPack); device buffers (CuPy, torch/TF GPU tensors through DLPack) stay on the device.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import gpu
from .compression import Compressor
from .errors import HpcvodInputError
from .handles import Handle
from .tables import BFLOAT16, check_dtype

_ndarray = np.ndarray


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


def contiguous_work(a: np.ndarray, in_place: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(array the engine works on, caller array to copy the result back into or None)."""
    if a.flags.c_contiguous:
        return a, None
    return np.ascontiguousarray(a), (a if in_place else None)


def check_out(out: np.ndarray | None, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
    if out is None:
        return None
    o = as_array(out, writable=True, what="out")
    if o.shape != shape or o.dtype != dtype or not o.flags.c_contiguous:
        raise HpcvodInputError(f"out= must be a C-contiguous {dtype} array of shape {shape}, "
                               f"got {o.dtype} {o.shape}")
    return o


def device_view(tensor: Any, in_place: bool, what: str) -> Any:
    """A contiguous CuPy view of a device buffer (a contiguous copy for out-of-place forms)."""
    d = gpu.device_array(tensor)
    if not d.flags.c_contiguous:
        if in_place:
            raise HpcvodInputError(f"{what}: an in-place device collective needs a contiguous tensor")
        d = gpu.probe()[0].ascontiguousarray(d)
    return d


def element_of(tensor: Any, d: Any) -> Any:
    """The element type a device request's signature carries: BFLOAT16 for wrapped bfloat16 words, else the
    array's dtype (reductions on the words would be integer sums)."""
    return BFLOAT16 if tensor.__class__ is gpu.Bfloat16Words else d.dtype


def on_device(h: Handle) -> Handle:
    from .nccl import current_stream_ptr
    h.device = True
    h.stream = current_stream_ptr()        # ordered after the kernels that produced the tensor
    return h


def device_out(out: Any, like: Any, what: str) -> Any:
    o = device_view(out, True, what)
    if o.shape != like.shape or o.dtype != like.dtype:
        raise HpcvodInputError(f"{what}: out= must be a {like.dtype} device array of shape {like.shape}, "
                               f"got {o.dtype} {o.shape}")
    return o


def device_input(tensor: Any, what: str) -> Any:
    """A contiguous CuPy view (or copy) of a device buffer, or None for host memory: allgather, alltoall and
    reducescatter of device buffers run on the device (runtime/nccl.py), their signatures marked ``device`` so that
    a device request never pairs with a host one."""
    if tensor.__class__ is not _ndarray and gpu.is_device_buffer(tensor):
        return device_view(tensor, False, what)
    return None


def copy_into(target: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    def finish(result: np.ndarray) -> np.ndarray:
        np.copyto(target, result, casting="unsafe")
        return target
    return finish


def decompress_into(compression: type[Compressor], ctx: Any,
                     target: np.ndarray | None) -> Callable[[np.ndarray], np.ndarray]:
    def finish(result: np.ndarray) -> np.ndarray:
        restored = compression.decompress(result, ctx)
        if target is None:
            return restored
        target[...] = restored                     # NumPy or CuPy target
        return target
    return finish


def chain(first: Callable[[Any], Any] | None, second: Callable[[Any], Any]) -> Callable[[Any], Any]:
    if first is None:
        return second
    return lambda r: second(first(r))
