"""The runtime's collectives on TensorFlow tensors, in eager mode and inside ``tf.function``.

Eager tensors reach the runtime through DLPack: a read-only NumPy view of the tensor's own memory (``.numpy()``
would copy, and is slow for large tensors). Results leave through DLPack too, from 64-byte-aligned NumPy buffers
(TensorFlow aborts on less-aligned ones), so a reduction costs one copy into such a buffer, an in-place MPI call,
and no copy out. GPU tensors (with CuPy installed) go to the runtime as they are, through DLPack, run on NCCL
(runtime/nccl.py) out of place and come back as GPU tensors: no host copy; bfloat16 ones as their int16 words
(``Bfloat16Words``), reduced by NCCL as bfloat16. Inside a graph each op is a ``tf.py_function`` around the same eager code (``tf.function``'s
automatic control dependencies keep these stateful ops in program order, the same on every rank), wrapped in
``tf.custom_gradient`` so that allreduce, allgather, broadcast, alltoall and reducescatter are differentiable.
XLA cannot compile Python ops: compile Keras models with ``jit_compile=False`` (the default on CPU).
The conversions and the graph-op plumbing are in bridge.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import hpcvod.runtime as rt
from hpcvod.frameworks._common import resolve_op, set_rank_size
from hpcvod.frameworks.tensorflow.bridge import (  # noqa: F401 (the error types: API)
    aligned_copy, device_in, graph_name, InputError, MismatchError, narrow, not_converted, numpy_in, on_gpu,
    run_op, runtime_in, tensor_out, widen,
)
from hpcvod.frameworks.tensorflow.compression import Compression, Compressor

global_process_set = rt.global_process_set


# ---------------------------------------------------------------------------------------------- eager bodies
def _eager_allreduce(t: tf.Tensor, name: str | None, op: Any, pre: float, post: float, ps: Any) -> tf.Tensor:
    if on_gpu(t):
        return tensor_out(rt.allreduce(device_in(t), name=name, op=op, prescale_factor=pre,
                                        postscale_factor=post, process_set=ps), t.dtype)
    buf = aligned_copy(t)
    rt.allreduce_(buf, name=name, op=op, prescale_factor=pre, postscale_factor=post, process_set=ps)
    return tensor_out(buf)


def _eager_grouped_allreduce(tensors: Sequence[tf.Tensor], name: str | None, op: Any, pre: float, post: float,
                             ps: Any) -> list[tf.Tensor]:
    """One grouped in-place allreduce of aligned copies (the runtime negotiates each tensor's shape and fuses them,
    keeping a dot product per tensor for Adasum); GPU tensors: one grouped allreduce on the device."""
    if all(on_gpu(t) for t in tensors):
        outs = rt.grouped_allreduce([device_in(t) for t in tensors], name=name, op=op, prescale_factor=pre,
                                    postscale_factor=post, process_set=ps)
        return [tensor_out(o, t.dtype) for o, t in zip(outs, tensors)]
    # not one packed buffer: ranks whose tensors differ in shape but pad to the same length would pair silently
    bufs = [aligned_copy(t) for t in tensors]
    rt.grouped_allreduce_(bufs, name=name, op=op, prescale_factor=pre, postscale_factor=post, process_set=ps)
    return [tensor_out(b) for b in bufs]


def _eager_allgather(t: tf.Tensor, name: str | None, ps: Any) -> tf.Tensor:
    return tensor_out(rt.allgather(runtime_in(t), name=name, process_set=ps), t.dtype)


def _eager_broadcast(t: tf.Tensor, root_rank: int, name: str | None, ps: Any) -> tf.Tensor:
    if on_gpu(t):
        return tensor_out(rt.broadcast(device_in(t), root_rank, name=name, process_set=ps), t.dtype)
    buf = aligned_copy(t)
    rt.broadcast_(buf, root_rank, name=name, process_set=ps)
    return tensor_out(buf)


def _eager_alltoall(t: tf.Tensor, splits: Any, name: str | None, ps: Any) -> list[tf.Tensor]:
    array = runtime_in(t)
    size = set_rank_size(ps)[1]     # None for a set that is not registered: the runtime says so
    rows = t.shape[0] if t.shape.rank else None
    if splits is None and rows is not None and size is not None and rows % size == 0:
        # equal parts, as explicit splits: the runtime then also says how many rows came from each rank (ranks
        # may send different numbers of rows; the gradient sends them back with these)
        splits = np.full(size, rows // size, dtype=np.int32)
    splits_array = None if splits is None else np.asarray(numpy_in(splits), dtype=np.int32)
    output, received = rt.alltoall(array, splits=splits_array, name=name, process_set=ps)
    return [tensor_out(output, t.dtype), tf.constant(np.asarray(received, dtype=np.int32))]


def _eager_reducescatter(t: tf.Tensor, name: str | None, op: Any, pre: float, post: float, ps: Any) -> tf.Tensor:
    out = rt.reducescatter(runtime_in(t), name=name, op=op, prescale_factor=pre, postscale_factor=post,
                           process_set=ps)
    return tensor_out(out, t.dtype)


# ---------------------------------------------------------------------------------------------- differentiable ops
# Gradients as Horovod defines them (horovod/tensorflow/mpi_ops.py): allreduce -> the same allreduce of the
# gradient; allgather -> the Average allreduce of the gradient, cut to this rank's rows; broadcast -> the Average
# allreduce of the gradient on the root, zeros elsewhere; alltoall -> alltoall back with the received splits;
# reducescatter -> allgather of the gradient times size for Sum (times 1 for Average), times pre- and postscale.
def _reduce_dense(tensor: tf.Tensor, name: str | None, op: Any, pre: float, post: float, ps: Any) -> tf.Tensor:
    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        label = graph_name("Allreduce", [x], name)
        y = run_op(lambda t: _eager_allreduce(t, label, op, pre, post, ps), [x], [x.dtype], label)[0]
        y.set_shape(x.shape)

        def grad(dy: tf.Tensor) -> tf.Tensor:
            if op not in (rt.Average, rt.Sum):
                raise NotImplementedError(f"allreduce with op={op} has no gradient (only Average and Sum do)")
            return _reduce_dense(dy, None, op, pre, post, ps)
        return y, grad

    wide, dtype = widen(tf.convert_to_tensor(tensor))
    return narrow(forward(wide), dtype)


def _reduce_grouped(tensors: Sequence[tf.Tensor], name: str | None, op: Any, pre: float, post: float,
                    ps: Any) -> list[tf.Tensor]:
    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        label = graph_name("GroupedAllreduce", [xs[0], xs[-1]], name)
        ys = run_op(lambda *ts: _eager_grouped_allreduce(ts, label, op, pre, post, ps), list(xs),
                  [x.dtype for x in xs], label)
        for y, x in zip(ys, xs):
            y.set_shape(x.shape)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            if op not in (rt.Average, rt.Sum):
                raise NotImplementedError(f"grouped_allreduce with op={op} has no gradient")
            return _reduce_grouped(dys, None, op, pre, post, ps)
        return ys, grad

    widened = [widen(tf.convert_to_tensor(t)) for t in tensors]
    outs = forward(*[w for w, _ in widened])
    return [narrow(o, d) for o, (_, d) in zip(outs, widened)]


def _gather(tensor: tf.Tensor, name: str | None, ps: Any) -> tf.Tensor:
    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        label = graph_name("Allgather", [x], name)
        y = run_op(lambda t: _eager_allgather(t, label, ps), [x], [x.dtype], label)[0]
        y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))

        def grad(dy: tf.Tensor) -> tf.Tensor:
            return _gather_grad(dy, x, ps)
        return y, grad

    wide, dtype = widen(tf.convert_to_tensor(tensor))
    return narrow(forward(wide), dtype)


def _bcast(tensor: tf.Tensor, root_rank: int, name: str | None, ps: Any) -> tf.Tensor:
    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        label = graph_name("Broadcast", [x], name)
        y = run_op(lambda t: _eager_broadcast(t, root_rank, label, ps), [x], [x.dtype], label)[0]
        y.set_shape(x.shape)

        def grad(dy: tf.Tensor) -> tf.Tensor:
            averaged = _reduce_dense(dy, None, rt.Average, 1.0, 1.0, ps)
            return averaged if rt.rank() == root_rank else averaged * 0
        return y, grad

    wide, dtype = widen(tf.convert_to_tensor(tensor))
    return narrow(forward(wide), dtype)


def _exchange(tensor: tf.Tensor, splits: Any, name: str | None, ps: Any) -> tuple[tf.Tensor, tf.Tensor]:
    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        label = graph_name("Alltoall", [x], name)
        inputs = [x] if splits is None else [x, tf.cast(splits, tf.int32)]
        y, received = run_op(lambda t, *s: _eager_alltoall(t, s[0] if s else None, label, ps), inputs,
                           [x.dtype, tf.int32], label)
        y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))
        received.set_shape([set_rank_size(ps)[1]])

        def grad(dy: tf.Tensor, _d_received: Any = None) -> tf.Tensor:
            return _exchange(dy, received, None, ps)[0]
        return (y, received), grad

    wide, dtype = widen(tf.convert_to_tensor(tensor))
    y, received = forward(wide)
    return narrow(y, dtype), tf.stop_gradient(received)


def _scatter(tensor: tf.Tensor, name: str | None, op: Any, pre: float, post: float, ps: Any) -> tf.Tensor:
    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        label = graph_name("Reducescatter", [x], name)
        y = run_op(lambda t: _eager_reducescatter(t, label, op, pre, post, ps), [x], [x.dtype], label)[0]
        y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))

        def grad(dy: tf.Tensor) -> tf.Tensor:
            return _scatter_grad(dy, op, pre, post, ps)
        return y, grad

    wide, dtype = widen(tf.convert_to_tensor(tensor))
    return narrow(forward(wide), dtype)


def _gather_grad(dy: tf.Tensor, x: tf.Tensor, ps: Any) -> tf.Tensor:
    """The Average allreduce of the gradient, cut to this rank's rows (every rank's row count allgathered)."""
    averaged = _reduce_dense(dy, None, rt.Average, 1.0, 1.0, ps)
    dims = _gather(tf.shape(x, out_type=tf.int64)[:1], None, ps)
    my_rank = set_rank_size(ps)[0]
    offset = tf.reduce_sum(dims[:my_rank])
    return averaged[offset:offset + dims[my_rank]]


def _scatter_grad(dy: tf.Tensor, op: Any, pre: float, post: float, ps: Any) -> tf.Tensor:
    """The allgather of the gradient, times the set size for Sum, times pre- and postscale."""
    if op not in (rt.Average, rt.Sum):
        raise NotImplementedError(f"reducescatter with op={op} has no gradient")
    scale = pre * post * (set_rank_size(ps)[1] if op == rt.Sum else 1)
    return _gather(dy * tf.cast(scale, dy.dtype), None, ps)


def _grouped(kind: str, eager_group: Callable[..., list[np.ndarray]], grad_one: Callable[..., tf.Tensor],
             tensors: Sequence[Any], name: str | None) -> list[tf.Tensor]:
    """A grouped allgather/reducescatter as one node (one negotiation); the
    gradient of each output is that of the single op (``grad_one(dy, x)``), as in Horovod."""
    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        label = graph_name(kind, [xs[0], xs[-1]], name)
        ys = run_op(lambda *ts: [tensor_out(a, t.dtype) for a, t in zip(eager_group([runtime_in(t) for t in ts],
                                                                                  label), ts)], list(xs),
                  [x.dtype for x in xs], label)
        for y, x in zip(ys, xs):
            y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            return [grad_one(dy, x) for dy, x in zip(dys, xs)]
        return ys, grad

    widened = [widen(tf.convert_to_tensor(t)) for t in tensors]
    outs = forward(*[w for w, _ in widened])
    return [narrow(o, d) for o, (_, d) in zip(outs, widened)]


def _reduce_sparse(slices: Sequence[tf.IndexedSlices], op: Any, pre: float, post: float, ps: Any,
                   names: Sequence[str] | None) -> list[tf.IndexedSlices]:
    """Horovod's sparse allreduce: ``tf.IndexedSlices`` by allgathering values and indices (values divided by
    the set size for Average); ``dense_shape`` kept as given, also when it is None."""
    if op not in (rt.Average, rt.Sum):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if pre != 1.0 or post != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
    out = []
    for i, s in enumerate(slices):
        values = _gather(s.values, None if names is None else f"{names[i]}.values", ps)
        indices = _gather(s.indices, None if names is None else f"{names[i]}.indices", ps)
        if op == rt.Average:
            values = values / tf.cast(set_rank_size(ps)[1], values.dtype)
        out.append(tf.IndexedSlices(values, indices, dense_shape=s.dense_shape))
    return out


# ---------------------------------------------------------------------------------------------- public ops
@not_converted
def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "", device_sparse: str = "",
              compression: type[Compressor] = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None, process_set: Any = global_process_set,
              ignore_name_scope: bool = False) -> Any:
    """Reduces a ``tf.Tensor``/``tf.Variable`` over all ranks (differentiable). A ``tf.IndexedSlices`` is reduced
    by allgathering its values and indices (divided by the set size for ``Average``)."""
    op = resolve_op(average, op)
    if isinstance(tensor, tf.IndexedSlices):
        return _reduce_sparse([tensor], op, prescale_factor, postscale_factor, process_set,
                              None if name is None else [name])[0]
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    reduced = _reduce_dense(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


@not_converted
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, device_dense: str = "",
                      device_sparse: str = "", compression: type[Compressor] = Compression.none, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Any = global_process_set, ignore_name_scope: bool = False,
                      name: str | None = None) -> list[Any]:
    """Reduces a list of tensors as one fused operation (differentiable); ``tf.IndexedSlices`` among them are
    reduced as in ``allreduce``."""
    op = resolve_op(average, op)
    if not tensors:
        return []
    tensors = list(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out: list[Any] = [None] * len(tensors)
    if sparse:
        names = None if name is None else [f"{name}.{i}" for i in sparse]
        for i, r in zip(sparse, _reduce_sparse([tensors[i] for i in sparse], op, prescale_factor,
                                               postscale_factor, process_set, names)):
            out[i] = r
    if dense:
        compressed = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
        reduced = _reduce_grouped([c for c, _ in compressed], name, op, prescale_factor, postscale_factor,
                                  process_set)
        for i, r, (_, ctx) in zip(dense, reduced, compressed):
            out[i] = compression.decompress(r, ctx)
    return out


@not_converted
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: Any = global_process_set) -> tf.Tensor:
    """Concatenates every rank's tensor along the first dimension (sizes may differ; differentiable)."""
    return _gather(tf.convert_to_tensor(tensor), name, process_set)


