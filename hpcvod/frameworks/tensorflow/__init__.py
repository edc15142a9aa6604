"""Horovod's ``horovod.tensorflow`` API for TensorFlow 2 (public import point: ``import hpcvod.tensorflow as hvd``).

TF v1 graph mode through ``tf.compat.v1`` (``BroadcastGlobalVariablesHook``, ``broadcast_global_variables``,
``tf.compat.v1.train`` optimizers in ``DistributedOptimizer``) is in compat_v1.py.
"""

from __future__ import annotations

from types import ModuleType as _ModuleType
from typing import Any as _Any

from hpcvod.frameworks._common import lazy_runtime_attribute as _lazy_runtime_attribute
from hpcvod.frameworks._common import runtime_basics as _runtime_basics

globals().update(_runtime_basics())

from hpcvod.frameworks.tensorflow import compat_v1 as _compat_v1  # noqa: E402
from hpcvod.frameworks.tensorflow.compat_v1 import (  # noqa: E402,F401
    BroadcastGlobalVariablesHook, broadcast_global_variables,
)
from hpcvod.frameworks.tensorflow.compression import Compression, Compressor  # noqa: E402,F401
from hpcvod.frameworks.tensorflow.functions import (  # noqa: E402,F401
    allgather_object, broadcast_, broadcast_object, broadcast_object_fn, broadcast_variables,
)
from hpcvod.frameworks.tensorflow.gradient_tape import (  # noqa: E402,F401
    DistributedGradientTape, PartialDistributedGradientTape,
)
from hpcvod.frameworks.tensorflow.mpi_ops import (  # noqa: E402,F401
    allgather, allreduce, alltoall, barrier, broadcast, grouped_allgather, grouped_allreduce,
    grouped_reducescatter, join, local_rank_op, local_size_op, process_set_included_op, rank_op, reducescatter,
    size_op,
)


def DistributedOptimizer(optimizer: _Any, name: str | None = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "", compression: _Any = Compression.none,
                         sparse_as_dense: bool = False, backward_passes_per_step: int = 1, op: _Any = None,
                         gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups: _Any = None, process_set: _Any = None,
                         scale_local_gradients: bool = True) -> _Any:
    """Horovod's ``horovod.tensorflow.DistributedOptimizer`` signature for a Keras 3 optimizer: the Keras
    ``DistributedOptimizer`` (Horovod does the same for Keras optimizers); for a ``tf.compat.v1.train``
    optimizer the TF v1 graph-mode wrapper (compat_v1.py), where ``use_locking`` applies."""
    process_set = global_process_set if process_set is None else process_set  # noqa: F821 (runtime basics)
    if _compat_v1.is_legacy_optimizer(optimizer):
        return _compat_v1.DistributedOptimizer(
            optimizer, name=name, use_locking=use_locking, compression=compression, sparse_as_dense=sparse_as_dense,
            backward_passes_per_step=backward_passes_per_step, op=op,
            gradient_predivide_factor=gradient_predivide_factor,
            average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients)
    from hpcvod.frameworks.tensorflow.keras.optimizer import DistributedOptimizer as keras_distributed_optimizer
    return keras_distributed_optimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)


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
