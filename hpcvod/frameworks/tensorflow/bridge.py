"""TensorFlow tensors and the runtime's arrays, and collectives as graph ops (mpi_ops.py builds on it).

Eager tensors reach the runtime through DLPack: a read-only NumPy view of the tensor's own memory. Results leave
through DLPack too, from 64-byte-aligned NumPy buffers (TensorFlow aborts on less-aligned ones). Inside a graph
each collective is a ``tf.py_function`` around the eager code (in TF1-style graphs an asynchronous node, paired across
ranks by name); runtime errors become TensorFlow's own error types.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import hpcvod.runtime as rt
from hpcvod.runtime import gpu
from hpcvod.runtime.errors import HpcvodInputError, HpcvodMismatchError, HpcvodNotInitializedError
from hpcvod.frameworks._common import aligned_empty, is_aligned, numpy_view_of_capsule

# AutoGraph must not rewrite hpcvod's Python (it would trace into the runtime): run it as written.
not_converted = tf.autograph.experimental.do_not_convert

try:
    from tensorflow.python.framework.func_graph import FuncGraph as _FuncGraph
except ImportError:  # private module moved: treat every graph as a TF1 graph (asynchronous nodes; still correct)
    _FuncGraph = ()

# dtypes NumPy cannot reduce natively travel as float32 (on the host; GPU tensors keep bfloat16, see widen)
WIDENED = {tf.bfloat16: tf.float32}


# ---------------------------------------------------------------------------------------------- tensor <-> NumPy
def on_gpu(t: Any) -> bool:
    """A non-empty GPU tensor the runtime takes as it is (DLPack to CuPy, collectives on NCCL): needs CuPy here.
    An empty one (or one of unknown shape) takes the host path, bfloat16 widened, like a CPU tensor."""
    return "GPU" in getattr(t, "device", "") and bool(t.shape.num_elements()) and gpu.probe()[0] is not None


def device_in(t: tf.Tensor) -> Any:
    """A GPU tensor for the runtime, no copy: itself (DLPack), or a bfloat16 one's int16 words, tagged."""
    return gpu.Bfloat16Words(tf.bitcast(t, tf.int16)) if t.dtype == tf.bfloat16 else t


def runtime_in(tensor: Any) -> Any:
    """What a collective that does not write into its input gets: a GPU tensor as it is, else a NumPy view."""
    t = tf.convert_to_tensor(tensor)
    return device_in(t) if on_gpu(t) else numpy_in(t)


def numpy_in(tensor: Any) -> np.ndarray:
    """A (read-only) NumPy view of an eager tensor's memory; a copy only where DLPack cannot export it."""
    t = tf.convert_to_tensor(tensor)
    if t.shape.num_elements() and "GPU" not in t.device:
        try:
            return numpy_view_of_capsule(tf.experimental.dlpack.to_dlpack(t))
        except Exception:  # noqa: BLE001 - dtypes DLPack lacks (bool, string): fall back to a copy
            pass
    return np.asarray(t.numpy())


def tensor_out(array: Any, dtype: tf.DType | None = None) -> tf.Tensor:
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


def aligned_copy(tensor: Any) -> np.ndarray:
    src = numpy_in(tensor)
    buf = aligned_empty(src.shape, src.dtype)
    np.copyto(buf, src)
    return buf


def in_xla_context() -> bool:
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


class NotInitializedError(tf.errors.FailedPreconditionError, HpcvodNotInitializedError):
    """A collective before ``hvd.init()`` or after ``hvd.shutdown()``: Horovod's op fails its "not initialized"
    check with ``tf.errors.FailedPreconditionError``; still an ``HpcvodNotInitializedError`` (a ValueError, which
    Horovod's allreduce raises there, asking the process set's size first)."""

    def __init__(self, message: str) -> None:
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


def as_tf_error(exc: BaseException) -> BaseException:
    """The ``tf.errors`` class Horovod raises for a runtime error (the error itself where there is none)."""
    if isinstance(exc, tf.errors.OpError):
        return exc
    if isinstance(exc, HpcvodMismatchError):
        return MismatchError(str(exc))
    if isinstance(exc, HpcvodInputError):
        return InputError(str(exc))
    if isinstance(exc, HpcvodNotInitializedError):
        return NotInitializedError(str(exc))
    return exc


def call_mapped(eager_fn: Callable[..., Any], args: Sequence[Any]) -> list[Any]:
    try:
        outs = eager_fn(*args)
    except (HpcvodMismatchError, HpcvodInputError, HpcvodNotInitializedError) as exc:
        mapped = as_tf_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def failed_precondition(label: str) -> tf.Tensor:
    """An op that fails with ``tf.errors.FailedPreconditionError`` when it runs. A ``py_function`` can raise only
    Unknown/InvalidArgument/Unimplemented... errors; Horovod's graph ops raise FailedPrecondition for a mismatch,
    and reading a variable nobody created is TensorFlow's own FailedPrecondition (its name carries the message)."""
    handle = tf.raw_ops.VarHandleOp(dtype=tf.int32, shape=[], shared_name=(
        f"hpcvod: collective {label} differs across ranks (shape, dtype, op or root); each rank printed the "
        f"details to stderr"))
    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int32, name="hpcvod_collective_mismatch")


