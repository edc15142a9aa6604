"""Handles: one per submitted collective on this rank (they double as the engine's request records), their
signatures, and ``poll`` / ``synchronize``."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from .errors import HpcvodInputError

# Kinds of collective (part of every signature, so ranks that call different collectives under the same
# name get a mismatch error instead of a hang).
ALLREDUCE = 1
ALLGATHER = 2
BROADCAST = 3
ALLTOALL = 4
REDUCESCATTER = 5
BARRIER = 6
JOIN = 7


KIND_NAMES = {
    ALLREDUCE: "allreduce", ALLGATHER: "allgather", BROADCAST: "broadcast", ALLTOALL: "alltoall",
    REDUCESCATTER: "reducescatter", BARRIER: "barrier", JOIN: "join",
}


class Signature(NamedTuple):
    """What every member must submit identically under one name: compared across ranks in a full round (a
    difference is a mismatch error), and part of the response cache's keys (a NamedTuple hashes as a tuple).

    Fields a kind does not use keep their defaults: the op of an allreduce and the root of a broadcast are
    different fields.
    """

    kind: int                 # ALLREDUCE, ALLGATHER, ...
    elem: Any = None          # the element type: a NumPy dtype, or tables.BFLOAT16 for bfloat16 words
    shape: tuple = ()         # the tensor's shape; allgather and alltoall: one row's (the first dimension may differ)
    op: int | None = None     # the reduction op (allreduce, reducescatter)
    root: int | None = None   # the root's global rank (broadcast)
    prescale: float = 1.0     # allreduce, reducescatter
    postscale: float = 1.0    # as the user gave it (Average's 1/size is not in it)
    device: bool = False      # device memory: host and device requests never match or fuse together


class Handle:
    """The handle of one asynchronous collective; pass it to ``poll()`` / ``synchronize()``.

    ``synchronize(handle)`` returns the operation's result (the output array; ``(output, received_splits)``
    for an alltoall with splits) or raises the :class:`~hpcvod.runtime.errors.HpcvodError` it failed with.
    """

    # Defaults live on the class and only what differs is set per instance: a handle is created for every
    # collective call, and this halves its cost compared with assigning every field (or __slots__).
    lane: Any = None
    mpi_type: Any = None
    mpi_op: Any = None
    prescale = 1.0
    postscale = 1.0            # effective factor, Average's 1/size included
    root = -1                  # root's rank inside the process set (broadcast)
    splits: np.ndarray | None = None
    t_submit = 0.0
    t_ready = 0.0
    entry: Any = None          # the response-cache entry it matched in the last negotiation
    done = False
    error: BaseException | None = None
    result: Any = None
    finish: Callable[[Any], Any] | None = None   # post-processing run by synchronize()
    dummy = False              # a joined rank's stand-in contribution
    unnamed = False            # named by the engine: cached by signature and position, not by name
    device = False             # tensor/output are CuPy arrays in GPU memory (runtime/nccl.py runs it)
    stream = 0                 # the CUDA stream current when a device request was submitted

    def __init__(self, name: str, kind: int, sig: Signature, tensor: np.ndarray | None,
                 output: np.ndarray | None = None, unnamed: bool = False) -> None:
        self.name = name
        self.key: Any = name     # response-cache key; unnamed collectives get theirs per cycle
        self.kind = kind
        self.sig = sig
        self.tensor = tensor
        self.output = output     # where the result goes; ``is tensor`` for in-place forms
        if unnamed:
            self.unnamed = True

    def __repr__(self) -> str:
        state = "done" if self.done else "pending"
        return f"<hpcvod Handle {KIND_NAMES.get(self.kind, '?')} {self.name!r} {state}>"


class GroupHandle:
    """The handle of a grouped collective: ``synchronize`` returns the list of results in order."""

    __slots__ = ("handles",)

    def __init__(self, handles: list[Handle]) -> None:
        self.handles = handles

    @property
    def done(self) -> bool:
        return all(h.done for h in self.handles)

    def __repr__(self) -> str:
        return f"<hpcvod GroupHandle of {len(self.handles)}>"


AnyHandle = Handle | GroupHandle


def poll(handle: AnyHandle) -> bool:
    """True when the operation behind ``handle`` has finished (successfully or not)."""
    return handle.done


def synchronize(handle: AnyHandle) -> Any:
    """Wait for ``handle`` and return its result (raises the HpcvodError it failed with)."""
    if handle.__class__ is not Handle:
        if isinstance(handle, GroupHandle):
            return [synchronize(h) for h in handle.handles]
        raise HpcvodInputError(f"synchronize() expects a handle from an *_async call, got {handle!r}")
    if not handle.done:
        handle.lane.wait(handle)
    if handle.error is not None:
        raise handle.error
    finish = handle.finish
    if finish is None:
        return handle.result
    handle.finish = None
    handle.result = finish(handle.result)
    return handle.result
