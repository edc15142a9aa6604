"""``import hpcvod.tensorflow as hvd``: Horovod's TensorFlow 2 API (docs/frameworks.md, docs/drop-in.md)."""

from hpcvod.frameworks.tensorflow import *  # noqa: F401,F403
from hpcvod.frameworks.tensorflow import __all__, __getattr__  # noqa: F401  (reduction ops, lazily)
# Horovod's submodules are attributes of the package too (``hvd.mpi_ops._basics``, ``hvd.compression``);
# not sync_batch_norm, which imports Keras (``hvd.SyncBatchNormalization`` loads it on first use)
from . import compression, elastic, functions, mpi_ops, util  # noqa: E402,F401
