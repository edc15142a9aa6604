"""``SyncBatchNormalization``: Keras 3 batch normalization whose training statistics cover every rank's batch."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

import hpcvod.runtime as rt
from hpcvod.frameworks.tensorflow import mpi_ops


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Horovod's ``SyncBatchNormalization`` on Keras 3: in training, the batch mean and variance are those of the
    global batch (every rank's mean and mean of squares averaged with one differentiable allreduce, as Horovod
    does: equal weight per rank). Inference uses the moving statistics, as in Keras.

    ``fused`` is Horovod's argument: it must be False (the default), as in Horovod; Keras 3 has no fused kernel,
    so it is not passed on. Without ``name`` Keras names the layer ``sync_batch_normalization`` (made unique per
    model, where Horovod gives every such layer that same name).
    """

    def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        mean, variance = super()._moments(inputs, mask)
        size = rt.size()
        if size == 1:
            return mean, variance
        # Var[X] = E[X^2] - E[X]^2 over the global batch
        stacked = tf.stack([mean, variance + tf.math.square(mean)])
        group = mpi_ops.allreduce(stacked, op=rt.Sum) / tf.cast(size, stacked.dtype)
        group_mean, group_mean_of_square = tf.unstack(group)
        return group_mean, group_mean_of_square - tf.math.square(group_mean)
