"""Horovod's ``horovod.tensorflow.keras.callbacks`` (also ``hpcvod.keras.callbacks``)."""

from hpcvod.frameworks.tensorflow.keras.callbacks import (
    BroadcastGlobalVariablesCallback, LearningRateScheduleCallback, LearningRateWarmupCallback, MetricAverageCallback,
)

__all__ = ["BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback", "LearningRateWarmupCallback",
           "MetricAverageCallback"]
