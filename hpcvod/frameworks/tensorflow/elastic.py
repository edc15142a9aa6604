"""Horovod's ``horovod.tensorflow.elastic`` on hpcvod (``hvd.elastic`` of ``hpcvod.tensorflow``): ``run``,
``TensorFlowState`` and ``TensorFlowKerasState`` (docs/elastic.md).

The reset itself is framework-neutral (hpcvod/runtime/elastic.py); Keras's ``KerasState`` and callbacks are in
hpcvod/frameworks/tensorflow/keras/elastic.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from hpcvod.frameworks.tensorflow.functions import broadcast_object, broadcast_object_fn, broadcast_variables
from hpcvod.runtime import rank
from hpcvod.runtime.elastic import ObjectState, State, run_fn
from hpcvod.runtime.errors import HorovodInternalError


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator of the training function ``func(state, ...)``: a rank that dies or raises makes the others
    restore ``state``'s last commit, rebuild the world from the ranks still alive and call ``func`` again.

    A collective inside a ``tf.function`` (Keras's ``fit`` runs one) fails as TensorFlow's ``UnknownError``
    carrying the runtime's error: it is raised as the ``HorovodInternalError`` it stands for, as Horovod does."""
    @functools.wraps(func)
    def unwrapped_errors(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as exc:
            if "Hpcvod" not in str(exc.message):
                raise
            raise HorovodInternalError(exc.message) from exc
    return run_fn(unwrapped_errors)


class TensorFlowState(ObjectState):
    """A list of ``tf.Variable`` s (default: the TF1 graph's global variables) and any keyword values, exposed as
    attributes (Horovod's ``TensorFlowState``). ``session``: a TF1 graph's session (default: the default one);
    eager execution needs none."""

    def __init__(self, variables: Sequence[tf.Variable] | None = None, session: Any = None, **kwargs: Any) -> None:
        eager = tf.executing_eagerly()
        self.variables = list(variables) if variables else tf.compat.v1.global_variables()
        self.session = session if session is not None or eager else tf.compat.v1.get_default_session()
        # TF1: one broadcast op built now and run at each sync (building one per sync would grow the graph)
        self._bcast_op = None if eager else broadcast_variables(self.variables, root_rank=0)
        self._values: list[Any] = []
        self._save_model()
        bcast = broadcast_object if eager else broadcast_object_fn(session=self.session)
        super().__init__(bcast_object=bcast, get_rank=rank, **kwargs)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self.variables, self._values):
            if self._bcast_op is None:
                variable.assign(value)
            else:
                variable.load(value, self.session)
        super().restore()

    def sync(self) -> None:
        if self._bcast_op is None:
            broadcast_variables(self.variables, root_rank=0)
        else:
            self.session.run(self._bcast_op)
        self._save_model()
        super().sync()

    def _snapshot(self) -> dict[str, Any]:
        return {**super()._snapshot(), "variables": list(self._values)}

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        super()._load_snapshot(snapshot)
        self._values = list(snapshot["variables"])

    def _save_model(self) -> None:
        self._values = [v.numpy() if self._bcast_op is None else v.eval(self.session) for v in self.variables]


__all__ = ["run", "State", "ObjectState", "TensorFlowState"]   # TensorFlowKerasState: keras/elastic.py
