"""Imports MXNet 1.9 beside NumPy >= 1.24: MXNet still reads ``np.bool``, which NumPy 1.24 removed."""

import numpy as np

if "bool" not in np.__dict__:
    np.bool = bool  # the alias MXNet 1.9.1 expects (docs/measured.md); NumPy 2 has it again

import mxnet as mx  # noqa: E402

__all__ = ["mx"]
