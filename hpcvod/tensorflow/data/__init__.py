"""``hpcvod.tensorflow.data``: the tf.data service compute job (Horovod's ``horovod.tensorflow.data``)."""
