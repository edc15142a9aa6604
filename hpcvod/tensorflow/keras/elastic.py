"""Horovod's ``horovod.tensorflow.keras.elastic``: ``KerasState``, the state callbacks and ``run`` (which refuses: only
PyTorch has elastic training so far, docs/elastic.md)."""

from hpcvod.frameworks.tensorflow.keras.elastic import *  # noqa: F401,F403
from hpcvod.frameworks.tensorflow.keras.elastic import __all__  # noqa: F401
