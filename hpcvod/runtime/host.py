"""The host executor: a lane's collectives on host memory, over its MPI communicator.

It has the same interface as the device executor (runtime/nccl.py: ``allreduce(group, nbytes, tl)``,
``allgather(handles, tl)``, ``broadcast``, ``alltoall``, ``reducescatter``); the lane negotiates, decides the
order and the fused groups, and hands each agreed request to the executor of its memory. Results of large
out-of-place collectives come from a pool of 2 MiB-aligned blocks (huge pages).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from . import handles as K
from .adasum import ADASUM_OP, adasum_allreduce
from .handles import Handle
from .hierarchical import MpiPrimitives, Topology, hierarchical_allreduce
from .tables import MPI_ACTIVITY, scale_into
from .timeline import MEMCPY_IN, MEMCPY_OUT, QUEUE, Timeline

_perf = time.perf_counter
_IN_PLACE = MPI.IN_PLACE

POOL_MIN_BYTES = 64 << 10
HUGE_PAGE = 2 << 20


def aligned_empty(nbytes: int) -> tuple[np.ndarray, int]:
    """(owner, offset): ``owner[offset:offset + nbytes]`` starts on a 2 MiB boundary when that matters.

    NumPy asks the kernel for transparent huge pages on large arrays, but only 2 MiB-aligned ranges can use
    them; an MPI reduction over a 16 MiB buffer that is huge-page backed runs ~20% faster here (fewer TLB
    misses), so large buffers the runtime allocates are aligned.
    """
    if nbytes < HUGE_PAGE:
        return np.empty(nbytes, np.uint8), 0
    owner = np.empty(nbytes + HUGE_PAGE, np.uint8)
    return owner, (-owner.ctypes.data) % HUGE_PAGE


class ResultPool:
    """Reuses the memory of large out-of-place results once nothing references them any more.

    A fresh multi-MiB array costs a page fault per 4 KiB on first touch (a 256 MiB result: ~65000 faults),
    which alone makes an allocating allreduce slower than MPI on preallocated buffers. The pool keeps the last
    few owner arrays it handed out; results are views of them, so every view (and every view of a view, or
    a framework tensor made from one) holds a reference to the owner. An owner whose only reference is the
    pool's is free and is handed out again.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._owners: list[tuple[np.ndarray, int, int]] = []   # (owner, offset, nbytes)
        self._lock = threading.Lock()

    def empty(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:
            owners = self._owners
            for i in range(len(owners) - 1, -1, -1):   # the most recently used first: warmest in cache
                # 2 references to a free owner: its tuple's and getrefcount's argument
                if owners[i][2] == nbytes and sys.getrefcount(owners[i][0]) == 2:
                    entry = owners.pop(i)
                    owners.append(entry)
                    break
            else:
                owner, offset = aligned_empty(nbytes)
                entry = (owner, offset, nbytes)
                owners.append(entry)
                if len(owners) > self.keep:
                    del owners[0]          # still alive if a result uses it; just no longer recycled
        owner, offset, _ = entry
        return owner[offset:offset + nbytes].view(dtype).reshape(shape)


_results = ResultPool()


class HostOps:
    """Runs one lane's host requests (see the module docstring)."""

    def __init__(self, comm: MPI.Comm, hierarchical: bool, fusion_threshold: int) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        # HPCVOD_HIERARCHICAL_ALLREDUCE: the node split is made on the first allreduce (a collective; every
        # member runs it at the same point of the agreed order) and dropped if it cannot help (one node).
        self._hierarchical = hierarchical and self.size > 1
        self._topology: Any = None
        self._fusion = np.empty(0, np.uint8)     # reusable fusion buffer (grows up to the threshold)
        self.fusion_threshold = fusion_threshold  # the fusion buffer grows up to this

    def set_hierarchical(self, on: bool) -> None:
        """Switch hierarchical allreduce (autotune); flat where the node split found it cannot help."""
        topo = self._topology
        self._hierarchical = on and self.size > 1 and (topo is None or topo.usable)

    def free(self) -> None:
        if self._topology is not None:
            self._topology.free()
            self._topology = None

    def communicators(self) -> list[Any]:
        """The MPI communicators this executor made and still holds (its node split)."""
        return self._topology.communicators() if self._topology is not None else []

    def run(self, h: Handle) -> None:
        """One request of any kind (device requests staged through host memory come here too)."""
        if h.kind == K.ALLREDUCE:
            self.allreduce_one(h, None)
        else:
            self.run_others([h], None)

    def run_others(self, hs: list[Handle], tl: Timeline | None) -> None:
        """Everything but fused allreduces, in the agreed order (allgathers share one exchange of row counts)."""
        gathers = [h for h in hs if h.kind == K.ALLGATHER]
        if gathers:
            self.allgather(gathers, tl)
        for h in hs:
            kind = h.kind
            if kind == K.ALLGATHER:
                continue
            t0 = _perf()
            if kind == K.ALLREDUCE:
                self.allreduce_one(h, tl)
                continue
            if kind == K.BROADCAST:
                self.broadcast(h)
            elif kind == K.ALLTOALL:
                self.alltoall(h)
            elif kind == K.REDUCESCATTER:
                self.reducescatter(h)
            elif kind == K.BARRIER:
                h.result = None   # negotiation already proved every member got here
            h.done = True
            if tl is not None and not h.dummy:
                tl.span(h.name, QUEUE, h.t_ready, t0)
                if kind in MPI_ACTIVITY:
                    tl.span(h.name, MPI_ACTIVITY[kind], t0, _perf())

    def allreduce_one(self, h: Handle, tl: Timeline | None) -> None:
        """One allreduce (in place, or into ``h.output`` / a new array), scaled in Horovod's precision."""
        a = h.tensor
        t0 = _perf() if tl is not None else 0.0
        out = h.output
        comm = self.comm
        if out is a:
            if h.prescale != 1.0:
                scale_into(out, h.prescale, out)
            t1 = _perf() if tl is not None else 0.0
            if self._hierarchical or h.mpi_op is ADASUM_OP:
                self.allreduce_in_place(out, h)
            else:                                # the flat call inline: every blocking in-place call
                comm.Allreduce(_IN_PLACE, [out, h.mpi_type], h.mpi_op)
        else:
            if out is None:
                out = np.empty_like(a) if a.nbytes < POOL_MIN_BYTES else _results.empty(a.shape, a.dtype)
            if h.prescale != 1.0 or self._hierarchical or h.mpi_op is ADASUM_OP:
                scale_into(a, h.prescale, out)
                t1 = _perf() if tl is not None else 0.0
                self.allreduce_in_place(out, h)
            else:
                # Separate buffers, exactly like a hand-written Allreduce(send, recv): a copy plus an in-place
                # reduction costs the same or more once the copy leaves the cache.
                t1 = _perf() if tl is not None else 0.0
                comm.Allreduce([a, h.mpi_type], [out, h.mpi_type], h.mpi_op)
        if h.postscale != 1.0:
            scale_into(out, h.postscale, out)
        h.result = out
        h.done = True
        if tl is not None:
            t2 = _perf()
            tl.span(h.name, QUEUE, h.t_ready, t0)
            tl.span(h.name, "MPI_ALLREDUCE", t1, t2, {"bytes": a.nbytes})

    def allreduce_in_place(self, buf: np.ndarray, h: Handle, counts: list[int] | None = None) -> None:
        """One in-place MPI allreduce of ``buf`` (contiguous), hierarchical when asked for and useful; Adasum
        (flat, as Horovod's MPI Adasum) with a dot product per tensor (``counts``: elements of each one)."""
        if h.mpi_op is ADASUM_OP:
            adasum_allreduce(buf.reshape(-1), counts or [buf.size], self.comm)
            return
        if self._hierarchical and buf.size >= self.size:
            topo = self._topology
            if topo is None:
                topo = self._topology = Topology(self.comm)
                if not topo.usable:
                    self._hierarchical = False     # flat is as good on one node; keep the split for free()
            if self._hierarchical:
                hierarchical_allreduce(buf.reshape(-1), h.mpi_op, topo.local, topo.local_size, topo.cross,
                                       self.comm, MpiPrimitives(h.mpi_type))
                return
        self.comm.Allreduce(MPI.IN_PLACE, [buf, h.mpi_type], h.mpi_op)

    def _fusion_buffer(self, nbytes: int) -> np.ndarray:
        if self._fusion.nbytes < nbytes:
            size = max(nbytes, min(2 * self._fusion.nbytes, self.fusion_threshold))
            owner, offset = aligned_empty(size)
            self._fusion = owner[offset:offset + size]
        return self._fusion

    def allreduce(self, group: list[Handle], nbytes: int, tl: Timeline | None) -> None:
        """One request, or a fused group (same dtype, op and scaling) packed into one buffer and reduced with
        one MPI call."""
        if len(group) == 1:
            self.allreduce_one(group[0], tl)
            return
        first = group[0]
        dtype = first.tensor.dtype
        all_in_place = all(h.output is h.tensor for h in group)
        t0 = _perf()
        if all_in_place:
            flat = self._fusion_buffer(nbytes)[:nbytes].view(dtype)
        else:
            flat = _results.empty((nbytes // dtype.itemsize,), dtype) if nbytes >= POOL_MIN_BYTES \
                else np.empty(nbytes // dtype.itemsize, dtype)
        np.concatenate([h.tensor for h in group], axis=None, out=flat)
        if first.prescale != 1.0:
            scale_into(flat, first.prescale, flat)
        t1 = _perf()
        self.allreduce_in_place(flat, first, [h.tensor.size for h in group] if first.mpi_op is ADASUM_OP else None)
        if first.postscale != 1.0:
            scale_into(flat, first.postscale, flat)
        t2 = _perf()
        offset = 0
        if all_in_place:
            for h in group:
                out = h.output
                end = offset + out.size
                out.reshape(-1)[...] = flat[offset:end]
                offset = end
                h.result = out
                h.done = True
        else:
            for h in group:
                a = h.tensor
                end = offset + a.size
                piece = flat[offset:end]
                offset = end
                out = h.output
                if out is None:
                    if a.ndim != 1:
                        piece = piece.reshape(a.shape)
                    h.result = piece                          # a view into the fresh block: no copy-out
                else:
                    out.reshape(-1)[...] = piece
                    h.result = out
                h.done = True
        if tl is not None:
            t3 = _perf()
            names = [h.name for h in group if not h.dummy]
            tl.spans(names, QUEUE, first.t_ready, t0)
            tl.spans(names, MEMCPY_IN, t0, t1, {"fused": len(group), "bytes": nbytes})
            tl.spans(names, "MPI_ALLREDUCE", t1, t2, {"fused": len(group), "bytes": nbytes})
            tl.spans(names, MEMCPY_OUT, t2, t3)

    def allgather(self, hs: list[Handle], tl: Timeline | None) -> None:
        t0 = _perf()
        comm = self.comm
        mine = np.array([h.tensor.shape[0] for h in hs], np.int64)
        rows = np.empty((self.size, len(hs)), np.int64)
        comm.Allgather([mine, MPI.INT64_T], [rows, MPI.INT64_T])
        for j, h in enumerate(hs):
            a = h.tensor
            trailing = a.shape[1:]
            per_row = math.prod(trailing)
            counts = rows[:, j] * per_row
            displs = np.zeros_like(counts)
            np.cumsum(counts[:-1], out=displs[1:])
            out = np.empty((int(rows[:, j].sum()),) + trailing, a.dtype)
            t = h.mpi_type
            comm.Allgatherv([a, t], [out, (counts, displs), t])
            h.result = out
            h.done = True
            if tl is not None and not h.dummy:
                tl.span(h.name, QUEUE, h.t_ready, t0)
                tl.span(h.name, "MPI_ALLGATHERV", t0, _perf(), {"rows": rows[:, j].tolist()})

    def broadcast(self, h: Handle) -> None:
        a = h.tensor
        t = h.mpi_type
        if h.output is a:
            self.comm.Bcast([a, t], h.root)
            h.result = a
        elif self.rank == h.root:
            self.comm.Bcast([a, t], h.root)
            if h.output is None:
                h.result = a.copy()
            else:
                np.copyto(h.output, a)
                h.result = h.output
        else:
            out = np.empty(a.shape, a.dtype) if h.output is None else h.output
            self.comm.Bcast([out, t], h.root)
            h.result = out

    def alltoall(self, h: Handle) -> None:
        a = h.tensor
        comm = self.comm
        splits = h.splits
        received = np.empty(self.size, np.int64)
        comm.Alltoall([splits, MPI.INT64_T], [received, MPI.INT64_T])
        trailing = a.shape[1:]
        per_row = math.prod(trailing)
        scounts = splits * per_row
        rcounts = received * per_row
        sdispl = np.zeros_like(scounts)
        rdispl = np.zeros_like(rcounts)
        np.cumsum(scounts[:-1], out=sdispl[1:])
        np.cumsum(rcounts[:-1], out=rdispl[1:])
        out = np.empty((int(received.sum()),) + trailing, a.dtype)
        t = h.mpi_type
        comm.Alltoallv([a, (scounts, sdispl), t], [out, (rcounts, rdispl), t])
        h.result = (out, received)

    def reducescatter(self, h: Handle) -> None:
        a = h.tensor
        base, extra = divmod(a.shape[0] if a.ndim else 1, self.size)
        rows = np.array([base + (1 if r < extra else 0) for r in range(self.size)], np.int64)
        per_row = math.prod(a.shape[1:])
        if h.prescale == 1.0:
            send = a
        else:
            send = np.empty_like(a)
            scale_into(a, h.prescale, send)
        out = np.empty((int(rows[self.rank]),) + a.shape[1:], a.dtype)
        t = h.mpi_type
        self.comm.Reduce_scatter([send, t], [out, t], (rows * per_row).tolist(), h.mpi_op)
        if h.postscale != 1.0:
            scale_into(out, h.postscale, out)
        h.result = out
