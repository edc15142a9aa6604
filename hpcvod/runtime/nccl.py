"""Device (GPU) collectives of one lane: NCCL through CuPy, or MPI through host memory.

The engine negotiates device requests exactly like host ones (by name, response cache, mismatch errors); only
the execution differs. A lane's :class:`DeviceOps` is made on its first device collective, which every member
reaches at the same point of the agreed order, so the collective set-up below is safe:

* **Backend choice** (``HPCVOD_GPU_OPERATIONS``): ``nccl`` or ``auto`` use NCCL when CuPy, NCCL and a GPU are
  present on every member and no two members of a node share a GPU (NCCL refuses that); otherwise, and with
  ``mpi``, device buffers are staged through host memory and reduced by MPI. ``nccl`` that cannot be honoured
  fails with a message saying why; ``auto`` falls back and says so once, on the set's first rank.
* **Communicators** are bootstrapped over the lane's MPI communicator (rank 0's ``ncclGetUniqueId`` broadcast),
  one per process set; with ``HPCVOD_HIERARCHICAL_ALLREDUCE=1`` on several nodes also a node-local and a
  cross-node one, and allreduces run :func:`~hpcvod.runtime.hierarchical.hierarchical_allreduce` over them.
* **Streams.** Each request is enqueued on the stream that was current in the submitting thread (recorded at
  submit time: torch's or CuPy's current stream), so it is ordered after the kernels that produced the tensor;
  the lane waits for completion before the handle is done, so ``synchronize()`` returns a finished result.
* **Fusion.** Device allreduces of one dtype/op are packed with one ``cupy.concatenate`` into a device fusion
  buffer (up to ``HPCVOD_FUSION_THRESHOLD``), reduced with one NCCL call and unpacked, like the host path.
"""

from __future__ import annotations

import copy
import math
import sys
from typing import Any

import numpy as np

from . import gpu
from . import handles as K
from .errors import HpcvodConfigError, HpcvodError
from .hierarchical import Topology, hierarchical_allreduce
from .tables import (
    ADASUM, MAX, MIN, NCCL_BFLOAT16, NCCL_OPS, NCCL_TYPES, SUM, arithmetic_dtype, bfloat16_narrow, bfloat16_widen, element_name, is_bfloat16,
    mpi_reduce_op, mpi_type, scale_on_device,
)

