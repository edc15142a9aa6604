"""Horovod's ``horovod.mxnet.functions``."""

from hpcvod.frameworks.mxnet.functions import allgather_object, broadcast_object

__all__ = ["allgather_object", "broadcast_object"]
