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
    """Send floating-point tensors as float16 (halves the bytes); other dtypes pass unchanged."""

    @staticmethod
    def compress(tensor: np.ndarray) -> tuple[np.ndarray, Any]:
        if tensor.dtype.kind == "f" and tensor.dtype != np.float16:
            return tensor.astype(np.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: np.ndarray, ctx: Any) -> np.ndarray:
        return tensor if ctx is None else tensor.astype(ctx)


class Compression:
    """The compression algorithms an allreduce accepts."""

    none = NoneCompressor
    fp16 = FP16Compressor
