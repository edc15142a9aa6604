"""Horovod's TensorFlow v1 graph-mode API through ``tf.compat.v1`` (the seeds' "TensorFlow v1 Example").

``DistributedOptimizer`` over a ``tf.compat.v1.train.Optimizer`` averages the gradients of ``compute_gradients``
over the ranks (graph ops that run the runtime's collectives when the session runs them: the same engine, fusion,
timeline and failure handling as eager code); ``broadcast_global_variables`` is an op that gives every rank the root's
global variables; ``BroadcastGlobalVariablesHook`` runs it once a ``MonitoredTrainingSession`` has initialised or
restored them.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

import hpcvod.runtime as rt
from hpcvod.frameworks.tensorflow.functions import broadcast_variables
from hpcvod.frameworks.tensorflow.gradient_tape import GradientReducer

_LegacyOptimizer = tf.compat.v1.train.Optimizer


def is_legacy_optimizer(optimizer: Any) -> bool:
    """A TF1 optimizer (``tf.compat.v1.train.*Optimizer``), as opposed to a Keras 3 one."""
    return isinstance(optimizer, _LegacyOptimizer)


def _require_graph(what: str, instead: str) -> None:
    if tf.executing_eagerly():
        raise RuntimeError(f"hvd.{what} needs TensorFlow v1 graph mode (tf.compat.v1.disable_eager_execution()); "
                           f"in eager code use {instead}")


def broadcast_global_variables(root_rank: int) -> Any:
    """An op that assigns ``root_rank``'s value to every global variable of the default graph (run it after the
    variables are initialised)."""
    _require_graph("broadcast_global_variables()", "hvd.broadcast_variables(model.variables, root_rank)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcasts every global variable from ``root_rank`` once the session has initialised (or restored) them, so
    that every rank starts from the same weights. ``device`` is accepted for Horovod compatibility."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op: Any = None

    def begin(self) -> None:
        if self.bcast_op is None or self.bcast_op.graph is not tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)


class _DistributedOptimizer(_LegacyOptimizer):
    """Wraps a TF1 optimizer: ``compute_gradients`` returns gradients averaged (``op``) over the ranks,
    ``apply_gradients`` is the wrapped optimizer's. With ``backward_passes_per_step`` N > 1, gradients accumulate in
    local variables and are reduced and applied on every N-th run (Horovod's legacy aggregation)."""

    def __init__(self, optimizer: Any, name: str | None, use_locking: bool, reducer: GradientReducer,
                 backward_passes_per_step: int, average_aggregated_gradients: bool) -> None:
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = reducer
        self._passes = backward_passes_per_step
        self._average_aggregated = average_aggregated_gradients
        self._counter: Any = None

    def register_local_var(self, var: Any) -> None:
        """Keeps ``var``'s gradient local (not reduced; scaled by 1/size unless ``scale_local_gradients=False``),
        for model-parallel variables."""
        self._reducer.register_local_var(var)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        """The wrapped optimizer's gradients, reduced over the ranks (every N-th run with backward_passes_per_step)."""
        _require_graph("DistributedOptimizer(tf.compat.v1 optimizer)",
                       "a Keras 3 optimizer or hvd.DistributedGradientTape")
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        if self._passes == 1:
            reduced = self._reducer.reduce(grads, variables)
        else:
            reduced = self._aggregate_then_reduce(grads, variables)
        return list(zip(reduced, variables))

    def _aggregate_then_reduce(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        """Adds this run's gradients to local accumulators; on the N-th run returns the reduced accumulated
        gradients (averaged over the N runs with ``average_aggregated_gradients``), else the accumulators."""
        local = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
        self._counter = tf.compat.v1.get_variable(f"{self._name}_passes", shape=[], dtype=tf.int32,
                                                  initializer=tf.compat.v1.zeros_initializer(), trainable=False,
                                                  collections=local)
        present = [i for i, g in enumerate(grads) if g is not None]
        accumulators = {i: tf.compat.v1.get_variable(
            f"{self._name}_acc_{i}", shape=variables[i].shape, dtype=variables[i].dtype.base_dtype,
            initializer=tf.compat.v1.zeros_initializer(), trainable=False, collections=local) for i in present}
        adds = [accumulators[i].assign_add(tf.convert_to_tensor(grads[i])) for i in present]
        with tf.control_dependencies(adds):
            passes = self._counter.assign_add(1)
        boundary = tf.equal(tf.math.floormod(passes, self._passes), 0)
        scale = 1.0 / self._passes if self._average_aggregated else 1.0
        sums = [accumulators[i].read_value() for i in present]

        def reduce_now() -> list[Any]:
            scaled = [s * tf.cast(scale, s.dtype) for s in sums] if scale != 1.0 else sums
            return self._reducer.reduce(scaled, [variables[i] for i in present])

        chosen = tf.cond(boundary, reduce_now, lambda: [tf.identity(s) for s in sums])
        chosen = chosen if isinstance(chosen, (list, tuple)) else [chosen]
        out: list[Any] = [None] * len(grads)
        for i, g in zip(present, chosen):
            out[i] = g
        self._boundary = boundary
        self._accumulators = list(accumulators.values())
        return out

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None, name: str | None = None) -> Any:
        """The wrapped optimizer's update (on every N-th run only with backward_passes_per_step, then the
        accumulators restart from zero)."""
        if self._passes == 1:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        grads_and_vars = list(grads_and_vars)
        # slots are variables: created here, outside the conditional branch that uses them
        self._optimizer._create_slots([v for g, v in grads_and_vars if g is not None])

        def apply_and_reset() -> Any:
            applied = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
            with tf.control_dependencies([applied]):
                return tf.group(*[a.assign(tf.zeros_like(a)) for a in self._accumulators])

        def skip() -> Any:
            if global_step is None:
                return tf.no_op()
            return tf.group(tf.compat.v1.assign_add(global_step, 1))

        return tf.cond(self._boundary, apply_and_reset, skip)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,
                         compression: Any = None, sparse_as_dense: bool = False, backward_passes_per_step: int = 1,
                         op: Any = None, gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0, groups: Any = None,
                         process_set: Any = rt.global_process_set, scale_local_gradients: bool = True) -> Any:
    """Horovod's ``horovod.tensorflow.DistributedOptimizer`` for a ``tf.compat.v1.train.Optimizer``."""
    from hpcvod.frameworks.tensorflow.compression import Compression
    reducer = GradientReducer(compression=compression or Compression.none, sparse_as_dense=sparse_as_dense, op=op,
                              gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
                              groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)
    return _DistributedOptimizer(optimizer, name, use_locking, reducer, backward_passes_per_step,
                                 average_aggregated_gradients)
