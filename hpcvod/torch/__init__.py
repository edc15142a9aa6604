"""``import hpcvod.torch as hvd``: Horovod's PyTorch API (see docs/frameworks.md, docs/drop-in.md)."""

from hpcvod.frameworks.torch import *  # noqa: F401,F403
from hpcvod.frameworks.torch import __all__, __getattr__  # noqa: F401  (reduction ops, lazily)
# Horovod's submodules are attributes of the package too (``hvd.mpi_ops._basics``, ``hvd.compression``)
from . import compression, elastic, functions, mpi_ops, optimizer, sync_batch_norm  # noqa: E402,F401
