"""Horovod's ``horovod.torch.functions``."""

from hpcvod.frameworks.torch.functions import (
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
)

__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]
