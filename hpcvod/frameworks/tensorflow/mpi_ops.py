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
"""

from __future__ import annotations

import contextlib
import re
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import hpcvod.runtime as rt
from hpcvod.runtime import gpu
from hpcvod.runtime.errors import HpcvodInputError, HpcvodMismatchError
from hpcvod.frameworks._common import (
    aligned_empty, is_aligned, numpy_view_of_capsule, pack_aligned, resolve_op, set_rank_size,
)
from hpcvod.frameworks.tensorflow.compression import Compression, Compressor

global_process_set = rt.global_process_set
# AutoGraph must not rewrite hpcvod's Python (it would trace into the runtime): run it as written.
_not_converted = tf.autograph.experimental.do_not_convert

try:
    from tensorflow.python.framework.func_graph import FuncGraph as _FuncGraph
except ImportError:  # private module moved: treat every graph as a TF1 graph (chained; still correct)
    _FuncGraph = ()

# dtypes NumPy cannot reduce natively travel as float32 (on the host; GPU tensors keep bfloat16, see _widen)
_WIDENED = {tf.bfloat16: tf.float32}


# ---------------------------------------------------------------------------------------------- tensor <-> NumPy
def _on_gpu(t: Any) -> bool:
    """A non-empty GPU tensor the runtime takes as it is (DLPack to CuPy, collectives on NCCL): needs CuPy here.
    An empty one (or one of unknown shape) takes the host path, bfloat16 widened, like a CPU tensor."""
    return "GPU" in getattr(t, "device", "") and bool(t.shape.num_elements()) and gpu.probe()[0] is not None


def _device_in(t: tf.Tensor) -> Any:
    """A GPU tensor for the runtime, no copy: itself (DLPack), or a bfloat16 one's int16 words, tagged."""
    return gpu.Bfloat16Words(tf.bitcast(t, tf.int16)) if t.dtype == tf.bfloat16 else t


def _runtime_in(tensor: Any) -> Any:
    """What a collective that does not write into its input gets: a GPU tensor as it is, else a NumPy view."""
    t = tf.convert_to_tensor(tensor)
    return _device_in(t) if _on_gpu(t) else _numpy_in(t)


def _numpy_in(tensor: Any) -> np.ndarray:
    """A (read-only) NumPy view of an eager tensor's memory; a copy only where DLPack cannot export it."""
    t = tf.convert_to_tensor(tensor)
    if t.shape.num_elements() and "GPU" not in t.device:
        try:
            return numpy_view_of_capsule(tf.experimental.dlpack.to_dlpack(t))
        except Exception:  # noqa: BLE001 - dtypes DLPack lacks (bool, string): fall back to a copy
            pass
    return np.asarray(t.numpy())


def _tensor_out(array: Any, dtype: tf.DType | None = None) -> tf.Tensor:
    """An eager tensor over ``array``'s memory (copied first into an aligned buffer if it is not aligned); a CuPy
    result of the device path stays on the GPU (int16 words of a ``dtype`` bfloat16 input become bfloat16)."""
    if array.__class__ is not np.ndarray and gpu.is_device_buffer(array):
        out = tf.experimental.dlpack.from_dlpack(array.toDlpack())
        return tf.bitcast(out, tf.bfloat16) if dtype == tf.bfloat16 and out.dtype == tf.int16 else out
    if array.size:
        if not (is_aligned(array) and array.flags.writeable):
            aligned = aligned_empty(array.shape, array.dtype)
            np.copyto(aligned, array)
            array = aligned
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except Exception:  # noqa: BLE001 - dtypes DLPack lacks
            pass
    return tf.convert_to_tensor(array)


def _aligned_copy(tensor: Any) -> np.ndarray:
    src = _numpy_in(tensor)
    buf = aligned_empty(src.shape, src.dtype)
    np.copyto(buf, src)
    return buf


def _in_xla_context() -> bool:
    try:
        from tensorflow.python.ops import control_flow_util
        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except Exception:  # noqa: BLE001 - private API moved: assume no XLA
        return False


class MismatchError(tf.errors.FailedPreconditionError, HpcvodMismatchError):
    """Ranks submitted the same collective with different shapes, dtypes, ops or roots: Horovod's
    ``tf.errors.FailedPreconditionError``, still an ``HpcvodMismatchError`` for hpcvod's own handlers."""

    def __init__(self, message: str) -> None:
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class InputError(tf.errors.InvalidArgumentError, HpcvodInputError):
    """A collective's argument is invalid on this rank: ``tf.errors.InvalidArgumentError`` (what TensorFlow code
    expects from an op), still an ``HpcvodInputError``."""

    def __init__(self, message: str) -> None:
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


