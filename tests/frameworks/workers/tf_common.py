"""Set-up shared by the TensorFlow check workers (tf_worker.py, tf_gradients_worker.py, tf_semantics_worker.py)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hpcvod.tensorflow as hvd  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)
hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def rank_data(r: int, shape, dtype=np.float32) -> np.ndarray:
    """Rank ``r``'s test data (every rank can compute every other rank's): floats in [-2, 2), integers in
    [-50, 50)."""
    rng = np.random.default_rng(1000 + r)
    if np.issubdtype(dtype, np.floating):
        return (rng.random(shape) * 4 - 2).astype(dtype)
    return rng.integers(-50, 50, shape).astype(dtype)
