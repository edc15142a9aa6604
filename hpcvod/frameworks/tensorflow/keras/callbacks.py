"""Horovod's Keras callbacks for Keras 3 (``hvd.callbacks.*``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

import hpcvod.runtime as rt
from hpcvod.frameworks.tensorflow.functions import broadcast_variables
from hpcvod.frameworks.tensorflow.gradient_tape import variable_key


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Gives every rank ``root_rank``'s model and optimizer variables when training starts, so that all ranks
    begin from the same (random or restored) state. ``device`` is accepted for Horovod compatibility.

    Keras 3 builds the optimizer lazily (in the first traced step); a restored optimizer is built already. So
    that every rank broadcasts the same variables, the callback builds the optimizer where the model is built,
    and broadcasts at ``on_train_begin`` when every rank's model is built, else after the first batch.
    ``local_variables`` (or ``register_local_var``) stay as they are on each rank.
    """

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None,
                 process_set: Any = rt.global_process_set) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        self.broadcast_done = False
        self._local_keys = {variable_key(v) for v in (local_variables or [])}

    def register_local_var(self, var: Any) -> None:
        """Keeps ``var`` out of the broadcast (a worker-local variable), as Horovod's ``local_variables``."""
        self._local_keys.add(variable_key(var))

    def _broadcast(self) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        variables = [v for v in self.model.variables if variable_key(v) not in self._local_keys]
        variables += list(optimizer.variables) if optimizer is not None else []
        broadcast_variables(variables, self.root_rank, process_set=self.process_set)
        self.broadcast_done = True

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.broadcast_done:
            return
        optimizer = getattr(self.model, "optimizer", None)
        ready = bool(self.model.built and self.model.variables)
        if ready and optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)  # what Keras does itself in its first step
        everyone_ready = np.array([1 if ready else 0], dtype=np.int32)
        rt.allreduce_(everyone_ready, op=rt.Min, name="broadcast_global_variables.ready",
                      process_set=self.process_set)
        if everyone_ready[0]:
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch's metrics (training and validation) by their average over the ranks. Put it before
    callbacks that read metrics (ReduceLROnPlateau, ModelCheckpoint, TensorBoard...)."""

    def __init__(self, device: str = "", process_set: Any = rt.global_process_set) -> None:
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype,
                                                                                          np.number))
        values = np.array([float(logs[k]) for k in names], dtype=np.float64)
        if values.size:
            rt.allreduce_(values, name=f"metric_average.{epoch}", op=rt.Average, process_set=self.process_set)
        for k, v in zip(names, values):
            logs[k] = float(v)


def _current_lr(optimizer: Any) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` until ``end_epoch``:
    at each epoch's start (``staircase``) or at every batch with a fractional epoch. A number as ``multiplier``
    decays exponentially, ``multiplier ** (epoch - start_epoch)``, as in Horovod.

    ``momentum_correction`` is accepted but has no effect with Keras 3: its optimizers compile momentum as a
    Python float into the training step, so it cannot be rescaled while training (docs/drop-in.md).
    """

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float], start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier ** (epoch - start_epoch))
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def _in_range(self, epoch: float) -> bool:
        return self.start_epoch <= epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set_lr(self, epoch: float) -> None:
        self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
        if not self.staircase and not self.steps_per_epoch:
            raise ValueError("LearningRateScheduleCallback with staircase=False needs steps_per_epoch (Keras did "
                             "not report the number of steps per epoch)")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._set_lr(epoch)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.staircase:
            return
        epoch = self.current_epoch + float(batch) / self.steps_per_epoch
        if self._in_range(epoch):
            self._set_lr(epoch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = _current_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs`` (Goyal et al.,
    "Accurate, Large Minibatch SGD"), updated at every batch. As in Horovod, batch ``b`` of epoch ``e`` trains
    with the value of epoch ``e + (b + 1) / steps_per_epoch``, so that an epoch ends on a round value."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            size = rt.size()
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch,
                         verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if epoch == self.end_epoch - 1:
            self.model.optimizer.learning_rate = self.initial_lr  # the ramp's end point, without rounding
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and rt.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_current_lr(self.model.optimizer):g}.")
