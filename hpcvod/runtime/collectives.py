"""The collectives of ``hpcvod.runtime`` over NumPy-compatible buffers.

Every function accepts a ``numpy.ndarray`` or anything NumPy can view without a copy (buffer protocol,
``__array_interface__``, DLPack). In-place forms (``allreduce_``, ``allreduce_async_``, ``broadcast_``)
write into the caller's memory; the others return new arrays. ``*_async*`` forms return a
:class:`~hpcvod.runtime.handles.Handle` for :func:`poll` / :func:`synchronize`.

allreduce and its forms live in reduction.py, the views of the caller's tensors in tensors.py, ``poll`` and
``synchronize`` in handles.py; all are importable from here.

Framework wrappers: pass a NumPy view of the framework tensor's memory (``torch_tensor.numpy()``,
``np.from_dlpack(x)``), use the in-place forms, or pass ``out=`` (an array of the result's shape and dtype,
written in place) so that results land in framework-owned memory without an extra copy.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import context, gpu
from . import handles as K
from .reduction import (allreduce, allreduce_, allreduce_async, allreduce_async_, grouped_allreduce,
                        grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, group_names,
                        lane_of, resolve_op)
from .compression import Compression, Compressor
from .engine import dumps, loads
from .errors import HpcvodInputError
from .handles import AnyHandle, GroupHandle, Handle, Signature, poll, synchronize
from .process_sets import ProcessSet, global_process_set
from .tables import ADASUM, AVERAGE, MAX, MIN, PRODUCT, SUM, mpi_reduce_op, mpi_type
from .tensors import (as_array, check_out, contiguous_work, copy_into, decompress_into, device_input, device_out,
                      device_view, element_of, on_device)

# Reduction ops, numbered like Horovod's.
Average = AVERAGE
Sum = SUM
Adasum = ADASUM
Min = MIN
Max = MAX
Product = PRODUCT

_ndarray = np.ndarray

__all__ = [
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "AnyHandle", "Handle", "GroupHandle", "as_array",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "barrier", "join", "broadcast_object", "allgather_object", "poll", "synchronize",
]


# ------------------------------------------------------------------------- allgather & friends
def _plain_handle(kind: int, tensor: Any, name: str | None, process_set: ProcessSet, a: np.ndarray,
                  output: np.ndarray | None = None, **fields: Any) -> Handle:
    """The handle of a collective other than allreduce; ``fields``: its signature's (shape, op, root...)."""
    lane = lane_of(process_set)
    t = mpi_type(a.dtype)
    sig = Signature(kind, element_of(tensor, a), **fields)
    if name is None:
        h = Handle(lane.auto_name(), kind, sig, a, output, True)
    else:
        h = Handle(name, kind, sig, a, output)
    h.mpi_type = t
    h.lane = lane
    return h


def _allgather_handle(tensor: Any, name: str | None, process_set: ProcessSet) -> Handle:
    d = device_input(tensor, "allgather")
    if d is not None:
        d = d.reshape(1) if d.ndim == 0 else d
        return on_device(_plain_handle(K.ALLGATHER, tensor, name, process_set, d, shape=d.shape[1:], device=True))
    a = as_array(tensor)
    if a.ndim == 0:
        a = a.reshape(1)
    a, _ = contiguous_work(a, False)
    return _plain_handle(K.ALLGATHER, tensor, name, process_set, a, shape=a.shape[1:])


