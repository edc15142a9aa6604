"""Variable and object broadcast helpers for TensorFlow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import hpcvod.runtime as rt
from hpcvod.frameworks._common import pack_aligned
from hpcvod.frameworks.tensorflow.bridge import device_in, not_converted, numpy_in, on_gpu, run_op, tensor_out
from hpcvod.frameworks.tensorflow.mpi_ops import global_process_set


def _eager_broadcast_group(values: Sequence[tf.Tensor], root_rank: int, ps: Any) -> list[tf.Tensor]:
    """One in-place broadcast per dtype over a packed buffer of every value; GPU values broadcast on the device."""
    if all(on_gpu(v) for v in values):
        handles = [rt.broadcast_async(device_in(v), root_rank, process_set=ps) for v in values]
        return [tensor_out(rt.synchronize(h), v.dtype) for h, v in zip(handles, values)]
    arrays = [numpy_in(v) for v in values]
    by_dtype: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    results: list[Any] = [None] * len(arrays)
    for indices in by_dtype.values():
        buffer, views = pack_aligned([arrays[i] for i in indices])
        rt.broadcast_(buffer, root_rank, process_set=ps)
        for i, view in zip(indices, views):
            results[i] = tensor_out(view)
    return results


@not_converted
def broadcast_variables(variables: Sequence[Any], root_rank: int, process_set: Any = rt.global_process_set,
                        inplace: bool = False) -> Any:
    """Assigns ``root_rank``'s values to ``variables`` (``tf.Variable`` or Keras 3 variables) on every rank.

    Eagerly it returns None; inside a ``tf.function`` it returns the grouped assign op. ``inplace`` is accepted for
    Horovod compatibility (values are always assigned in place).
    """
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    values = [tf.convert_to_tensor(v) for v in variables]
    new_values = run_op(lambda *vs: _eager_broadcast_group(vs, root_rank, process_set), values,
                      [v.dtype for v in values])
    assigns = []
    for var, value, new in zip(variables, values, new_values):
        new.set_shape(value.shape)
        assigns.append(var.assign(new))
    return None if tf.executing_eagerly() else tf.group(*[a for a in assigns if a is not None])


@not_converted
def broadcast_(variables: Sequence[tf.Variable], root_rank: int, name: str | None = None,
               process_set: Any = global_process_set) -> list[tf.Tensor]:
    """Assigns ``root_rank``'s values to ``variables`` (one fused broadcast per dtype); returns the new values
    (in a graph: read after the assignment)."""
    assigned = broadcast_variables(variables, root_rank, process_set=process_set)
    with tf.control_dependencies([] if assigned is None else [assigned]):
        return [tf.convert_to_tensor(v.read_value() if hasattr(v, "read_value") else v) for v in variables]


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: Any = rt.global_process_set) -> Any:
    """Returns ``root_rank``'s ``obj`` (any picklable object) on every rank. ``session`` is TF1-only and ignored."""
    return rt.broadcast_object(obj, root_rank=root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: Any = rt.global_process_set) -> Any:
    """Horovod's TF1 helper: a function that broadcasts its argument from ``root_rank``."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: Any = rt.global_process_set) -> list[Any]:
    """Returns the list of every rank's ``obj``, in rank order."""
    return rt.allgather_object(obj, name=name, process_set=process_set)
