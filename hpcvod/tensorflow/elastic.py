"""Horovod's ``horovod.tensorflow.elastic`` (``hvd.elastic``): ``run``, ``TensorFlowState``, ``TensorFlowKerasState``
(hpcvod/frameworks/tensorflow/elastic.py; docs/elastic.md)."""

from hpcvod.frameworks.tensorflow.elastic import *  # noqa: F401,F403
from hpcvod.frameworks.tensorflow.elastic import __all__, __getattr__  # noqa: F401  (TensorFlowKerasState, lazily)
