"""A CPU stand-in for CuPy (tests only; see ../README.md): host NumPy arrays that claim to be CUDA memory."""

from __future__ import annotations

from typing import Any

import numpy as _np

from . import cuda  # noqa: F401  (cupy.cuda, cupy.cuda.nccl)

__version__ = "0.0-cpu-stand-in"


class _Data:
    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class ndarray(_np.ndarray):
    """A NumPy array that reports itself as CUDA memory, with CuPy's ``.data.ptr``, ``set`` and ``get``."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)           # kDLCUDA

    @property
    def data(self) -> _Data:    # type: ignore[override]
        return _Data(self.__array_interface__["data"][0])

    def set(self, arr: Any) -> None:
        _np.copyto(_np.asarray(self), _np.asarray(arr), casting="unsafe")

    def get(self) -> _np.ndarray:
        return _np.array(_np.asarray(self))

    def toDlpack(self) -> Any:
        """A DLPack capsule of a copy in a 256-byte-aligned block (CuPy's allocations are; TensorFlow needs 64).
        It says CPU: the consumer is a CPU framework standing in for its GPU build."""
        raw = _np.empty(self.nbytes + 256, _np.uint8)
        start = -raw.ctypes.data % 256
        aligned = raw[start:start + self.nbytes].view(self.dtype).reshape(self.shape)
        _np.copyto(aligned, _np.asarray(self))
        return aligned.__dlpack__()


def _wrap(x: Any) -> Any:
    if isinstance(x, _np.ndarray) and not isinstance(x, ndarray):
        return x.view(ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_wrap(v) for v in x)
    return x


def asarray(x: Any, dtype: Any = None) -> ndarray:
    return _wrap(_np.asarray(x, dtype=dtype))


def asnumpy(x: Any) -> _np.ndarray:
    return _np.array(_np.asarray(x))


def from_dlpack(x: Any) -> ndarray:
    """Its own arrays as they are; another framework's CPU tensor (standing in for a GPU one) as a view."""
    if isinstance(x, ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return _np.from_dlpack(x).view(ndarray)
    raise TypeError("the CPU stand-in only views its own arrays and DLPack exporters")


def __getattr__(name: str) -> Any:
    """Everything else is NumPy's, with array results turned into stand-in device arrays."""
    attr = getattr(_np, name)
    if callable(attr) and not isinstance(attr, type):
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return _wrap(attr(*args, **kwargs))
        return wrapped
    return attr
