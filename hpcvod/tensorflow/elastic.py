"""Horovod's ``horovod.tensorflow.elastic`` (``hvd.elastic``): ``run``, ``TensorFlowState``, ``TensorFlowKerasState``
(hpcvod/frameworks/tensorflow/elastic.py; docs/elastic.md)."""

from typing import Any

from hpcvod.frameworks.tensorflow.elastic import *  # noqa: F401,F403
from hpcvod.frameworks.tensorflow.elastic import __all__  # noqa: F401


def __getattr__(name: str) -> Any:
    """``TensorFlowKerasState``, on first use: it imports Keras, which ``hpcvod.tensorflow`` does not need."""
    if name != "TensorFlowKerasState":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from hpcvod.frameworks.tensorflow.keras.elastic import TensorFlowKerasState

    globals()[name] = TensorFlowKerasState
    return TensorFlowKerasState
