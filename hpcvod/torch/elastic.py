"""Horovod's ``horovod.torch.elastic`` (``hvd.elastic``): ``run``, ``TorchState``, ``ElasticSampler`` and the state
classes (hpcvod/frameworks/torch/elastic.py; docs/elastic.md)."""

from hpcvod.frameworks.torch.elastic import *  # noqa: F401,F403
from hpcvod.frameworks.torch.elastic import __all__  # noqa: F401
