"""Horovod's ``horovod.tensorflow.keras`` / ``horovod.keras`` API for Keras 3 on TensorFlow (public import points:
``import hpcvod.tensorflow.keras as hvd`` and ``import hpcvod.keras as hvd``)."""

from __future__ import annotations

import json as _json
import os as _os
import sys as _sys
import zipfile as _zipfile
from types import ModuleType as _ModuleType
from typing import Any as _Any

if _os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
    raise ImportError(f"hpcvod's Keras wrappers need Keras's TensorFlow backend, but KERAS_BACKEND="
                      f"{_os.environ['KERAS_BACKEND']!r}; for Keras on torch use hpcvod.torch")

import keras as _keras  # noqa: E402
import tensorflow as _tf  # noqa: E402

from hpcvod.frameworks._common import lazy_runtime_attribute as _lazy_runtime_attribute
from hpcvod.frameworks._common import runtime_basics as _runtime_basics  # noqa: E402

globals().update(_runtime_basics())

from hpcvod.frameworks.tensorflow.compression import Compression, Compressor  # noqa: E402,F401
from hpcvod.frameworks.tensorflow.keras._keras2_compile import (  # noqa: E402
    accept_keras2_compile_arguments as _accept_keras2_compile_arguments,
)

_accept_keras2_compile_arguments()
from hpcvod.frameworks.tensorflow.functions import (  # noqa: E402,F401
    allgather_object, broadcast_object, broadcast_variables,
)
from hpcvod.frameworks.tensorflow.keras import callbacks, elastic  # noqa: E402,F401
from hpcvod.frameworks.tensorflow.keras.optimizer import DistributedOptimizer  # noqa: E402,F401
from hpcvod.frameworks.tensorflow import mpi_ops as _ops  # noqa: E402
from hpcvod.frameworks.tensorflow.mpi_ops import alltoall, barrier, grouped_allreduce, join  # noqa: E402,F401


# Horovod's Keras collectives take a value (array, list, tensor) and ``name`` second, unlike horovod.tensorflow's.
def allreduce(value: _Any, name: str | None = None, average: bool | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: _Any = None,
              compression: type[Compressor] = Compression.none) -> _Any:
    """Reduces a tensor-compatible value over all ranks (default: average)."""
    return _ops.allreduce(_tf.convert_to_tensor(value), average=average, compression=compression, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name)


def allgather(value: _Any, name: str | None = None) -> _Any:
    """Concatenates every rank's value along the first dimension."""
    return _ops.allgather(_tf.convert_to_tensor(value), name=name)


def broadcast(value: _Any, root_rank: int, name: str | None = None) -> _Any:
    """Returns ``root_rank``'s value on every rank."""
    return _ops.broadcast(_tf.convert_to_tensor(value), root_rank, name=name)


def reducescatter(value: _Any, name: str | None = None, op: _Any = None) -> _Any:
    """Reduces a value over all ranks (default: average) and returns this rank's part of the first dimension."""
    return _ops.reducescatter(_tf.convert_to_tensor(value), op=op, name=name)


def PartialDistributedOptimizer(optimizer: _Any, name: str | None = None, device_dense: str = "",
                                device_sparse: str = "", compression: type[Compressor] = Compression.none,
                                sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                                op: _Any = None, backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False, groups: _Any = None,
                                process_set: _Any = global_process_set, local_layers: _Any = None,
                                scale_local_gradients: bool = True) -> _Any:
    """A ``DistributedOptimizer`` that leaves the gradients of ``local_layers``' weights local (Horovod's
    ``horovod.keras.PartialDistributedOptimizer``)."""
    opt = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                               gradient_predivide_factor, op, backward_passes_per_step,
                               average_aggregated_gradients, groups=groups, process_set=process_set,
                               scale_local_gradients=scale_local_gradients)
    layers = [] if local_layers is None else (
        local_layers if isinstance(local_layers, (list, tuple)) else [local_layers])
    for layer in layers:
        for weight in layer.trainable_weights:
            opt.register_local_var(weight)
    return opt


def __getattr__(name: str) -> _Any:
    """``Average``, ``Sum``... come from the runtime on first use (importing them initialises MPI);
    ``SyncBatchNormalization`` likewise (Horovod's is in ``horovod.tensorflow``; found here too)."""
    if name == "SyncBatchNormalization":
        from hpcvod.frameworks.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    return _lazy_runtime_attribute(__name__, name)


def _saved_optimizer_class_name(filepath: str) -> str | None:
    """The class name of the compiled optimizer in a Keras 3 ``.keras`` file (None for other files)."""
    try:
        with _zipfile.ZipFile(filepath) as archive:
            config = _json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, _zipfile.BadZipFile):
        return None
    optimizer = (config.get("compile_config") or {}).get("optimizer")
    return optimizer.get("class_name") if isinstance(optimizer, dict) else None


def _optimizer_factory_class(name: str, factory: _Any) -> type:
    """Keras 3 builds a custom object through its ``from_config``; Keras 2 called it with the config's keyword
    arguments, so Horovod's ``custom_objects={'Opt': lambda **kw: hvd.DistributedOptimizer(Opt(**kw))}`` was a
    function. This class gives such a function the ``from_config`` Keras 3 asks for."""
    return type(name, (), {"from_config": classmethod(lambda cls, config, custom_objects=None: factory(**config))})


def load_model(filepath: str, custom_optimizers: list[type] | None = None, custom_objects: dict | None = None,
               compression: type[Compressor] = Compression.none, legacy_opts: bool = False, **kwargs: _Any) -> _Any:
    """``keras.models.load_model`` whose compiled optimizer (with its restored state) is made distributed.

    ``custom_optimizers`` are optimizer classes the file refers to (added to ``custom_objects`` by class name);
    ``kwargs`` go to ``DistributedOptimizer``. A ``custom_objects`` entry for the optimizer may be a function of
    the optimizer's config (Horovod's Keras 2 form) returning a (distributed) optimizer. ``legacy_opts`` (Keras
    2's legacy optimizers) is accepted and has no effect: Keras 3 has only its own optimizers.
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects[cls.__name__] = cls
    optimizer_name = _saved_optimizer_class_name(filepath)
    factory = objects.get(optimizer_name) if optimizer_name else None
    if callable(factory) and not isinstance(factory, type) and not hasattr(factory, "from_config"):
        objects[optimizer_name] = _optimizer_factory_class(optimizer_name, factory)
    model = _keras.models.load_model(filepath, custom_objects=objects)
    if getattr(model, "optimizer", None) is not None and not hasattr(model.optimizer, "_hvd"):
        DistributedOptimizer(model.optimizer, compression=compression, **kwargs)
    return model


__all__ = sorted(k for k, v in globals().items()
                 if not k.startswith("_") and (not isinstance(v, _ModuleType) or k in ("callbacks", "elastic"))
                 and k != "annotations")
