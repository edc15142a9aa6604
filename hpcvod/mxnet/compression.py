"""Horovod's ``horovod.mxnet.compression``."""

from hpcvod.frameworks.mxnet.compression import Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
