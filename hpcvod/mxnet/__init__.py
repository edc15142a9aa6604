"""``import hpcvod.mxnet as hvd``: Horovod's MXNet API (docs/frameworks.md, docs/drop-in.md)."""

from hpcvod.frameworks.mxnet import *  # noqa: F401,F403
from hpcvod.frameworks.mxnet import __all__, __getattr__  # noqa: F401  (reduction ops, lazily)
# Horovod's submodules are attributes of the package too (``hvd.mpi_ops._basics``, ``hvd.compression``)
from . import compression, functions, mpi_ops  # noqa: E402,F401
