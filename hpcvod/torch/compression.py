"""Horovod's ``horovod.torch.compression``."""

from hpcvod.frameworks.torch.compression import Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
