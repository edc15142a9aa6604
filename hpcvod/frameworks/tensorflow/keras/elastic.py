"""Horovod's ``horovod.tensorflow.keras.elastic`` / ``horovod.keras.elastic`` state for Keras 3: ``KerasState``
and the callbacks that commit it and keep its ``batch`` and ``epoch``.

The state works as Horovod's (``sync`` gives every rank rank 0's model, optimizer and values; ``commit`` keeps a
copy in memory; ``restore`` goes back to it); ``run`` restores it and goes on after a rank dies (docs/elastic.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from hpcvod.frameworks.tensorflow import elastic as tensorflow_elastic
from hpcvod.frameworks.tensorflow.functions import broadcast_object, broadcast_variables
from hpcvod.runtime import rank
from hpcvod.runtime.elastic import ObjectState, State
from hpcvod.runtime.errors import HpcvodConfigError


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's ``hvd.elastic.run``: a rank that dies or raises makes the others restore ``state``'s last commit
    and go on in the smaller world (hpcvod/frameworks/tensorflow/elastic.py, docs/elastic.md)."""
    return tensorflow_elastic.run(func)


class KerasState(ObjectState):
    """A Keras 3 ``model``, its ``optimizer`` (default: the compiled one) and any keyword values, exposed as
    attributes (Horovod's ``KerasState``). The model must be built."""

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None,
                 **kwargs: Any) -> None:
        if not model.built:
            raise ValueError("KerasState needs a built model: call model.build(input_shape) or the model on a "
                             "batch first")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _variables(self) -> list[Any]:
        optimizer_variables = list(self.optimizer.variables) if self.optimizer is not None else []
        return list(self.model.variables) + optimizer_variables

    def _save_model(self) -> None:
        # Pairs, not positions: an optimizer built after the commit has more variables than the copy.
        self._saved_values = [(v, np.array(keras.ops.convert_to_numpy(v))) for v in self._variables()]

    def _load_model(self) -> None:
        for variable, value in self._saved_values:
            variable.assign(value)

    def save(self) -> None:
        self._save_model()
        super().save()

    def _snapshot(self) -> dict[str, Any]:
        return {**super()._snapshot(), "variables": [value for _, value in self._saved_values]}

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        super()._load_snapshot(snapshot)
        if self.optimizer is not None and not self.optimizer.built:   # a fresh process: Keras builds it lazily
            self.optimizer.build(self.model.trainable_variables)
        variables = self._variables()
        if len(variables) != len(snapshot["variables"]):
            raise HpcvodConfigError(f"KerasState: the committed state has {len(snapshot['variables'])} variables, "
                                    f"this model and optimizer {len(variables)}")
        self._saved_values = list(zip(variables, snapshot["variables"]))

    def restore(self) -> None:
        self._load_model()
        super().restore()

    def sync(self) -> None:
        # Every rank broadcasts the same variables: an optimizer restored on rank 0 is built, a fresh one is not
        # (Keras 3 builds it in the first step), so build it here, as BroadcastGlobalVariablesCallback does.
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(self.model.trainable_variables)
        broadcast_variables(self._variables(), root_rank=0)
        self._save_model()
        super().sync()


class CommitStateCallback(keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at the end of every epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same count on every rank after a sync

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` at the last finished batch of the epoch (0 after an epoch). Horovod also shortens
    the first epoch after a reset by ``state.batch``; Keras 3 reads ``steps_per_epoch`` once per ``fit``, so
    pass ``steps_per_epoch - state.batch`` to a ``fit`` for that epoch instead."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` at the number of finished epochs, counted across ``fit`` calls from the value
    ``state.epoch`` had when training began."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run",
           "State", "ObjectState"]


class TensorFlowKerasState(KerasState):
    """Horovod's ``horovod.tensorflow.elastic.TensorFlowKerasState(model, optimizer, backend, **kwargs)``: Keras's
    ``KerasState``; ``backend`` (a TF1 Keras backend for its session) has nothing to do with Keras 3 and is ignored."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, **kwargs)
