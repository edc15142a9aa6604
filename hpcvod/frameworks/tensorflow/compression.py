"""Gradient compression for TensorFlow tensors (Horovod's ``hvd.Compression``). The classes are the runtime's
(hpcvod/runtime/compression.py); only how a TensorFlow tensor tells and changes its dtype is here."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hpcvod.runtime.compression import Compressor, NoneCompressor
from hpcvod.runtime.compression import FP16Compressor as _FP16Compressor


class FP16Compressor(_FP16Compressor):
    """Sends floating-point tensors as float16 (half the bytes); other dtypes pass unchanged."""

    half = tf.float16

    @staticmethod
    def is_floating(tensor: tf.Tensor) -> bool:
        return tensor.dtype.is_floating

    @staticmethod
    def cast(tensor: tf.Tensor, dtype: Any) -> tf.Tensor:
        return tf.cast(tensor, dtype)


class Compression:
    """``Compression.none`` and ``Compression.fp16``, as in Horovod."""

    none = NoneCompressor
    fp16 = FP16Compressor


__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
