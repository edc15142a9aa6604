"""Gradient compression for torch tensors (Horovod's ``hvd.Compression``): compress before the allreduce,
decompress after it. A custom compressor is any class with the two static methods of ``Compressor``. The classes
are the runtime's (hpcvod/runtime/compression.py); only how a torch tensor tells and changes its dtype is here."""

from __future__ import annotations

from typing import Any

import torch

from hpcvod.runtime.compression import Compressor, NoneCompressor
from hpcvod.runtime.compression import FP16Compressor as _FP16Compressor


class FP16Compressor(_FP16Compressor):
    """Sends floating-point tensors as float16 (half the bytes); other dtypes pass unchanged."""

    half = torch.float16

    @staticmethod
    def is_floating(tensor: torch.Tensor) -> bool:
        return tensor.dtype.is_floating_point

    @staticmethod
    def cast(tensor: torch.Tensor, dtype: Any) -> torch.Tensor:
        return tensor.to(dtype)


class Compression:
    """``Compression.none`` and ``Compression.fp16``, as in Horovod."""

    none = NoneCompressor
    fp16 = FP16Compressor


__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