def graph_op(eager_fn: Callable[..., Any], inputs: list[Any], out_dtypes: list[tf.DType], label: str) -> list[Any]:
    """``eager_fn`` as graph nodes whose mismatch errors surface as FailedPreconditionError.

    In a ``tf.function`` one ``tf.py_function`` node: the automatic control dependencies run stateful ops in
    program order, the same on every rank. A TF1 graph (``tf.compat.v1``, sessions) runs independent ops in any
    order, a different one on each rank; the ranks pair them by name (graph_name), and each op runs only when a
    fetch depends on it, as Horovod's asynchronous kernels do (see asynchronous_node).
    """
    def body(*args: Any) -> list[Any]:
        try:
            outs = call_mapped(eager_fn, args)
        except MismatchError as exc:
            print(f"hpcvod rank {rt.rank()}: {exc.message}", file=sys.stderr, flush=True)
            return [tf.zeros([], d) for d in out_dtypes] + [tf.constant(1)]
        return outs + [tf.constant(0)]

    dtypes = list(out_dtypes) + [tf.int32]
    if isinstance(tf.compat.v1.get_default_graph(), _FuncGraph):
        outs = tf.py_function(body, inputs, dtypes)
    else:
        outs = asynchronous_node(body, inputs, dtypes)
    status = outs[-1]
    check = tf.cond(tf.equal(status, 0), lambda: tf.constant(0), lambda: failed_precondition(label))
    with tf.control_dependencies([check]):
        return [tf.identity(o) for o in outs[:-1]]


def asynchronous_node(body: Callable[..., list[Any]], inputs: list[Any], dtypes: list[tf.DType]) -> list[Any]:
    """``body(*inputs)`` in a TF1 graph without holding one of the session's inter-op threads while it waits.

    A collective waits for its partners on the other ranks. A ``py_function`` that waits blocks an executor
    thread, and with more ready collectives than threads (2 on a 2-core node) the ranks, running independent ops
    in different orders, can each wait on ops the others have not started. So the node is two: a ``py_function``
    that only hands this run's inputs over (it never waits), and the ``get_next`` of a one-element-per-run
    ``tf.data`` iterator whose map runs ``body``. ``get_next`` is an asynchronous kernel, run on a thread of its
    own (as Horovod's ops are asynchronous kernels completed by its background thread), so any number of
    collectives can wait at once, all submitted to the engine, which negotiates and fuses them.
    """
    handed: list[tuple[Any, ...]] = []

    def hand_over(*args: Any) -> tf.Tensor:
        handed[:] = [args]          # the latest run's inputs: a run cut short leaves nothing stale behind
        return tf.constant(0)

    def run_body() -> list[Any]:
        return body(*handed.pop())

    # the iterator outside any control-flow context or control dependencies of the caller; tf.data runs on the CPU
    with tf.init_scope(), tf.device("/cpu:0"):
        dataset = tf.data.Dataset.from_tensors(0).repeat().map(
            lambda _: tuple(tf.py_function(run_body, [], dtypes)))
        options = tf.data.Options()
        options.autotune.enabled = False                    # no prefetching: one collective per run, when fetched
        options.experimental_optimization.apply_default_optimizations = False
        options.experimental_optimization.inject_prefetch = False
        options.experimental_warm_start = False
        iterator = tf.compat.v1.data.make_one_shot_iterator(dataset.with_options(options))
    handed_over = tf.py_function(hand_over, inputs, tf.int32)
    with tf.control_dependencies([handed_over]), tf.device("/cpu:0"):
        return list(iterator.get_next())


def run_op(eager_fn: Callable[..., Any], inputs: list[Any], out_dtypes: list[tf.DType],
         label: str | None = None) -> list[tf.Tensor]:
    """Runs ``eager_fn`` now (eager mode) or as a graph node (inside ``tf.function`` or a TF1 graph), with the
    runtime's errors as the ``tf.errors`` classes Horovod raises."""
    if tf.executing_eagerly():
        return call_mapped(eager_fn, inputs)
    if in_xla_context():
        raise RuntimeError("hpcvod collectives cannot run inside an XLA-compiled function: use "
                           "jit_compile=False (model.compile(..., jit_compile=False) or tf.function without "
                           "jit_compile)")
    return graph_op(eager_fn, inputs, out_dtypes, "(unnamed)" if label is None else repr(label))


def graph_name(kind: str, tensors: Sequence[Any], name: str | None) -> str | None:
    """Horovod's name for an unnamed op in a TF1 graph: the kind and its input tensors' graph names (made unique
    in the graph), so that ranks pair the same ops whatever order they run them in. Eager ops and ops in a
    ``tf.function`` (run in program order) keep the runtime's automatic names, which pair by position: tensor
    names there come from Python-side counters (Keras layer names) that need not agree across ranks."""
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    if name is not None or graph is None or isinstance(graph, _FuncGraph):
        return name
    base = f"Horovod{kind}_" + re.sub("[^a-zA-Z0-9_]", "_", "_".join(t.name for t in tensors))
    return graph.unique_name(base, mark_as_used=True)


def widen(tensor: tf.Tensor) -> tuple[tf.Tensor, tf.DType | None]:
    """bfloat16 as float32 for the host path; an eager GPU tensor stays bfloat16 (NCCL reduces it natively). A
    graph tensor's device is unknown when the graph is built: it is widened by a cast on its own device."""
    wide = WIDENED.get(tensor.dtype)
    if wide is None or (tf.executing_eagerly() and on_gpu(tensor)):
        return tensor, None
    return tf.cast(tensor, wide), tensor.dtype


def narrow(tensor: tf.Tensor, dtype: tf.DType | None) -> tf.Tensor:
    return tensor if dtype is None else tf.cast(tensor, dtype)
