"""Horovod's ``horovod.tensorflow.util``: the one helper Horovod's TensorFlow tests import from it."""

import tensorflow as tf


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs eagerly here (False inside a ``tf.function`` or a TF1 graph)."""
    return tf.executing_eagerly()
