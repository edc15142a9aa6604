"""Handles: one per submitted collective on this rank (they double as the engine's request records)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

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


class Handle:
    """The handle of one asynchronous collective; pass it to ``poll()`` / ``synchronize()``.

    ``synchronize(handle)`` returns the operation's result (the output array; ``(output, received_splits)``
    for an alltoall with splits) or raises the :class:`~hpcvod.runtime.errors.HpcvodError` it failed with.
    """

    __slots__ = ("name", "key", "unnamed", "kind", "sig", "lane", "tensor", "output", "mpi_type", "mpi_op",
                 "prescale", "postscale", "root", "splits", "t_submit", "t_ready", "bit", "done", "error",
                 "result", "finish", "dummy")

    def __init__(self, name: str, kind: int, sig: tuple, tensor: Optional[np.ndarray],
                 output: Optional[np.ndarray] = None, unnamed: bool = False) -> None:
        self.name = name
        self.key: Any = name           # response-cache key; unnamed collectives get theirs per cycle
        self.unnamed = unnamed
        self.kind = kind
        self.sig = sig
        self.tensor = tensor
        self.output = output           # where the result goes; ``is tensor`` for in-place forms
        self.lane: Any = None
        self.mpi_type: Any = None
        self.mpi_op: Any = None
        self.prescale = 1.0
        self.postscale = 1.0           # effective factor, Average's 1/size included
        self.root = -1                 # root's rank inside the process set (broadcast)
        self.splits: Optional[np.ndarray] = None
        self.t_submit = 0.0
        self.t_ready = 0.0
        self.bit = -1
        self.done = False
        self.error: Optional[BaseException] = None
        self.result: Any = None
        self.finish: Optional[Callable[[Any], Any]] = None   # post-processing run by synchronize()
        self.dummy = False             # a joined rank's stand-in contribution

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
