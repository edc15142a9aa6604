"""Horovod's ``horovod.keras.elastic``: ``KerasState``, the state callbacks and ``run`` (which refuses: only
PyTorch has elastic training so far, docs/elastic.md)."""

from hpcvod.tensorflow.keras.elastic import *  # noqa: F401,F403
from hpcvod.tensorflow.keras.elastic import __all__  # noqa: F401
