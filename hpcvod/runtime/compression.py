"""Gradient compression for allreduce (Horovod's ``Compression.none`` / ``Compression.fp16``)."""

from __future__ import annotations

from typing import Any

import numpy as np


class Compressor:
    """Compress a tensor before communication and restore it afterwards."""

    @staticmethod
    def compress(tensor: np.ndarray) -> tuple[np.ndarray, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: np.ndarray, ctx: Any) -> np.ndarray:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor: np.ndarray) -> tuple[np.ndarray, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: np.ndarray, ctx: Any) -> np.ndarray:
        return tensor


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 (halves the bytes); other dtypes pass unchanged.

    The frameworks' own (hpcvod.torch/tensorflow/mxnet's ``Compression.fp16``) are subclasses that only say how
    their tensors tell and change their dtype: ``half``, ``is_floating`` and ``cast``. These are NumPy's and
    CuPy's."""

    half: Any = np.float16

    @staticmethod
    def is_floating(tensor: Any) -> bool:
        return tensor.dtype.kind == "f"

    @staticmethod
    def cast(tensor: Any, dtype: Any) -> Any:
        return tensor.astype(dtype)

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        if cls.is_floating(tensor) and tensor.dtype != cls.half:
            return cls.cast(tensor, cls.half), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        return tensor if ctx is None else cls.cast(tensor, ctx)


class Compression:
    """The compression algorithms an allreduce accepts."""

    none = NoneCompressor
    fp16 = FP16Compressor
