"""Gradient compression for MXNet NDArrays (Horovod's ``hvd.Compression``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcvod.frameworks.mxnet._mx import mx


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx) -> tensor``."""

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> tuple[mx.nd.NDArray, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any) -> mx.nd.NDArray:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> tuple[mx.nd.NDArray, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any) -> mx.nd.NDArray:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16; other dtypes pass unchanged."""

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> tuple[mx.nd.NDArray, Any]:
        if np.issubdtype(tensor.dtype, np.floating) and tensor.dtype != np.float16:
            return tensor.astype(np.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any) -> mx.nd.NDArray:
        return tensor if ctx is None else tensor.astype(ctx)


class Compression:
    """``Compression.none`` and ``Compression.fp16``, as in Horovod."""

    none = NoneCompressor
    fp16 = FP16Compressor