def current_stream_ptr() -> int:
    """The CUDA stream current in this thread: torch's if torch is in use, else CuPy's (0 = legacy default)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.current_stream().cuda_stream)
        except Exception:
            pass
    cupy = gpu.probe()[0]
    return int(cupy.cuda.get_current_stream().ptr) if cupy is not None else 0


def choose_backend(mode: str, comm: Any) -> tuple[str, str]:
    """("nccl" | "mpi", why not NCCL) agreed by every member of ``comm`` (collective)."""
    cupy, nccl, why = gpu.probe()
    bus_id = ""
    if nccl is not None:
        try:
            bus_id = cupy.cuda.Device().pci_bus_id
        except Exception as exc:       # a driver that cannot name the device: treat as unusable
            nccl, why = None, f"cannot identify this rank's GPU ({exc})"
    from .world import hostname
    everyone = comm.allgather((nccl is not None, why, hostname(), bus_id))
    problem = next((f"rank {r}: {w}" for r, (ok, w, _, _) in enumerate(everyone) if not ok), "")
    if not problem:
        seen: dict[tuple[str, str], int] = {}
        for r, (_, _, host, bus) in enumerate(everyone):
            if (host, bus) in seen:
                problem = (f"ranks {seen[(host, bus)]} and {r} share GPU {bus} on {host} (NCCL needs one GPU per "
                           f"rank; give each rank its own GPU or set HPCVOD_GPU_OPERATIONS=mpi)")
                break
            seen[(host, bus)] = r
    if not problem:
        return "nccl", ""
    if mode == "nccl":
        raise HpcvodConfigError(f"HPCVOD_GPU_OPERATIONS=nccl, but NCCL cannot be used: {problem}")
    return "mpi", problem


class DeviceOps:
    """Runs one lane's device requests (see the module docstring)."""

    def __init__(self, comm: Any, set_id: int, host: Any, mode: str, hierarchical: bool) -> None:
        self.mpi = comm                  # the lane's MPI communicator (bootstrap, row counts, staging)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.host = host                 # the lane's host executor (host.HostOps), for staged requests
        self.backend, why = choose_backend(mode, comm)
        self.why_not_nccl = why
        if why and mode == "auto" and self.rank == 0:
            print(f"hpcvod: process set {set_id}: device tensors are staged through host memory and reduced "
                  f"by MPI ({why})", file=sys.stderr, flush=True)
        self.cupy = gpu.probe()[0]
        self._nccl_mod = gpu.probe()[1]
        self._comm: Any = None
        self._topology: Topology | None = None
        self._local: Any = None
        self._cross: Any = None
        self._hierarchical = hierarchical and self.backend == "nccl"
        self._fusion: Any = None

    # ------------------------------------------------------------------------------ communicators
    def _nccl_comm_over(self, mpi_comm: Any) -> Any:
        nccl = self._nccl_mod
        uid = nccl.get_unique_id() if mpi_comm.Get_rank() == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        return nccl.NcclCommunicator(mpi_comm.Get_size(), uid, mpi_comm.Get_rank())

    @property
    def comm(self) -> Any:
        if self._comm is None:
            self._comm = self._nccl_comm_over(self.mpi)
            if self._hierarchical:
                topo = Topology(self.mpi)
                if topo.usable:
                    self._topology = topo
                    self._local = self._nccl_comm_over(topo.local)
                    self._cross = self._nccl_comm_over(topo.cross)
                else:
                    topo.free()
                    self._hierarchical = False
        return self._comm

    def close(self) -> None:
        for c in (self._comm, self._local, self._cross):
            if c is not None:
                try:
                    c.destroy()
                except Exception:
                    pass
        if self._topology is not None:
            self._topology.free()
        self._comm = self._local = self._cross = self._topology = None

    def communicators(self) -> list[Any]:
        """The MPI communicators this executor made and still holds (its node split)."""
        return self._topology.communicators() if self._topology is not None else []

    # ----------------------------------------------------------------------------------- helpers
    def _types(self, elem: Any, op: int) -> tuple[int, int]:
        """NCCL's data type and op for a signature's element type (a dtype, or BFLOAT16) and Horovod op."""
        nccl = self._nccl_mod
        t = NCCL_TYPES.get(element_name(elem))
        if t is None:
            raise HpcvodError(f"NCCL cannot reduce dtype {element_name(elem)}; use HPCVOD_GPU_OPERATIONS=mpi for it")
        if not isinstance(elem, str) and elem == np.bool_:
            op = MAX if op in (SUM, MAX) else MIN  # or = max, and = min on 0/1 bytes
        code = getattr(nccl, t, NCCL_BFLOAT16) if t == "NCCL_BFLOAT16" else getattr(nccl, t)
        return code, getattr(nccl, NCCL_OPS[op])

    def _stream(self, ptr: int) -> Any:
        """The CuPy stream object of a recorded stream pointer (0: the legacy default stream)."""
        cuda = self.cupy.cuda
        return cuda.ExternalStream(ptr) if ptr else cuda.Stream.null

    def _finish(self, stream: int) -> None:
        """Wait for the work enqueued on ``stream`` (the handle is done only when its result is)."""
        self._stream(stream).synchronize()

    # ------------------------------------------------------------------------------- allreduce
    def allreduce(self, group: list[Any], nbytes: int, tl: Any = None) -> None:
        """One request or a fused group (same dtype, op and scaling): reduce in place or into new arrays."""
        if self.backend == "mpi" or group[0].sig.op == ADASUM:   # NCCL has no Adasum: through the host
            for h in group:
                self.staged(h)
            return
        cp = self.cupy
        first = group[0]
        stream = first.stream
        elem = first.sig.elem
        with self._stream(stream):
            if len(group) == 1 and first.output is first.tensor:
                flat = first.tensor.reshape(-1)
            else:
                flat = self._flat(nbytes, first.tensor.dtype, all(h.output is h.tensor for h in group))
                cp.concatenate([h.tensor.reshape(-1) for h in group], out=flat)
            if first.prescale != 1.0:
                flat[...] = scale_on_device(cp, flat, first.prescale, elem)
            self._allreduce_flat(flat, elem, first.sig.op, stream)
            if first.postscale != 1.0:
                flat[...] = scale_on_device(cp, flat, first.postscale, elem)
            offset = 0
            for h in group:
                n = h.tensor.size
                piece = flat[offset:offset + n].reshape(h.tensor.shape)
                offset += n
                out = h.output
                if out is None:
                    h.result = piece                  # a view into a fresh block (never the fusion buffer)
                else:
                    if out.data.ptr != piece.data.ptr:
                        out[...] = piece
                    h.result = out
        self._finish(stream)
        for h in group:
            h.done = True

    def _flat(self, nbytes: int, dtype: np.dtype, in_place: bool) -> Any:
        """Where a fused group is reduced: the reusable device fusion buffer for in-place groups, else a new
        block whose slices become the results (no copy-out)."""
        cp = self.cupy
        if not in_place:
            return cp.empty(nbytes // dtype.itemsize, dtype)
        if self._fusion is None or self._fusion.nbytes < nbytes:
            self._fusion = cp.empty(max(nbytes, 1), np.uint8)
        return self._fusion[:nbytes].view(dtype)

    def _allreduce_flat(self, flat: Any, elem: Any, op: int, stream: int) -> None:
        dtype, nccl_op = self._types(elem, op)
        comm = self.comm                                   # made first: it decides whether hierarchy helps
        if self._hierarchical and flat.size >= self.size:
            hierarchical_allreduce(flat, nccl_op, self._local, self._topology.local_size, self._cross, comm,
                                   _NcclPrimitives(self.cupy, dtype, stream))
            return
        comm.allReduce(flat.data.ptr, flat.data.ptr, flat.size, dtype, nccl_op, stream)

    # ------------------------------------------------------------------------------- broadcast
    def broadcast(self, h: Any) -> None:
        if self.backend == "mpi":
            self.staged(h)
            return
        cp = self.cupy
        nccl = self._nccl_mod
        a = h.tensor
        with self._stream(h.stream):
            target = a if h.output is a else (a.copy() if self.rank == h.root else cp.empty_like(a))
        # bytes: every dtype (bool, complex, int16...) broadcasts the same way
        self.comm.bcast(target.data.ptr, target.nbytes, nccl.NCCL_UINT8, h.root, h.stream)
        self._finish(h.stream)
        h.result = target
        h.done = True

    # ------------------------------------------------------- allgather, alltoall, reducescatter (bytes)
    def _host_counts(self, mine: "np.ndarray | list[int]") -> np.ndarray:
        """Every member's row counts (one small host allgather over the lane's MPI communicator)."""
        from mpi4py import MPI
        mine = np.ascontiguousarray(mine, np.int64)
        everyone = np.empty((self.size, mine.size), np.int64)
        self.mpi.Allgather([mine, MPI.INT64_T], [everyone, MPI.INT64_T])
        return everyone

    def run_others(self, hs: list[Any], tl: Any = None) -> None:
        """Everything but fused allreduces, in the agreed order (the host executor's interface); kinds NCCL has
        no form for are staged through host memory. The allgathers, and the reducescatters, of one cycle each run
        as one NCCL group (one launch; one row-count exchange): Horovod fuses those kinds too."""
        runs = {K.ALLREDUCE: lambda h: self.allreduce([h], h.tensor.nbytes), K.BROADCAST: self.broadcast,
                K.ALLTOALL: self.alltoall}
        batches = {K.ALLGATHER: self._allgather, K.REDUCESCATTER: self._reducescatter}
        for kind, run in batches.items():       # first, as the host executor runs its allgathers first
            batch = [h for h in hs if h.kind == kind]
            if batch:
                run(batch)
        for h in hs:
            if h.kind not in batches:
                runs.get(h.kind, self.staged)(h)

    def _allgather(self, hs: list[Any]) -> None:
        """Every member's rows, concatenated in rank order (first dimensions may differ), for each request: one
        exchange of every request's row count over MPI, then one NCCL group with an ncclAllGather per request
        whose counts agree, else an ncclBroadcast per member."""
        if self.backend == "mpi":
            for h in hs:
                self.staged(h)
            return
        cp, nccl = self.cupy, self._nccl_mod
        sends = [h.tensor if h.tensor.ndim else h.tensor.reshape(1) for h in hs]
        counts = self._host_counts([a.shape[0] for a in sends])        # (members, requests)
        outs = []
        comm = self.comm
        for k, (h, a) in enumerate(zip(hs, sends)):
            with self._stream(h.stream):
                outs.append(cp.empty((int(counts[:, k].sum()),) + a.shape[1:], a.dtype))
        nccl.groupStart()
        for k, (h, a, out) in enumerate(zip(hs, sends, outs)):
            rows = counts[:, k]
            row_bytes = math.prod(a.shape[1:]) * a.itemsize
            if (rows == rows[0]).all():
                comm.allGather(a.data.ptr, out.data.ptr, int(rows[0]) * row_bytes, nccl.NCCL_UINT8, h.stream)
            else:
                offsets = np.concatenate([[0], np.cumsum(rows)[:-1]]) * row_bytes
                for r, (count, offset) in enumerate(zip(rows, offsets)):
                    comm.broadcast(a.data.ptr, out.data.ptr + int(offset), int(count) * row_bytes,
                                   nccl.NCCL_UINT8, r, h.stream)
        nccl.groupEnd()
        self._done(hs, outs)

    def _done(self, hs: list[Any], results: list[Any]) -> None:
        """Wait for each request's stream, then hand out its result."""
        for h in hs:
            self._finish(h.stream)
        for h, result in zip(hs, results):
            h.result = result
            h.done = True

    def alltoall(self, h: Any) -> None:
        """Rows ``splits[r]`` to member r, through ncclSend/ncclRecv pairs in one group; the result is
        ``(output, received splits)`` like the host path."""
        if self.backend == "mpi":
            self.staged(h)
            return
        cp, nccl = self.cupy, self._nccl_mod
        a = h.tensor
        size, me = self.size, self.rank
        received = self._host_counts(h.splits)[:, me].copy()
        row_bytes = math.prod(a.shape[1:]) * a.itemsize
        with self._stream(h.stream):
            out = cp.empty((int(received.sum()),) + a.shape[1:], a.dtype)
            send = cp.ascontiguousarray(a)
        send_off = np.concatenate([[0], np.cumsum(h.splits)[:-1]]) * row_bytes
        recv_off = np.concatenate([[0], np.cumsum(received)[:-1]]) * row_bytes
        comm = self.comm
        nccl.groupStart()
        for r in range(size):
            if h.splits[r]:
                comm.send(send.data.ptr + int(send_off[r]), int(h.splits[r]) * row_bytes, nccl.NCCL_UINT8, r,
                          h.stream)
            if received[r]:
                comm.recv(out.data.ptr + int(recv_off[r]), int(received[r]) * row_bytes, nccl.NCCL_UINT8, r,
                          h.stream)
        nccl.groupEnd()
        self._finish(h.stream)
        h.result = (out, received)
        h.done = True

    def _reducescatter(self, hs: list[Any]) -> None:
        """The first dimension split as the host path splits it (the first ``dim0 % size`` members one row
        more), for each request, in one NCCL group: an ncclReduceScatter when the split is even, else an
        ncclReduce per member."""
        if self.backend == "mpi":
            for h in hs:
                self.staged(h)
            return
        cp, nccl = self.cupy, self._nccl_mod
        size, me = self.size, self.rank
        comm = self.comm
        work = []
        for h in hs:
            a = h.tensor if h.tensor.ndim else h.tensor.reshape(1)
            elem = h.sig.elem
            with self._stream(h.stream):
                send = cp.ascontiguousarray(a)
                if h.prescale != 1.0:
                    send = scale_on_device(cp, send, h.prescale, elem)
                base, extra = divmod(a.shape[0], size)
                rows = [base + (1 if r < extra else 0) for r in range(size)]
                out = cp.empty((rows[me],) + a.shape[1:], a.dtype)
            work.append((h, send, out, rows, extra, self._types(elem, h.sig.op)))
        nccl.groupStart()
        for h, send, out, rows, extra, (dtype, op) in work:
            per_row = math.prod(send.shape[1:])
            if extra == 0:
                comm.reduceScatter(send.data.ptr, out.data.ptr, rows[0] * per_row, dtype, op, h.stream)
                continue
            offset = 0
            for r in range(size):
                target = out.data.ptr if r == me else send.data.ptr + offset * send.itemsize
                comm.reduce(send.data.ptr + offset * send.itemsize, target, rows[r] * per_row, dtype, op, r,
                            h.stream)
                offset += rows[r] * per_row
        nccl.groupEnd()
        results = []
        for h, _, out, _, _, _ in work:
            if h.postscale != 1.0:
                with self._stream(h.stream):
                    out = scale_on_device(cp, out, h.postscale, h.sig.elem)
            results.append(out)
        self._done(hs, results)

    # ------------------------------------------------------------------------------- staging
    def staged(self, h: Any) -> None:
        """Any device request through host memory (stage_through_host)."""
        stage_through_host(h, self.cupy, self.host)


def stage_through_host(h: Any, cp: Any, host: Any) -> None:
    """Any device request through host memory: copy in, run the lane's host code (``host``, the lane's
    host.HostOps), copy the result back.

    The host code runs on a private copy of the handle, so ``h`` is marked done only once its result is
    back in device memory (a waiter polls ``h.done`` without the lock).
    """
    in_place = h.output is h.tensor
    proxy = copy.copy(h)
    proxy.tensor = cp.asnumpy(h.tensor)
    # bfloat16 words are reduced as float32 on the host (MPI has no bfloat16) and rounded back once
    widened = h.kind in (K.ALLREDUCE, K.REDUCESCATTER) and is_bfloat16(h.sig.elem)
    if widened:
        proxy.tensor = bfloat16_widen(np, proxy.tensor)
        proxy.mpi_type = mpi_type(proxy.tensor.dtype)
        proxy.mpi_op = mpi_reduce_op(h.sig.op, arithmetic_dtype(h.sig.elem))
    proxy.output = proxy.tensor if in_place else None
    proxy.device = False
    proxy.done = False
    host.run(proxy)
    if proxy.error is not None:
        h.error = proxy.error
    result = proxy.result
    if widened and isinstance(result, np.ndarray):
        result = bfloat16_narrow(np, result)
    if isinstance(result, tuple):                     # alltoall with splits: (array, received splits)
        h.result = (cp.asarray(result[0]),) + tuple(result[1:])
    elif isinstance(result, np.ndarray):
        target = h.tensor if in_place else h.output
        if target is not None:
            target.set(result)
            h.result = target
        else:
            h.result = cp.asarray(result)
    else:
        h.result = result
    h.done = True


class _NcclPrimitives:
    """hierarchical.Primitives over NCCL communicators and CuPy arrays (one dtype and stream)."""

    def __init__(self, cupy: Any, nccl_dtype: int, stream: int) -> None:
        self.cp, self.t, self.stream = cupy, nccl_dtype, stream

    def empty(self, count: int, like: Any) -> Any:
        return self.cp.empty(count, like.dtype)

    def reduce_scatter_block(self, comm: Any, send: Any, recv: Any, op: Any) -> None:
        comm.reduceScatter(send.data.ptr, recv.data.ptr, recv.size, self.t, op, self.stream)

    def allreduce_in_place(self, comm: Any, buf: Any, op: Any) -> None:
        comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self.t, op, self.stream)

    def allgather_block(self, comm: Any, send: Any, recv: Any) -> None:
        comm.allGather(send.data.ptr, recv.data.ptr, send.size, self.t, self.stream)

