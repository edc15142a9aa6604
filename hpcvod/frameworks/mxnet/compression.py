"""Gradient compression for MXNet NDArrays (Horovod's ``hvd.Compression``). The classes are the runtime's
(hpcvod/runtime/compression.py); only how an NDArray tells its dtype (a NumPy type, not a dtype) is here."""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcvod.frameworks.mxnet._mx import mx
from hpcvod.runtime.compression import Compressor, NoneCompressor
from hpcvod.runtime.compression import FP16Compressor as _FP16Compressor


class FP16Compressor(_FP16Compressor):
    """Sends floating-point tensors as float16 (half the bytes); other dtypes pass unchanged."""

    half = np.float16

    @staticmethod
    def is_floating(tensor: mx.nd.NDArray) -> bool:
        return bool(np.issubdtype(tensor.dtype, np.floating))

    @staticmethod
    def cast(tensor: mx.nd.NDArray, dtype: Any) -> mx.nd.NDArray:
        return tensor.astype(dtype)


class Compression:
    """``Compression.none`` and ``Compression.fp16``, as in Horovod."""

    none = NoneCompressor
    fp16 = FP16Compressor


__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
