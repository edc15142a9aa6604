"""Horovod's ``horovod.tensorflow`` API for TensorFlow 2 (public import point: ``import hpcvod.tensorflow as hvd``).

TF1 graph-mode pieces (``BroadcastGlobalVariablesHook``, ``broadcast_global_variables``, ``tf.compat.v1``
optimizers) are not provided: docs/drop-in.md.
"""

from __future__ import annotations

from types import ModuleType as _ModuleType
from typing import Any as _Any

from hpcvod.frameworks._common import lazy_runtime_attribute as _lazy_runtime_attribute
from hpcvod.frameworks._common import runtime_basics as _runtime_basics

globals().update(_runtime_basics())

from hpcvod.frameworks.tensorflow.compression import Compression, Compressor  # noqa: E402,F401
from hpcvod.frameworks.tensorflow.functions import (  # noqa: E402,F401
    allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables,
)
from hpcvod.frameworks.tensorflow.gradient_tape import (  # noqa: E402,F401
    DistributedGradientTape, PartialDistributedGradientTape,
)
from hpcvod.frameworks.tensorflow.mpi_ops import (  # noqa: E402,F401
    allgather, allreduce, alltoall, barrier, broadcast, broadcast_, grouped_allgather, grouped_allreduce,
    grouped_reducescatter, join, local_rank_op, local_size_op, rank_op, reducescatter, size_op,
)


def DistributedOptimizer(optimizer: _Any, *args: _Any, **kwargs: _Any) -> _Any:
    """For a Keras 3 optimizer: ``hpcvod.tensorflow.keras.DistributedOptimizer`` (Horovod does the same)."""
    from hpcvod.frameworks.tensorflow.keras.optimizer import DistributedOptimizer as keras_distributed_optimizer
    return keras_distributed_optimizer(optimizer, *args, **kwargs)


def __getattr__(name: str) -> _Any:
    """``Average``, ``Sum``... come from the runtime on first use (importing them initialises MPI);
    ``SyncBatchNormalization`` imports Keras, so it too comes on first use."""
    if name == "SyncBatchNormalization":
        from hpcvod.frameworks.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    return _lazy_runtime_attribute(__name__, name)


# (not SyncBatchNormalization: a star import would fetch it, and so import Keras, at once)
__all__ = sorted(k for k, v in globals().items()
                 if not k.startswith("_") and not isinstance(v, _ModuleType) and k != "annotations")
