"""The executors of one lane: host memory over MPI (host.py), device memory over NCCL (nccl.py).

:class:`Executors` takes the requests a negotiation agreed on, in the agreed order, groups the allreduces
(one dtype/op/scaling/memory, fused up to ``HPCVOD_FUSION_THRESHOLD`` bytes; a tensor of ALONE_BYTES or more
runs alone, in place on its own buffer) and gives each group to the executor of its memory. Only the thread that drives the lane calls it.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from . import handles as K
from .handles import Handle
from .host import HostOps
from .response_cache import fuse_key
from .timeline import Timeline


# A tensor this large is reduced alone even when it fits the fusion threshold: packing it would copy it into the
# fusion buffer and back (two passes over its memory), which costs more than the one MPI call fusion saves. Every
# member makes the same choice (sizes are part of the agreed signatures).
ALONE_BYTES = 1 << 20


class Executors:
    """The host executor, made at once, and the device executor, made on the first device request."""

    def __init__(self, comm: MPI.Comm, set_id: int, settings: Any) -> None:
        self.comm = comm
        self.set_id = set_id
        self.fusion_threshold = settings.fusion_threshold
        self.hierarchical = bool(settings.hierarchical_allreduce)
        self.host = HostOps(comm, self.hierarchical, self.fusion_threshold)
        self.gpu_operations = settings.gpu_operations
        self.device_ops: Any = None

    def devices(self) -> Any:
        """The device executor (collective on first use: every member gets here in the agreed order)."""
        ops = self.device_ops
        if ops is None:
            from .nccl import DeviceOps
            ops = self.device_ops = DeviceOps(self.comm, self.set_id, self.host, self.gpu_operations,
                                              self.hierarchical)
        return ops

    def retune(self, fusion_threshold: int, hierarchical: bool) -> None:
        """Autotune's new fusion threshold and hierarchical switch (every member at the same agreed point)."""
        self.fusion_threshold = self.host.fusion_threshold = fusion_threshold
        self.hierarchical = hierarchical
        self.host.set_hierarchical(hierarchical)

    def free(self) -> None:
        """Release the executors' communicators and buffers."""
        if self.device_ops is not None:
            self.device_ops.close()
            self.device_ops = None
        self.host.free()

    def mpi_handles(self) -> list[Any]:
        """The MPI communicators the executors made and still hold."""
        held = self.host.communicators()
        if self.device_ops is not None:
            held += self.device_ops.communicators()
        return held

    def run(self, ready: list[Handle], tl: Timeline | None) -> None:
        """Run the agreed requests: fused allreduces first (grouped by dtype/op/scaling), then the rest."""
        if len(ready) == 1:
            h = ready[0]
            if h.kind == K.ALLREDUCE:
                self.allreduce_one(h, tl)
            else:
                self.run_others([h], tl)
            return
        groups: dict[Any, list[Handle]] = {}
        others: list[Handle] = []
        first = ready[0].entry
        key = first.fuse if first is not None else None
        if key is not None:                  # the usual burst: one dtype/op/scaling for everything
            for h in ready:
                e = h.entry
                if e is None or e.fuse is not key:
                    break
            else:
                groups[key] = ready
        for h in (ready if not groups else ()):
            if h.kind == K.ALLREDUCE:
                e = h.entry
                key = e.fuse if e is not None else fuse_key(h.sig)
                g = groups.get(key)
                if g is None:
                    groups[key] = [h]
                else:
                    g.append(h)
            else:
                others.append(h)
        threshold = self.fusion_threshold
        for group in groups.values():
            if threshold == 0 or len(group) == 1:
                for h in group:
                    self.allreduce_one(h, tl)
                continue
            chunk: list[Handle] = []
            nbytes = 0
            for h in group:
                n = h.tensor.nbytes
                if n >= ALONE_BYTES:
                    self.allreduce_one(h, tl)    # in place on its own buffer (or straight into its result)
                    continue
                if chunk and nbytes + n > threshold:
                    self._of(chunk[0]).allreduce(chunk, nbytes, tl)
                    chunk, nbytes = [], 0
                chunk.append(h)
                nbytes += n
            if len(chunk) == 1:
                self.allreduce_one(chunk[0], tl)
            elif chunk:
                self._of(chunk[0]).allreduce(chunk, nbytes, tl)
        if others:
            self.run_others(others, tl)

    def _of(self, h: Handle) -> Any:
        """The executor of ``h``'s memory (fuse keys keep device and host requests in separate groups)."""
        return self.devices() if h.device else self.host

    def allreduce_one(self, h: Handle, tl: Timeline | None) -> None:
        if h.device:
            self.devices().allreduce([h], h.tensor.nbytes, tl)
        else:
            self.host.allreduce_one(h, tl)

    def run_others(self, hs: list[Handle], tl: Timeline | None) -> None:
        """Everything but fused allreduces, host requests first (the same split on every member: signatures
        say which memory a request is in), each executor in the agreed order."""
        host = [h for h in hs if not h.device]
        if host:
            self.host.run_others(host, tl)
        if len(host) < len(hs):
            self.devices().run_others([h for h in hs if h.device], tl)
