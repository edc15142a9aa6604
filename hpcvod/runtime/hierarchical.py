"""Hierarchical allreduce (``HPCVOD_HIERARCHICAL_ALLREDUCE=1``), one algorithm for MPI and NCCL.

On N nodes of L ranks, a flat ring moves every byte across the network 2(NL-1)/NL times through NL steps;
splitting it keeps most of the traffic inside the node (NVLink / shared memory):

1. reduce-scatter inside the node: local rank l ends with the node's sum of block l (1/L of the buffer);
2. allreduce across nodes of that block, among the ranks with the same local rank (L independent rings);
3. allgather inside the node: every rank gets every reduced block.

The buffer is split into L equal blocks; the few elements left over (len % L) are reduced with one flat
allreduce. The algorithm is written once over three primitives, so the MPI path (NumPy buffers, tested on
CPU) and the NCCL path (CuPy buffers) run exactly the same steps.
"""

from __future__ import annotations

from typing import Any, Protocol


class Primitives(Protocol):
    """The collectives the algorithm needs; ``comm`` is whatever the backend uses for a group of ranks."""

    def empty(self, count: int, like: Any) -> Any: ...
    def reduce_scatter_block(self, comm: Any, send: Any, recv: Any, op: Any) -> None: ...
    def allreduce_in_place(self, comm: Any, buf: Any, op: Any) -> None: ...
    def allgather_block(self, comm: Any, send: Any, recv: Any) -> None: ...


def hierarchical_allreduce(flat: Any, op: Any, local: Any, local_size: int, cross: Any, world: Any,
                           prims: Primitives) -> None:
    """Reduce the 1-D contiguous ``flat`` in place over ``world`` = ``local`` x ``cross`` (see module doc).

    Every rank must call it with the same length; nodes must have the same number of ranks.
    """
    n = flat.shape[0]
    block = n // local_size
    main = block * local_size
    if block:
        shard = prims.empty(block, flat)
        prims.reduce_scatter_block(local, flat[:main], shard, op)
        prims.allreduce_in_place(cross, shard, op)
        prims.allgather_block(local, shard, flat[:main])
    if main < n:
        prims.allreduce_in_place(world, flat[main:], op)


class MpiPrimitives:
    """The primitives over mpi4py communicators and NumPy arrays (``op``: an ``MPI.Op``; ``mpi_type`` fixed)."""

    def __init__(self, mpi_type: Any) -> None:
        self.t = mpi_type

    def empty(self, count: int, like: Any) -> Any:
        import numpy as np
        return np.empty(count, like.dtype)

    def reduce_scatter_block(self, comm: Any, send: Any, recv: Any, op: Any) -> None:
        comm.Reduce_scatter_block([send, self.t], [recv, self.t], op)

    def allreduce_in_place(self, comm: Any, buf: Any, op: Any) -> None:
        from mpi4py import MPI
        comm.Allreduce(MPI.IN_PLACE, [buf, self.t], op)

    def allgather_block(self, comm: Any, send: Any, recv: Any) -> None:
        comm.Allgather([send, self.t], [recv, self.t])


class Topology:
    """The node split of one communicator: ``local`` (same node) and ``cross`` (same local rank) sub-comms.

    ``usable`` is False when hierarchical reduction cannot help or cannot work: a single node, one rank per
    node, or nodes with different numbers of ranks (the blocks would not line up).
    """

    def __init__(self, comm: Any, local_key: Any = None) -> None:
        from mpi4py import MPI
        rank = comm.Get_rank()
        if local_key is None:
            self.local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        else:   # an explicit node id (tests that split one machine into several "nodes")
            self.local = comm.Split(local_key, rank)
        self.local_rank, self.local_size = self.local.Get_rank(), self.local.Get_size()
        self.cross = comm.Split(self.local_rank, rank)
        self.cross_size = self.cross.Get_size()
        sizes = set(comm.allgather(self.local_size))
        self.usable = len(sizes) == 1 and self.local_size > 1 and self.cross_size > 1
        self.why_not = ("" if self.usable else
                        "nodes have different numbers of ranks" if len(sizes) > 1 else
                        "one rank per node" if self.local_size == 1 else "a single node")

    def free(self) -> None:
        for c in (self.local, self.cross):
            c.Free()

    def communicators(self) -> list[Any]:
        """The sub-communicators not freed yet."""
        from mpi4py import MPI
        return [c for c in (self.local, self.cross) if c != MPI.COMM_NULL]
