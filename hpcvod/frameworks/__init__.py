"""Framework wrappers over ``hpcvod.runtime``: ``hpcvod.frameworks.torch``, ``.tensorflow`` (with ``.keras``) and
``.mxnet``. Users import them through the short names ``hpcvod.torch``, ``hpcvod.tensorflow``,
``hpcvod.tensorflow.keras`` / ``hpcvod.keras`` and ``hpcvod.mxnet``."""
