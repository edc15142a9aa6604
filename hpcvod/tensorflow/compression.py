"""Horovod's ``horovod.tensorflow.compression``."""

from hpcvod.frameworks.tensorflow.compression import Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
