"""Framework-independent pieces shared by the torch, tensorflow and mxnet wrappers.

Everything here sits on the public API of ``hpcvod.runtime`` (NumPy arrays in, NumPy arrays out) and knows no
framework: the DLPack helpers take and return capsules and NumPy arrays, the handle table maps the integer handles
the wrappers give their users to runtime handles plus a function that turns the runtime's result into a tensor.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import hpcvod.runtime as rt

# Names every framework module re-exports unchanged from the runtime (Horovod's "basics").
RUNTIME_BASICS = (
    "init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank", "local_rank",
    "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
    "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    "start_timeline", "stop_timeline",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "HorovodInternalError", "HpcvodError",
)
# The reduction ops live in the runtime's collectives module, which imports mpi4py.MPI (and so initialises MPI):
# framework modules forward them lazily (module ``__getattr__``) so that importing hpcvod.torch & co. does not.
RUNTIME_LAZY_NAMES = ("Average", "Sum", "Adasum", "Min", "Max", "Product")


def runtime_basics() -> dict[str, Any]:
    """The runtime names a framework module re-exports, as a dict for ``globals().update``.

    Names the runtime does not have (yet) are left out rather than faked; docs/drop-in.md lists them.
    """
    return {name: getattr(rt, name) for name in RUNTIME_BASICS if hasattr(rt, name)}


def set_rank_size(process_set: Any) -> tuple[int, int]:
    """This rank's position in ``process_set`` and the set's size (the global world for the global set)."""
    if process_set is None or process_set is rt.global_process_set:
        return rt.rank(), rt.size()
    return process_set.rank(), process_set.size()


def lazy_runtime_attribute(module: str, name: str) -> Any:
    """Module ``__getattr__`` body for the framework modules: the runtime's reduction ops, on first use."""
    if name in RUNTIME_LAZY_NAMES:
        return getattr(rt, name)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def resolve_op(average: bool | None, op: Any) -> Any:
    """Horovod's deprecated ``average=`` flag and ``op=`` to one reduction op (``Average`` when neither is given)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average; please provide only one of them.")
    if op is None:
        op = rt.Average if average is None or average else rt.Sum
    return op


def average_as_prescale(op: Any, gradient_predivide_factor: float) -> tuple[Any, float, float]:
    """(op, prescale, postscale) that average gradients with Horovod's ``gradient_predivide_factor``:
    divide by the factor before the sum and by ``size / factor`` after it. ``op=None`` means Average."""
    op = rt.Average if op is None else op
    if gradient_predivide_factor != 1.0 and op != rt.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == rt.Average:
        return rt.Average, 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return op, 1.0, 1.0


# ---------------------------------------------------------------------------------------------- zero-copy views
ALIGNMENT = 64  # TensorFlow refuses (aborts on) DLPack buffers aligned to less than Eigen's 64 bytes


class DLPackCapsule:
    """Lets ``np.from_dlpack`` (or ``cupy.from_dlpack``) consume a bare DLPack capsule (TF and MXNet hand out
    capsules, NumPy and CuPy want an object with ``__dlpack__``). ``device``: DLPack's (type, id) of the memory,
    (1, 0) for the CPU, (2, N) for CUDA device N."""

    def __init__(self, capsule: Any, device: tuple[int, int] = (1, 0)) -> None:
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def device_view_of_capsule(capsule: Any, device_id: int) -> Any:
    """A CuPy array over the GPU memory a DLPack capsule describes (no copy), for the runtime's device path;
    None when CuPy cannot be used here (the caller stages through host memory instead)."""
    from hpcvod.runtime import gpu
    cupy = gpu.probe()[0]
    if cupy is None:
        return None
    try:
        return cupy.from_dlpack(DLPackCapsule(capsule, (2, device_id)))
    except Exception:  # noqa: BLE001 - an old CuPy or a capsule it refuses: stage instead
        return None


class _WritableInterface:
    """Exposes the memory of a read-only NumPy view as writable, keeping the view (and through it the framework
    tensor that owns the memory) alive for as long as the new array lives."""

    def __init__(self, readonly: np.ndarray) -> None:
        self.__array_interface__ = dict(readonly.__array_interface__, data=(readonly.ctypes.data, False))
        self._owner = readonly


def numpy_view_of_capsule(capsule: Any, writable: bool = False) -> np.ndarray:
    """A NumPy array over the memory a DLPack capsule describes, without copying.

    ``np.from_dlpack`` always returns read-only arrays (NumPy 1.26); ``writable=True`` is for frameworks whose
    tensors are mutable (MXNet NDArray exported with ``to_dlpack_for_write``).
    """
    view = np.from_dlpack(DLPackCapsule(capsule))
    if writable and not view.flags.writeable:
        view = np.asarray(_WritableInterface(view))
    return view


class _RecycledBlocks:
    """Large raw blocks handed out again once nothing references them any more.

    A fresh multi-MiB ``np.empty`` costs a page fault per 4 KiB on first touch (a third of a 50 MB copy's time
    here). Arrays and framework tensors made from a block keep a reference to it (NumPy views hold their base,
    DLPack capsules hold the view), so a block whose only references are this pool's is free to reuse.
    """

    MIN_BYTES = 1 << 20
    KEEP = 4

    def __init__(self) -> None:
        self._blocks: list[np.ndarray] = []
        self._lock = threading.Lock()

    def get(self, nbytes: int) -> np.ndarray:
        if nbytes < self.MIN_BYTES:
            return np.empty(nbytes, dtype=np.uint8)
        with self._lock:
            for i in range(len(self._blocks)):
                # 2 references = the pool's list + getrefcount's argument: nobody else holds the block
                if self._blocks[i].nbytes >= nbytes and sys.getrefcount(self._blocks[i]) == 2:
                    return self._blocks[i]
            block = np.empty(nbytes, dtype=np.uint8)
            self._blocks.append(block)
            if len(self._blocks) > self.KEEP:
                self._blocks.pop(0)
            return block


_blocks = _RecycledBlocks()


def aligned_empty(shape: Sequence[int] | int, dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``ALIGNMENT``-byte boundary (large ones in
    recycled memory)."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = _blocks.get(nbytes + ALIGNMENT)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def is_aligned(array: np.ndarray) -> bool:
    return array.flags.c_contiguous and array.ctypes.data % ALIGNMENT == 0


def pack_aligned(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Copies same-dtype arrays into one aligned flat buffer; returns it and a view of it per array.

    Each view starts on an ``ALIGNMENT`` boundary, so it can leave as a framework tensor without another copy;
    the padding between views is zeroed (it takes part in reductions). One collective on the buffer replaces one
    per array, with a single copy in and none out.
    """
    dtype = arrays[0].dtype
    per = ALIGNMENT // dtype.itemsize if ALIGNMENT % dtype.itemsize == 0 else 1
    offsets, total = [], 0
    for a in arrays:
        if a.dtype != dtype:
            raise ValueError(f"pack_aligned needs one dtype, got {dtype} and {a.dtype}")
        offsets.append(total)
        total += -(-a.size // per) * per
    buffer = aligned_empty(total, dtype)
    views = []
    for a, start in zip(arrays, offsets):
        end = start + a.size
        view = buffer[start:end].reshape(a.shape)
        np.copyto(view, a)
        padded_end = start + -(-a.size // per) * per
        buffer[end:padded_end] = 0
        views.append(view)
    return buffer, views


# ---------------------------------------------------------------------------------------------- handles
class HandleTable:
    """Integer handles (what Horovod's framework APIs return) for pending runtime operations.

    Each entry holds the runtime handle(s), a ``finish`` function that turns the runtime's output(s) into the
    framework's result, and references that must stay alive until the runtime is done (input tensors whose memory
    the runtime reads or writes).
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Any, Callable[[Any], Any], Any]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, runtime_handle: Any, finish: Callable[[Any], Any], keepalive: Any = None) -> int:
        with self._lock:
            handle = next(self._ids)
            self._entries[handle] = (runtime_handle, finish, keepalive)
        return handle

    def _entry(self, handle: int) -> tuple[Any, Callable[[Any], Any], Any]:
        try:
            return self._entries[handle]
        except KeyError:
            raise ValueError(f"unknown or already synchronized handle: {handle!r}") from None

    def poll(self, handle: int) -> bool:
        runtime_handle, _, _ = self._entry(handle)
        if isinstance(runtime_handle, list):
            return all(rt.poll(h) for h in runtime_handle)
        return bool(rt.poll(runtime_handle))

    def synchronize(self, handle: int) -> Any:
        runtime_handle, finish, _ = self._entry(handle)
        try:
            if isinstance(runtime_handle, list):
                output = [rt.synchronize(h) for h in runtime_handle]
            else:
                output = rt.synchronize(runtime_handle)
        finally:
            with self._lock:
                self._entries.pop(handle, None)
        return finish(output)
