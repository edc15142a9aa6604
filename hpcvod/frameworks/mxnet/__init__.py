"""Horovod's ``horovod.mxnet`` API for MXNet 1.9 (public import point: ``import hpcvod.mxnet as hvd``).

Importing it applies the ``np.bool`` alias MXNet 1.9.1 needs with NumPy >= 1.24 before importing MXNet.
"""

from types import ModuleType as _ModuleType
from typing import Any as _Any

from hpcvod.frameworks._common import lazy_runtime_attribute as _lazy_runtime_attribute
from hpcvod.frameworks._common import runtime_basics as _runtime_basics

globals().update(_runtime_basics())

from hpcvod.frameworks.mxnet.compression import Compression, Compressor  # noqa: E402
from hpcvod.frameworks.mxnet.functions import (  # noqa: E402
    allgather_object, broadcast_object, broadcast_parameters,
)
from hpcvod.frameworks.mxnet.mpi_ops import (  # noqa: E402
    allgather, allreduce, allreduce_, alltoall, barrier, broadcast, broadcast_, grouped_allgather,
    grouped_allreduce, grouped_allreduce_, grouped_reducescatter, join, reducescatter,
)
from hpcvod.frameworks.mxnet.optimizer import DistributedOptimizer, DistributedTrainer  # noqa: E402


def __getattr__(name: str) -> _Any:
    """``Average``, ``Sum``... come from the runtime on first use (importing them initialises MPI)."""
    return _lazy_runtime_attribute(__name__, name)


__all__ = sorted(k for k, v in globals().items() if not k.startswith("_") and not isinstance(v, _ModuleType))
