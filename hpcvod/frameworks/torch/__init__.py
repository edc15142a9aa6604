"""Horovod's ``horovod.torch`` API on hpcvod's runtime (public import point: ``import hpcvod.torch as hvd``)."""

from types import ModuleType as _ModuleType
from typing import Any as _Any

from hpcvod.frameworks._common import lazy_runtime_attribute as _lazy_runtime_attribute
from hpcvod.frameworks._common import runtime_basics as _runtime_basics

globals().update(_runtime_basics())

from hpcvod.frameworks.torch.compression import Compression, Compressor  # noqa: E402
from hpcvod.frameworks.torch.functions import (  # noqa: E402
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
)
from hpcvod.frameworks.torch.mpi_ops import (  # noqa: E402
    allgather, allgather_async, allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async,
    barrier, broadcast, broadcast_, broadcast_async, broadcast_async_, grouped_allgather, grouped_allgather_async,
    grouped_allreduce, grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
    grouped_reducescatter_async, join, poll, reducescatter, reducescatter_async, sparse_allreduce_async, synchronize,
)
from hpcvod.frameworks.torch.optimizer import DistributedOptimizer  # noqa: E402
from hpcvod.frameworks.torch.sync_batch_norm import SyncBatchNorm  # noqa: E402


def __getattr__(name: str) -> _Any:
    """``Average``, ``Sum``... come from the runtime on first use (importing them initialises MPI)."""
    return _lazy_runtime_attribute(__name__, name)


__all__ = sorted(k for k, v in globals().items() if not k.startswith("_") and not isinstance(v, _ModuleType))
