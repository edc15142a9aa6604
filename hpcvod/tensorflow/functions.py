"""Horovod's ``horovod.tensorflow.functions``."""

from hpcvod.frameworks.tensorflow import (
    allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables,
)

__all__ = ["allgather_object", "broadcast_object", "broadcast_object_fn", "broadcast_variables"]