def _as_tf_error(exc: BaseException) -> BaseException:
    """The ``tf.errors`` class Horovod raises for a runtime error (the error itself where there is none)."""
    if isinstance(exc, tf.errors.OpError):
        return exc
    if isinstance(exc, HpcvodMismatchError):
        return MismatchError(str(exc))
    if isinstance(exc, HpcvodInputError):
        return InputError(str(exc))
    return exc


def _call_mapped(eager_fn: Callable[..., Any], args: Sequence[Any]) -> list[Any]:
    try:
        outs = eager_fn(*args)
    except (HpcvodMismatchError, HpcvodInputError) as exc:
        mapped = _as_tf_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _failed_precondition(label: str) -> tf.Tensor:
    """An op that fails with ``tf.errors.FailedPreconditionError`` when it runs. A ``py_function`` can raise only
    Unknown/InvalidArgument/Unimplemented... errors; Horovod's graph ops raise FailedPrecondition for a mismatch,
    and reading a variable nobody created is TensorFlow's own FailedPrecondition (its name carries the message)."""
    handle = tf.raw_ops.VarHandleOp(dtype=tf.int32, shape=[], shared_name=(
        f"hpcvod: collective {label} differs across ranks (shape, dtype, op or root); each rank printed the "
        f"details to stderr"))
    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int32, name="hpcvod_collective_mismatch")


# The last hpcvod op built in each TF1-style graph (see _graph_op).
_last_op: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_outside_chain = [0]   # > 0 while unchained_graph_ops() is active


@contextlib.contextmanager
def unchained_graph_ops() -> Iterator[None]:
    """TF1 collectives built inside stay out of the chain (see _graph_op): for an op run on its own, such as
    ``broadcast_global_variables`` run by a hook at session start, before the training ops built earlier ever run
    (chained, it would wait for them and need their feeds)."""
    _outside_chain[0] += 1
    try:
        yield
    finally:
        _outside_chain[0] -= 1


def _graph_op(eager_fn: Callable[..., Any], inputs: list[Any], out_dtypes: list[tf.DType], label: str) -> list[Any]:
    """``eager_fn`` as a ``tf.py_function`` node whose mismatch errors surface as FailedPreconditionError.

    In a ``tf.function`` the automatic control dependencies run stateful ops in program order, the same on every
    rank. A TF1 graph (``tf.compat.v1``, sessions) has none: its executor runs independent ops in any order, a
    different one on each rank, and each op blocks an executor thread until its partners come, so with more
    independent collectives than threads the ranks wait on different ones. There each hpcvod op waits for the
    previous one built in the graph (Horovod's graph ops need no such chain: they are asynchronous kernels), so
    running an op also runs the collectives built before it (unchained_graph_ops() for an op run on its own).
    Chaining only to ops not yet run is not enough: a later run may fetch earlier ops again beside new ones.
    """
    def body(*args: Any) -> list[Any]:
        try:
            outs = _call_mapped(eager_fn, args)
        except MismatchError as exc:
            print(f"hpcvod rank {rt.rank()}: {exc.message}", file=sys.stderr, flush=True)
            return [tf.zeros([], d) for d in out_dtypes] + [tf.constant(1)]
        return outs + [tf.constant(0)]

    graph = tf.compat.v1.get_default_graph()
    chained = not isinstance(graph, _FuncGraph) and not _outside_chain[0]
    previous = _last_op.get(graph) if chained else None
    with tf.control_dependencies([] if previous is None else [previous]):
        outs = tf.py_function(body, inputs, list(out_dtypes) + [tf.int32])
    status = outs[-1]
    check = tf.cond(tf.equal(status, 0), lambda: tf.constant(0), lambda: _failed_precondition(label))
    with tf.control_dependencies([check]):
        results = [tf.identity(o) for o in outs[:-1]]
    if chained:
        _last_op[graph] = check.op
    return results


