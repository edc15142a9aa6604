"""Horovod's ``horovod.torch.sync_batch_norm``."""

from hpcvod.frameworks.torch.sync_batch_norm import SyncBatchNorm

__all__ = ["SyncBatchNorm"]