@not_converted
def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: Any = global_process_set) -> list[tf.Tensor]:
    """Allgathers several tensors as one operation (differentiable)."""
    if not tensors:
        return []
    return _grouped("GroupedAllgather", lambda arrays, n: rt.grouped_allgather(arrays, name=n, process_set=process_set),
                    lambda dy, x: _gather_grad(dy, x, process_set), tensors, name)


@not_converted
def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: Any = global_process_set) -> tf.Tensor:
    """Returns ``root_rank``'s value of ``tensor`` (differentiable: the root's input gets the summed gradient)."""
    return _bcast(tf.convert_to_tensor(tensor), root_rank, name, process_set)


@not_converted
def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: Any = global_process_set) -> Any:
    """Scatters slices of ``tensor`` (first dimension) to every rank and gathers what they send. Returns the
    gathered tensor, plus the received splits when ``splits`` is given (Horovod's shape; differentiable)."""
    output, received = _exchange(tf.convert_to_tensor(tensor), splits, name, process_set)
    return output if splits is None else (output, received)


@not_converted
def reducescatter(tensor: Any, device_dense: str = "", compression: type[Compressor] = Compression.none,
                  op: Any = None, name: str | None = None, process_set: Any = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduces ``tensor`` over all ranks and returns this rank's slice of the first dimension (differentiable)."""
    op = rt.Average if op is None else op
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    out = _scatter(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


@not_converted
def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: type[Compressor] = Compression.none, op: Any = None,
                          process_set: Any = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0, name: str | None = None) -> list[tf.Tensor]:
    """Reducescatters several tensors as one operation (differentiable; Horovod's positional order, ``name`` is an
    extension)."""
    if not tensors:
        return []
    op = rt.Average if op is None else op
    compressed = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    outs = _grouped("GroupedReducescatter",
                    lambda arrays, n: rt.grouped_reducescatter(arrays, name=n, op=op, process_set=process_set,
                                                               prescale_factor=prescale_factor,
                                                               postscale_factor=postscale_factor),
                    lambda dy, x: _scatter_grad(dy, op, prescale_factor, postscale_factor, process_set),
                    [c for c, _ in compressed], name)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, compressed)]


