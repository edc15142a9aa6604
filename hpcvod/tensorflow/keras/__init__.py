"""``import hpcvod.tensorflow.keras as hvd``: Horovod's Keras API for Keras 3 on TensorFlow (docs/frameworks.md)."""

from hpcvod.frameworks.tensorflow.keras import *  # noqa: F401,F403
from hpcvod.frameworks.tensorflow.keras import __all__, __getattr__  # noqa: F401  (reduction ops, lazily)
from . import callbacks, elastic  # noqa: F401,E402  (the module paths horovod.*.keras.callbacks and .elastic)