def _run(eager_fn: Callable[..., Any], inputs: list[Any], out_dtypes: list[tf.DType],
         label: str | None = None) -> list[tf.Tensor]:
    """Runs ``eager_fn`` now (eager mode) or as a graph node (inside ``tf.function`` or a TF1 graph), with the
    runtime's errors as the ``tf.errors`` classes Horovod raises."""
    if tf.executing_eagerly():
        return _call_mapped(eager_fn, inputs)
    if _in_xla_context():
        raise RuntimeError("hpcvod collectives cannot run inside an XLA-compiled function: use "
                           "jit_compile=False (model.compile(..., jit_compile=False) or tf.function without "
                           "jit_compile)")
    return _graph_op(eager_fn, inputs, out_dtypes, "(unnamed)" if label is None else repr(label))


def _graph_name(kind: str, tensors: Sequence[Any], name: str | None) -> str | None:
    """Horovod's name for an unnamed op in a TF1 graph: the kind and its input tensors' graph names (made unique
    in the graph), so that ranks pair the same ops whatever order they run them in. Eager ops and ops in a
    ``tf.function`` (run in program order) keep the runtime's automatic names, which pair by position: tensor
    names there come from Python-side counters (Keras layer names) that need not agree across ranks."""
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    if name is not None or graph is None or isinstance(graph, _FuncGraph):
        return name
    base = f"Horovod{kind}_" + re.sub("[^a-zA-Z0-9_]", "_", "_".join(t.name for t in tensors))
    return graph.unique_name(base, mark_as_used=True)


def _widen(tensor: tf.Tensor) -> tuple[tf.Tensor, tf.DType | None]:
    """bfloat16 as float32 for the host path; an eager GPU tensor stays bfloat16 (NCCL reduces it natively). A
    graph tensor's device is unknown when the graph is built: it is widened by a cast on its own device."""
    wide = _WIDENED.get(tensor.dtype)
    if wide is None or (tf.executing_eagerly() and _on_gpu(tensor)):
        return tensor, None
    return tf.cast(tensor, wide), tensor.dtype


def _narrow(tensor: tf.Tensor, dtype: tf.DType | None) -> tf.Tensor:
    return tensor if dtype is None else tf.cast(tensor, dtype)


# ---------------------------------------------------------------------------------------------- eager bodies
def _eager_allreduce(t: tf.Tensor, name: str | None, op: Any, pre: float, post: float, ps: Any) -> tf.Tensor:
    if _on_gpu(t):
        return _tensor_out(rt.allreduce(_device_in(t), name=name, op=op, prescale_factor=pre,
                                        postscale_factor=post, process_set=ps), t.dtype)
    buf = _aligned_copy(t)
    rt.allreduce_(buf, name=name, op=op, prescale_factor=pre, postscale_factor=post, process_set=ps)
    return _tensor_out(buf)


def _eager_grouped_allreduce(tensors: Sequence[tf.Tensor], name: str | None, op: Any, pre: float, post: float,
                             ps: Any) -> list[tf.Tensor]:
    """One in-place allreduce per dtype over a packed aligned buffer; results are views of it. GPU tensors: one
    grouped allreduce on the device (the runtime fuses it)."""
    if all(_on_gpu(t) for t in tensors):
        outs = rt.grouped_allreduce([_device_in(t) for t in tensors], name=name, op=op, prescale_factor=pre,
                                    postscale_factor=post, process_set=ps)
        return [_tensor_out(o, t.dtype) for o, t in zip(outs, tensors)]
    arrays = [_numpy_in(t) for t in tensors]
    by_dtype: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    results: list[Any] = [None] * len(arrays)
    for dtype, indices in by_dtype.items():
        buffer, views = pack_aligned([arrays[i] for i in indices])
        group_name = None if name is None else (name if len(by_dtype) == 1 else f"{name}.{dtype}")
        rt.allreduce_(buffer, name=group_name, op=op, prescale_factor=pre, postscale_factor=post,
                      process_set=ps)
        for i, view in zip(indices, views):
            results[i] = _tensor_out(view)
    return results


def _eager_allgather(t: tf.Tensor, name: str | None, ps: Any) -> tf.Tensor:
    return _tensor_out(rt.allgather(_runtime_in(t), name=name, process_set=ps), t.dtype)


def _eager_broadcast(t: tf.Tensor, root_rank: int, name: str | None, ps: Any) -> tf.Tensor:
    if _on_gpu(t):
        return _tensor_out(rt.broadcast(_device_in(t), root_rank, name=name, process_set=ps), t.dtype)
    buf = _aligned_copy(t)
    rt.broadcast_(buf, root_rank, name=name, process_set=ps)
    return _tensor_out(buf)


