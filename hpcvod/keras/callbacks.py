"""Horovod's ``horovod.keras.callbacks``: the same callbacks as ``hpcvod.tensorflow.keras.callbacks``."""

from hpcvod.tensorflow.keras.callbacks import *  # noqa: F401,F403
from hpcvod.tensorflow.keras.callbacks import __all__  # noqa: F401
