"""``DistributedOptimizer`` for Keras 3 optimizers (TensorFlow backend).

The optimizer object itself becomes distributed: its class is swapped for a subclass whose ``apply`` averages
the gradients over the ranks before the update (before loss-scale checks, clipping and weight decay, as with one
big batch). Its variables, state and every reference to it (``model.optimizer``) are kept, so an optimizer
restored with a model is wrapped in place. The subclass reports the base class's module and name, so models
saved with it load anywhere as the plain optimizer. As in Horovod, each call makes its own class, which keeps the
call's settings: ``opt.from_config(opt.get_config())`` (or ``type(opt)(**config)``) is distributed the same way.

``backward_passes_per_step=N`` uses Keras 3's own gradient accumulation (``gradient_accumulation_steps``) and
reduces only on the update step, the accumulated gradients (summed, or averaged with
``average_aggregated_gradients``), just before clipping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

import hpcvod.runtime as rt
from hpcvod.frameworks.tensorflow.compression import Compression, Compressor
from hpcvod.frameworks.tensorflow.gradient_tape import GradientReducer


class _State:
    """hpcvod's per-optimizer settings, kept out of Keras's attribute tracking."""

    def __init__(self, reducer: GradientReducer, average_aggregated_gradients: bool) -> None:
        self.reducer = reducer
        self.average_aggregated_gradients = average_aggregated_gradients
        self.update_variables: list[Any] = []


class _DistributedOptimizer(keras.optimizers.Optimizer):
    """Body of the classes ``DistributedOptimizer`` swaps in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Only for copies (from_config, type(opt)(...)): the wrapped optimizer itself is never re-initialised.
        super(self._hvd_base, self).__init__(*args, **kwargs)
        object.__setattr__(self, "_hvd", self._hvd_new_state())

    @tf.autograph.experimental.do_not_convert  # called while Keras traces its step: run as Python
    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        if not self.gradient_accumulation_steps:
            variables = self._trainable_variables if trainable_variables is None else list(trainable_variables)
            grads = self._hvd.reducer.reduce(list(grads), list(variables))
        return super(self._hvd_base, self).apply(grads, trainable_variables)

    @tf.autograph.experimental.do_not_convert  # called while Keras traces its step: run as Python
    def _backend_apply_gradients(self, grads: Any, trainable_variables: Any) -> Any:
        # Remembered (while tracing) for _clip_gradients, which Keras calls without the variables.
        self._hvd.update_variables = list(trainable_variables)
        return super(self._hvd_base, self)._backend_apply_gradients(grads, trainable_variables)

    @tf.autograph.experimental.do_not_convert  # called while Keras traces its step: run as Python
    def _clip_gradients(self, grads: Any) -> Any:
        steps = self.gradient_accumulation_steps
        if steps:
            # Keras hands over the mean of the accumulated gradients; Horovod reduces their sum by default.
            if not self._hvd.average_aggregated_gradients:
                grads = [None if g is None else g * steps for g in grads]
            grads = self._hvd.reducer.reduce(list(grads), self._hvd.update_variables)
        return super(self._hvd_base, self)._clip_gradients(grads)

    def register_local_var(self, var: Any) -> None:
        """Keeps ``var``'s gradient local (not reduced), for model-parallel parts."""
        self._hvd.reducer.register_local_var(var)


def _distributed_class(base: type, new_state: Callable[[], _State]) -> type:
    """A subclass of ``base`` with the distributed ``apply``; ``new_state`` gives each copy its settings."""
    body = {k: v for k, v in _DistributedOptimizer.__dict__.items()
            if k not in ("__dict__", "__weakref__", "__doc__")}
    cls = type(base.__name__, (base,), body)
    cls._hvd_base = cls
    cls._hvd_new_state = staticmethod(new_state)
    cls.__module__, cls.__qualname__ = base.__module__, base.__qualname__
    return cls


def DistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "", compression: type[Compressor] = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: Any = None, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0, groups: Any = None,
                         process_set: Any = rt.global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Makes a Keras 3 optimizer average its gradients (``op``) over the ranks of ``process_set``; returns it.

    ``name``, ``device_dense`` and ``device_sparse`` are accepted for Horovod compatibility.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"DistributedOptimizer needs a Keras 3 optimizer (keras.optimizers.*), got "
                         f"{type(optimizer).__module__}.{type(optimizer).__name__}; for a custom training loop wrap "
                         f"the tf.GradientTape in hvd.DistributedGradientTape instead")
    if hasattr(optimizer, "_hvd"):
        raise ValueError("optimizer is already a hpcvod DistributedOptimizer")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if backward_passes_per_step > 1:
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            raise NotImplementedError("backward_passes_per_step > 1 with a LossScaleOptimizer: set "
                                      "gradient_accumulation_steps on its inner optimizer instead")
        if optimizer.gradient_accumulation_steps not in (None, backward_passes_per_step):
            raise ValueError(f"backward_passes_per_step={backward_passes_per_step} conflicts with the optimizer's "
                             f"gradient_accumulation_steps={optimizer.gradient_accumulation_steps}")
        if optimizer.built and not optimizer.gradient_accumulation_steps:
            raise ValueError("backward_passes_per_step > 1 needs an optimizer that is not built yet: wrap it "
                             "before model.compile()/fit()")
        optimizer.gradient_accumulation_steps = backward_passes_per_step
    def new_state() -> _State:
        reducer = GradientReducer(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
                                  process_set, scale_local_gradients)
        return _State(reducer, average_aggregated_gradients)

    object.__setattr__(optimizer, "_hvd", new_state())
    object.__setattr__(optimizer, "__class__", _distributed_class(type(optimizer), new_state))
    return optimizer