def _eager_alltoall(t: tf.Tensor, splits: Any, name: str | None, ps: Any) -> list[tf.Tensor]:
    array = _runtime_in(t)
    size = set_rank_size(ps)[1]
    rows = t.shape[0] if t.shape.rank else None
    if splits is None and rows is not None and rows % size == 0:
        # equal parts, as explicit splits: the runtime then also says how many rows came from each rank (ranks
        # may send different numbers of rows; the gradient sends them back with these)
        splits = np.full(size, rows // size, dtype=np.int32)
    splits_array = None if splits is None else np.asarray(_numpy_in(splits), dtype=np.int32)
    output, received = rt.alltoall(array, splits=splits_array, name=name, process_set=ps)
    return [_tensor_out(output, t.dtype), tf.constant(np.asarray(received, dtype=np.int32))]


def _eager_reducescatter(t: tf.Tensor, name: str | None, op: Any, pre: float, post: float, ps: Any) -> tf.Tensor:
    out = rt.reducescatter(_runtime_in(t), name=name, op=op, prescale_factor=pre, postscale_factor=post,
                           process_set=ps)
    return _tensor_out(out, t.dtype)


# ---------------------------------------------------------------------------------------------- differentiable ops
# Gradients as Horovod defines them (horovod/tensorflow/mpi_ops.py): allreduce -> the same allreduce of the
# gradient; allgather -> the Average allreduce of the gradient, cut to this rank's rows; broadcast -> the Average
# allreduce of the gradient on the root, zeros elsewhere; alltoall -> alltoall back with the received splits;
# reducescatter -> allgather of the gradient times size for Sum (times 1 for Average), times pre- and postscale.
def _reduce_dense(tensor: tf.Tensor, name: str | None, op: Any, pre: float, post: float, ps: Any) -> tf.Tensor:
    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        label = _graph_name("Allreduce", [x], name)
        y = _run(lambda t: _eager_allreduce(t, label, op, pre, post, ps), [x], [x.dtype], label)[0]
        y.set_shape(x.shape)

        def grad(dy: tf.Tensor) -> tf.Tensor:
            if op not in (rt.Average, rt.Sum):
                raise NotImplementedError(f"allreduce with op={op} has no gradient (only Average and Sum do)")
            return _reduce_dense(dy, None, op, pre, post, ps)
        return y, grad

    wide, dtype = _widen(tf.convert_to_tensor(tensor))
    return _narrow(forward(wide), dtype)


def _reduce_grouped(tensors: Sequence[tf.Tensor], name: str | None, op: Any, pre: float, post: float,
                    ps: Any) -> list[tf.Tensor]:
    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        label = _graph_name("GroupedAllreduce", [xs[0], xs[-1]], name)
        ys = _run(lambda *ts: _eager_grouped_allreduce(ts, label, op, pre, post, ps), list(xs),
                  [x.dtype for x in xs], label)
        for y, x in zip(ys, xs):
            y.set_shape(x.shape)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            if op not in (rt.Average, rt.Sum):
                raise NotImplementedError(f"grouped_allreduce with op={op} has no gradient")
            return _reduce_grouped(dys, None, op, pre, post, ps)
        return ys, grad

    widened = [_widen(tf.convert_to_tensor(t)) for t in tensors]
    outs = forward(*[w for w, _ in widened])
    return [_narrow(o, d) for o, (_, d) in zip(outs, widened)]


def _gather(tensor: tf.Tensor, name: str | None, ps: Any) -> tf.Tensor:
    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        label = _graph_name("Allgather", [x], name)
        y = _run(lambda t: _eager_allgather(t, label, ps), [x], [x.dtype], label)[0]
        y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))

        def grad(dy: tf.Tensor) -> tf.Tensor:
            return _gather_grad(dy, x, ps)
        return y, grad

    wide, dtype = _widen(tf.convert_to_tensor(tensor))
    return _narrow(forward(wide), dtype)


def _bcast(tensor: tf.Tensor, root_rank: int, name: str | None, ps: Any) -> tf.Tensor:
    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        label = _graph_name("Broadcast", [x], name)
        y = _run(lambda t: _eager_broadcast(t, root_rank, label, ps), [x], [x.dtype], label)[0]
        y.set_shape(x.shape)

        def grad(dy: tf.Tensor) -> tf.Tensor:
            averaged = _reduce_dense(dy, None, rt.Average, 1.0, 1.0, ps)
            return averaged if rt.rank() == root_rank else averaged * 0
        return y, grad

    wide, dtype = _widen(tf.convert_to_tensor(tensor))
    return _narrow(forward(wide), dtype)


