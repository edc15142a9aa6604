"""``from hpcvod.tensorflow.data.compute_service import TfDataServiceConfig, tf_data_service``: the training side
of the tf.data service compute job; importing it adds ``tf.data.Dataset.send_to_data_service`` (as Horovod does)."""

from hpcvod.frameworks.tensorflow.data_service import (  # noqa: F401
    ComputeClient, DataServiceError, TfDataServiceConfig, add_dataset_method, send_to_data_service, tf_data_service,
)

add_dataset_method()
