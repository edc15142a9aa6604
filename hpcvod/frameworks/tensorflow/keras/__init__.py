"""Horovod's ``horovod.tensorflow.keras`` / ``horovod.keras`` API for Keras 3 on TensorFlow (public import points:
``import hpcvod.tensorflow.keras as hvd`` and ``import hpcvod.keras as hvd``)."""

from __future__ import annotations

import os as _os
from types import ModuleType as _ModuleType
from typing import Any as _Any

if _os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
    raise ImportError(f"hpcvod's Keras wrappers need Keras's TensorFlow backend, but KERAS_BACKEND="
                      f"{_os.environ['KERAS_BACKEND']!r}; for Keras on torch use hpcvod.torch")

import keras as _keras  # noqa: E402

from hpcvod.frameworks._common import lazy_runtime_attribute as _lazy_runtime_attribute
from hpcvod.frameworks._common import runtime_basics as _runtime_basics  # noqa: E402

globals().update(_runtime_basics())

from hpcvod.frameworks.tensorflow.compression import Compression, Compressor  # noqa: E402,F401
from hpcvod.frameworks.tensorflow.functions import (  # noqa: E402,F401
    allgather_object, broadcast_object, broadcast_variables,
)
from hpcvod.frameworks.tensorflow.keras import callbacks  # noqa: E402,F401
from hpcvod.frameworks.tensorflow.keras.optimizer import DistributedOptimizer  # noqa: E402,F401
from hpcvod.frameworks.tensorflow.mpi_ops import (  # noqa: E402,F401
    allgather, allreduce, alltoall, barrier, broadcast, grouped_allreduce, join, reducescatter,
)


def load_model(filepath: str, custom_optimizers: list[type] | None = None, custom_objects: dict | None = None,
               compression: type[Compressor] = Compression.none, **kwargs: _Any) -> _Any:
    """``keras.models.load_model`` whose compiled optimizer (with its restored state) is made distributed.

    ``custom_optimizers`` are optimizer classes the file refers to (added to ``custom_objects`` by class name);
    ``kwargs`` go to ``DistributedOptimizer``.
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects[cls.__name__] = cls
    model = _keras.models.load_model(filepath, custom_objects=objects)
    if getattr(model, "optimizer", None) is not None and not hasattr(model.optimizer, "_hvd"):
        DistributedOptimizer(model.optimizer, compression=compression, **kwargs)
    return model


def __getattr__(name: str) -> _Any:
    """``Average``, ``Sum``... come from the runtime on first use (importing them initialises MPI)."""
    return _lazy_runtime_attribute(__name__, name)


__all__ = sorted(k for k, v in globals().items()
                 if not k.startswith("_") and (not isinstance(v, _ModuleType) or k == "callbacks")
                 and k != "annotations")