def _exchange(tensor: tf.Tensor, splits: Any, name: str | None, ps: Any) -> tuple[tf.Tensor, tf.Tensor]:
    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        label = _graph_name("Alltoall", [x], name)
        inputs = [x] if splits is None else [x, tf.cast(splits, tf.int32)]
        y, received = _run(lambda t, *s: _eager_alltoall(t, s[0] if s else None, label, ps), inputs,
                           [x.dtype, tf.int32], label)
        y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))
        received.set_shape([set_rank_size(ps)[1]])

        def grad(dy: tf.Tensor, _d_received: Any = None) -> tf.Tensor:
            return _exchange(dy, received, None, ps)[0]
        return (y, received), grad

    wide, dtype = _widen(tf.convert_to_tensor(tensor))
    y, received = forward(wide)
    return _narrow(y, dtype), tf.stop_gradient(received)


def _scatter(tensor: tf.Tensor, name: str | None, op: Any, pre: float, post: float, ps: Any) -> tf.Tensor:
    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        label = _graph_name("Reducescatter", [x], name)
        y = _run(lambda t: _eager_reducescatter(t, label, op, pre, post, ps), [x], [x.dtype], label)[0]
        y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))

        def grad(dy: tf.Tensor) -> tf.Tensor:
            return _scatter_grad(dy, op, pre, post, ps)
        return y, grad

    wide, dtype = _widen(tf.convert_to_tensor(tensor))
    return _narrow(forward(wide), dtype)


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
    """A grouped allgather/reducescatter as one node (one link of a TF1 graph's chain, one negotiation); the
    gradient of each output is that of the single op (``grad_one(dy, x)``), as in Horovod."""
    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        label = _graph_name(kind, [xs[0], xs[-1]], name)
        ys = _run(lambda *ts: [_tensor_out(a, t.dtype) for a, t in zip(eager_group([_runtime_in(t) for t in ts],
                                                                                  label), ts)], list(xs),
                  [x.dtype for x in xs], label)
        for y, x in zip(ys, xs):
            y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            return [grad_one(dy, x) for dy, x in zip(dys, xs)]
        return ys, grad

    widened = [_widen(tf.convert_to_tensor(t)) for t in tensors]
    outs = forward(*[w for w, _ in widened])
    return [_narrow(o, d) for o, (_, d) in zip(outs, widened)]


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
@_not_converted
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


@_not_converted
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


@_not_converted
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: Any = global_process_set) -> tf.Tensor:
    """Concatenates every rank's tensor along the first dimension (sizes may differ; differentiable)."""
    return _gather(tf.convert_to_tensor(tensor), name, process_set)


@_not_converted
def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: Any = global_process_set) -> list[tf.Tensor]:
    """Allgathers several tensors as one operation (differentiable)."""
    if not tensors:
        return []
    return _grouped("GroupedAllgather", lambda arrays, n: rt.grouped_allgather(arrays, name=n, process_set=process_set),
                    lambda dy, x: _gather_grad(dy, x, process_set), tensors, name)


@_not_converted
def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: Any = global_process_set) -> tf.Tensor:
    """Returns ``root_rank``'s value of ``tensor`` (differentiable: the root's input gets the summed gradient)."""
    return _bcast(tf.convert_to_tensor(tensor), root_rank, name, process_set)


@_not_converted
def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: Any = global_process_set) -> Any:
    """Scatters slices of ``tensor`` (first dimension) to every rank and gathers what they send. Returns the
    gathered tensor, plus the received splits when ``splits`` is given (Horovod's shape; differentiable)."""
    output, received = _exchange(tf.convert_to_tensor(tensor), splits, name, process_set)
    return output if splits is None else (output, received)


@_not_converted
def reducescatter(tensor: Any, device_dense: str = "", compression: type[Compressor] = Compression.none,
                  op: Any = None, name: str | None = None, process_set: Any = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduces ``tensor`` over all ranks and returns this rank's slice of the first dimension (differentiable)."""
    op = rt.Average if op is None else op
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    out = _scatter(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


@_not_converted
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


@_not_converted
def join() -> tf.Tensor:
    """Marks this rank as out of data; once every rank has joined, returns the rank that joined last (a scalar
    int32 tensor, as Horovod's op; in a ``tf.function`` it joins when the graph runs)."""
    return _run(lambda: tf.constant(rt.join(), dtype=tf.int32), [], [tf.int32])[0]


@_not_converted
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