@not_converted
def join() -> tf.Tensor:
    """Marks this rank as out of data; once every rank has joined, returns the rank that joined last (a scalar
    int32 tensor, as Horovod's op; in a ``tf.function`` it joins when the graph runs)."""
    return run_op(lambda: tf.constant(rt.join(), dtype=tf.int32), [], [tf.int32])[0]


@not_converted
def barrier(process_set: Any = global_process_set) -> None:
    rt.barrier(process_set=process_set)


def _process_set(process_set_id: int) -> Any:
    from hpcvod.runtime import context
    found = context.runtime().sets.get(process_set_id) if process_set_id else global_process_set
    if found is None:
        raise ValueError(f"no process set with id {process_set_id} is registered")
    return found


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The size of the process set (a constant fixed when the graph is built)."""
    return tf.constant(set_rank_size(_process_set(process_set_id))[1], dtype=tf.int32)


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 if this rank belongs to the process set, else 0 (a constant, as ``size_op``)."""
    ps = _process_set(process_set_id)
    return tf.constant(1 if ps is global_process_set else int(bool(ps.included())), dtype=tf.int32)


def local_size_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(rt.local_size(), dtype=tf.int32)


def rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(rt.rank(), dtype=tf.int32)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(rt.local_rank(), dtype=tf.int32)
