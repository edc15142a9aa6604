"""Horovod's ``horovod.torch.optimizer``."""

from hpcvod.frameworks.torch.optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer"]
