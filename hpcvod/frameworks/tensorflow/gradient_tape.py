"""Gradient averaging for TensorFlow: ``DistributedGradientTape`` and ``PartialDistributedGradientTape``, and the
``GradientReducer`` the Keras ``DistributedOptimizer`` shares with them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

import hpcvod.runtime as rt
from hpcvod.frameworks._common import average_as_prescale, set_rank_size
from hpcvod.frameworks.tensorflow import mpi_ops
from hpcvod.frameworks.tensorflow.compression import Compression, Compressor


def variable_key(variable: Any) -> Any:
    """A stable, hashable identity for a ``tf.Variable`` or a Keras 3 variable (which wraps one)."""
    inner = getattr(variable, "_value", None)
    if isinstance(inner, tf.Variable):
        variable = inner
    return variable.ref() if isinstance(variable, tf.Variable) else id(variable)


class GradientReducer:
    """Averages (``op``) a list of gradients over ``process_set``: dense gradients in fused groups (one packed
    in-place allreduce per dtype and group), ``tf.IndexedSlices`` by allgather (or densified first with
    ``sparse_as_dense``), local variables' gradients not at all (scaled by 1/size if ``scale_local_gradients``)."""

    def __init__(self, compression: type[Compressor] = Compression.none, sparse_as_dense: bool = False,
                 op: Any = None, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                 groups: Any = None, process_set: Any = rt.global_process_set,
                 scale_local_gradients: bool = True) -> None:
        if num_groups < 0:
            raise ValueError(f"num_groups must be >= 0, got {num_groups}")
        if groups is not None and not (isinstance(groups, int) and groups >= 0) and not (
                isinstance(groups, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in groups)):
            raise ValueError("groups must be a non-negative number or a list of lists of variables")
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op, self.prescale, self.postscale = average_as_prescale(op, gradient_predivide_factor)
        self.num_groups = groups if isinstance(groups, int) else num_groups
        self.groups = [[variable_key(v) for v in g] for g in groups] if isinstance(groups, (list, tuple)) else None
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.local_keys: set[Any] = set()

    def register_local_var(self, variable: Any) -> None:
        self.local_keys.add(variable_key(variable))

    def _partition(self, keys: list[Any]) -> list[list[int]]:
        """Positions of the dense gradients reduced together."""
        n = len(keys)
        if self.groups is not None:
            where = {k: g for g, group in enumerate(self.groups) for k in group}
            grouped: dict[Any, list[int]] = {}
            for i, k in enumerate(keys):
                grouped.setdefault(where.get(k, ("alone", i)), []).append(i)
            return list(grouped.values())
        if self.num_groups > 0:
            chunk = -(-n // self.num_groups)
            return [list(range(i, min(i + chunk, n))) for i in range(0, n, chunk)]
        return [list(range(n))]

    @mpi_ops.not_converted
    def reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        grads = list(grads)
        included = self.process_set.included() if hasattr(self.process_set, "included") else True
        size = set_rank_size(self.process_set)[1] if included else 1
        if size == 1:
            return grads
        keys = [variable_key(v) for v in variables]
        out: list[Any] = list(grads)
        dense_positions, dense_keys = [], []
        for i, (g, k) in enumerate(zip(grads, keys)):
            if g is None:
                continue
            if k in self.local_keys:
                if self.scale_local_gradients:
                    out[i] = (tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                              if isinstance(g, tf.IndexedSlices) else g / size)
                continue
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    # prescale * postscale is 1 here (an Average split around gradient_predivide_factor); Horovod
                    # refuses pre/postscale with IndexedSlices, so leave them out.
                    out[i] = mpi_ops.allreduce(g, op=self.op, process_set=self.process_set)
                    continue
                g = tf.convert_to_tensor(g)
            dense_positions.append(i)
            dense_keys.append(k)
            out[i] = g
        for part in self._partition(dense_keys):
            positions = [dense_positions[j] for j in part]
            reduced = mpi_ops.grouped_allreduce([out[p] for p in positions], op=self.op,
                                                compression=self.compression, prescale_factor=self.prescale,
                                                postscale_factor=self.postscale, process_set=self.process_set)
            for p, r in zip(positions, reduced):
                out[p] = r
        return out


class _DistributedGradientTape(tf.GradientTape):
    """Body of the tape classes ``DistributedGradientTape`` builds (a subclass of the wrapped tape's class)."""

    @mpi_ops.not_converted
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        grads = super(self._hvd_base, self).gradient(target, sources, output_gradients, unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads)
        reduced = self._hvd_reducer.reduce(flat_grads, flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)

    def register_local_source(self, source: Any) -> None:
        """Keeps ``source``'s gradient local (not reduced), for model-parallel parts."""
        self._hvd_reducer.register_local_var(source)


_tape_classes: dict[type, type] = {}


def _wrap_tape(gradtape: tf.GradientTape, reducer: GradientReducer) -> tf.GradientTape:
    if hasattr(gradtape, "_hvd_reducer"):
        raise ValueError("gradtape is already a hpcvod DistributedGradientTape")
    base = type(gradtape)
    cls = _tape_classes.get(base)
    if cls is None:
        body = {k: v for k, v in _DistributedGradientTape.__dict__.items()
                if k not in ("__dict__", "__weakref__", "__doc__")}
        cls = type(base.__name__, (base,), body)
        cls._hvd_base = cls
        _tape_classes[base] = cls
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(gradtape.__dict__)  # the recorded tape and its settings
    wrapped._hvd_reducer = reducer
    return wrapped


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                            compression: type[Compressor] = Compression.none, sparse_as_dense: bool = False,
                            op: Any = None, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: Any = rt.global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """Wraps a ``tf.GradientTape`` so that ``gradient()`` returns gradients averaged over all ranks."""
    reducer = GradientReducer(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
                              process_set, scale_local_gradients)
    return _wrap_tape(gradtape, reducer)


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                                   compression: type[Compressor] = Compression.none, sparse_as_dense: bool = False,
                                   op: Any = None, gradient_predivide_factor: float = 1.0,
                                   num_groups: int = 0, groups: Any = None,
                                   process_set: Any = rt.global_process_set, local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """A ``DistributedGradientTape`` that leaves the gradients of ``local_layers``' weights local."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients)
    layers: Iterable[Any] = [] if local_layers is None else (
        local_layers if isinstance(local_layers, (list, tuple)) else [local_layers])
    for layer in layers:
        for weight in getattr(layer, "trainable_weights", []):
            tape.register_local_source(weight)
    return tape
