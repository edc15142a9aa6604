"""Horovod's ``horovod.tensorflow.sync_batch_norm`` (imports Keras)."""

from hpcvod.frameworks.tensorflow.sync_batch_norm import SyncBatchNormalization

__all__ = ["SyncBatchNormalization"]
