"""``import hpcvod.tensorflow as hvd``: Horovod's TensorFlow 2 API (docs/frameworks.md, docs/drop-in.md)."""

from hpcvod.frameworks.tensorflow import *  # noqa: F401,F403
from hpcvod.frameworks.tensorflow import __all__, __getattr__  # noqa: F401  (reduction ops, lazily)