def allgather_async(tensor: Any, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start concatenating every rank's ``tensor`` along the first dimension (which may differ per rank)."""
    h = _allgather_handle(tensor, name, process_set)
    h.lane.submit(h)
    return h


def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order."""
    h = _allgather_handle(tensor, name, process_set)
    return h.lane.run(h)


def grouped_allgather_async(tensors: Sequence[Any], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> GroupHandle:
    """Start allgathers of several tensors, negotiated together."""
    lane = lane_of(process_set)
    names = group_names(lane, name, "grouped_allgather", len(tensors))
    hs = [_allgather_handle(t, n, process_set) for t, n in zip(tensors, names)]
    lane.submit_many(hs)
    return GroupHandle(hs)


def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Allgather several tensors; returns the list of results."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def _broadcast_handle(tensor: Any, root_rank: int, name: str | None, process_set: ProcessSet,
                      in_place: bool, out: Any = None) -> Handle:
    lane = lane_of(process_set)
    try:
        root_index = lane.ranks.index(int(root_rank))
    except (ValueError, TypeError):
        raise HpcvodInputError(f"broadcast: root_rank={root_rank!r} is not a rank of {process_set!r} "
                               f"(ranks {lane.ranks})") from None
    if tensor.__class__ is not _ndarray and gpu.is_device_buffer(tensor):
        d = device_view(tensor, in_place, "broadcast")
        output = d if in_place else (device_out(out, d, "broadcast") if out is not None else None)
        h = _plain_handle(K.BROADCAST, tensor, name, process_set, d, output, shape=d.shape, root=int(root_rank),
                          device=True)
        h.root = root_index
        return on_device(h)
    a = as_array(tensor, writable=in_place)
    a, copy_back = contiguous_work(a, in_place)
    output = a if in_place else (check_out(out, a.shape, a.dtype) if out is not None else None)
    h = _plain_handle(K.BROADCAST, tensor, name, process_set, a, output, shape=a.shape, root=int(root_rank))
    h.root = root_index
    if copy_back is not None:
        h.finish = copy_into(copy_back)
    return h


def broadcast_async(tensor: Any, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set, *, out: Any = None) -> Handle:
    """Start sending ``root_rank``'s ``tensor`` to every rank (result: a new array)."""
    h = _broadcast_handle(tensor, root_rank, name, process_set, False, out)
    h.lane.submit(h)
    return h


def broadcast_async_(tensor: Any, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """In-place ``broadcast_async``: ``tensor`` receives root's data."""
    h = _broadcast_handle(tensor, root_rank, name, process_set, True)
    h.lane.submit(h)
    return h


def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set, *, out: Any = None) -> np.ndarray:
    """Return ``root_rank``'s ``tensor`` on every rank."""
    h = _broadcast_handle(tensor, root_rank, name, process_set, False, out)
    h.lane.run(h)
    return synchronize(h)


def broadcast_(tensor: Any, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> np.ndarray:
    """In-place broadcast: ``tensor`` receives root's data and is returned."""
    h = _broadcast_handle(tensor, root_rank, name, process_set, True)
    h.lane.run(h)
    return synchronize(h)


def _alltoall_handle(tensor: Any, splits: Any, name: str | None, process_set: ProcessSet) -> Handle:
    lane = lane_of(process_set)
    d = device_input(tensor, "alltoall")
    a = d if d is not None else as_array(tensor)
    if a.ndim == 0:
        raise HpcvodInputError("alltoall: the tensor needs at least one dimension")
    if d is None:
        a, _ = contiguous_work(a, False)
    n = lane.size
    if splits is None:
        if a.shape[0] % n:
            raise HpcvodInputError(f"alltoall: first dimension {a.shape[0]} is not divisible by the "
                                   f"{n} ranks of the process set; pass splits=")
        s = np.full(n, a.shape[0] // n, np.int64)
    else:
        s = np.asarray(as_array(splits) if not isinstance(splits, (list, tuple)) else splits).astype(np.int64)
        if s.shape != (n,) or (s < 0).any() or int(s.sum()) != a.shape[0]:
            raise HpcvodInputError(f"alltoall: splits must be {n} non-negative integers summing to the first "
                                   f"dimension {a.shape[0]}, got {s.tolist()}")
    h = _plain_handle(K.ALLTOALL, tensor, name, process_set, a, shape=a.shape[1:], device=d is not None)
    if d is not None:
        on_device(h)
    h.splits = np.ascontiguousarray(s)
    if splits is None:
        h.finish = _first_of_pair
    return h


def _first_of_pair(result: tuple) -> Any:
    return result[0]


def alltoall_async(tensor: Any, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start an alltoall (see :func:`alltoall`)."""
    h = _alltoall_handle(tensor, splits, name, process_set)
    h.lane.submit(h)
    return h


def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[i]`` rows of ``tensor`` to rank i (equal parts without ``splits``).

    Returns the rows received, concatenated in rank order; with ``splits`` given, returns
    ``(received, received_splits)``.
    """
    h = _alltoall_handle(tensor, splits, name, process_set)
    h.lane.run(h)
    return synchronize(h)


def _reducescatter_handle(tensor: Any, name: str | None, op: int | None, process_set: ProcessSet,
                          prescale_factor: float, postscale_factor: float,
                          compression: type[Compressor]) -> Handle:
    lane = lane_of(process_set)
    d = device_input(tensor, "reducescatter") if compression is Compression.none else None
    a = d if d is not None else as_array(tensor)
    if a.ndim == 0:
        raise HpcvodInputError("reducescatter: the tensor needs at least one dimension")
    finish = None
    if d is None and compression is not Compression.none:   # (compressed reducescatters stay on the host)
        compressed, ctx = compression.compress(a)
        if compressed is not a:
            finish = decompress_into(compression, ctx, None)
            a = compressed
    if d is None:
        a, _ = contiguous_work(a, False)
    op = resolve_op(op, None)
    if op == ADASUM:
        raise HpcvodInputError("reducescatter: op=Adasum is not supported (Horovod's neither); use Sum or Average")
    mpi_op = mpi_reduce_op(op, a.dtype)
    pre, post = float(prescale_factor), float(postscale_factor)
    h = _plain_handle(K.REDUCESCATTER, tensor, name, process_set, a, shape=a.shape, op=op, prescale=pre,
                      postscale=post, device=d is not None)
    if d is not None:
        on_device(h)
    h.mpi_op = mpi_op
    h.prescale = pre
    h.postscale = post / lane.size if op == AVERAGE else post
    h.finish = finish
    return h


def reducescatter_async(tensor: Any, name: str | None = None, op: int | None = None,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0,
                        compression: type[Compressor] = Compression.none) -> Handle:
    """Start a reducescatter (see :func:`reducescatter`)."""
    h = _reducescatter_handle(tensor, name, op, process_set, prescale_factor, postscale_factor, compression)
    h.lane.submit(h)
    return h


def reducescatter(tensor: Any, name: str | None = None, compression: type[Compressor] = Compression.none,
                  op: int | None = None, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce ``tensor`` over the ranks (default Average) and return this rank's block of the first dimension.

    The first dimension is split as evenly as possible; the first ``dim0 % size`` ranks get one extra row.
    """
    h = _reducescatter_handle(tensor, name, op, process_set, prescale_factor, postscale_factor, compression)
    h.lane.run(h)
    return synchronize(h)


def grouped_reducescatter_async(tensors: Sequence[Any], name: str | None = None, op: int | None = None,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0,
                                compression: type[Compressor] = Compression.none) -> GroupHandle:
    """Start reducescatters of several tensors, negotiated together."""
    lane = lane_of(process_set)
    names = group_names(lane, name, "grouped_reducescatter", len(tensors))
    hs = [_reducescatter_handle(t, n, op, process_set, prescale_factor, postscale_factor, compression)
          for t, n in zip(tensors, names)]
    lane.submit_many(hs)
    return GroupHandle(hs)


def grouped_reducescatter(tensors: Sequence[Any], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: int | None = None,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[np.ndarray]:
    """Reducescatter several tensors; returns the list of results."""
    return synchronize(grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                                   postscale_factor, compression))


# ------------------------------------------------------------------------------- synchronisation
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the process set has called barrier()."""
    lane = lane_of(process_set)
    h = Handle(lane.auto_name(), K.BARRIER, Signature(K.BARRIER), None, None, True)
    lane.run(h)


def join(device: int = -1) -> int:
    """Declare that this rank has no more data (global process set).

    Until every rank has joined, this rank keeps taking part in the collectives the others run, contributing
    neutral values (zeros for Sum/Average, so Average still divides by the full size; an empty block to an
    allgather). Returns the rank that joined last.
    """
    rt = context.runtime()
    lane = rt.global_lane
    h = Handle("join", K.JOIN, Signature(K.JOIN), None)
    return lane.run(h)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s picklable ``obj`` on every rank."""
    lane = lane_of(process_set)
    is_root = lane.ranks[lane.rank] == root_rank
    data = dumps(obj) if is_root else None
    length = np.array([data.size if data is not None else 0], np.int64)
    # unnamed without a name: then the response cache knows the length broadcast from one call to the next
    broadcast_(length, root_rank, name=None if name is None else f"{name}.size", process_set=process_set)
    buf = data.copy() if data is not None else np.empty(int(length[0]), np.uint8)
    broadcast_(buf, root_rank, name=None if name is None else f"{name}.data", process_set=process_set)
    return obj if is_root else loads(buf)


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return the list of every rank's picklable ``obj``, in rank order."""
    lane_of(process_set)
    data = dumps(obj)
    sizes = allgather(np.array([data.size], np.int64), name=None if name is None else f"{name}.size",
                      process_set=process_set)
    gathered = allgather(data, name=None if name is None else f"{name}.data", process_set=process_set)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [loads(gathered[bounds[i]:bounds[i + 1]]) for i in range(len(sizes))]
