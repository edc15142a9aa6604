"""The engine: one :class:`Lane` per process set this rank belongs to, a small Horovod controller.

The rooms of the engine:

* **this module, the lane**: the queue and the driver. ``submit`` appends a
  :class:`~hpcvod.runtime.handles.Handle` and, for asynchronous calls, wakes the lane's background thread.
  Exactly one thread at a time "drives" a lane (runs cycles; every MPI call of the lane happens in the driver).
  A blocking call that finds the lane idle drives it itself, in the caller's thread, so a lone ``allreduce``
  costs one small negotiation plus one MPI call and no thread hand-off. Otherwise the background thread drives,
  and callers of ``synchronize`` take over as soon as it lets go. Ranks with nothing pending do not take part
  in negotiations (there is no cycle floor); the ones waiting poll with a short spin and then a backing-off
  sleep, so a rank waiting for a slow peer does not burn a core.
* **negotiation.py**: one cycle of agreement (a bit vector per rank in one ``Iallreduce``), the full round when
  a request is new, mismatch and out-of-step errors, the response cache, joined ranks' stand-ins.
* **the executors**, one interface: host.py (host memory over MPI: fusion into one buffer and one in-place
  ``MPI_Allreduce``, results from a pool of aligned blocks) and nccl.py (device memory over NCCL, or staged
  through the host executor). The lane groups the agreed requests (allreduces of one dtype/op/scaling fused up
  to ``HPCVOD_FUSION_THRESHOLD`` bytes) and gives each group to the executor of its memory.
* **tables.py**: the op and dtype tables both executors use.

Lanes of different process sets have separate communicators and threads, so they cannot deadlock each other
(this needs MPI_THREAD_MULTIPLE, which mpi4py requests by default).
"""

from __future__ import annotations

import collections
import itertools
import pickle
import sys
import threading
import time
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from . import handles as K
from .errors import HpcvodError, HpcvodInputError, HpcvodShutdownError
from .handles import Handle
from .host import HostOps
from .negotiation import FIRST_BIT, NEED_FULL, NOT_JOINED, SOME_JOINED, Negotiation, _Entry, fuse_key
from .timeline import NEGOTIATE, Timeline

_perf = time.perf_counter

NAMED_SWEEP = 4096          # names remembered before finished ones are forgotten (Lane._claim_names)
SPIN_SECONDS = 0.002       # see Lane._wait_request


class Lane(Negotiation):
    """The engine of one process set on this rank (see the module docstring); its negotiation and response
    cache are in negotiation.py, its executors in host.py and nccl.py."""

    def __init__(self, comm: MPI.Comm, set_id: int, ranks: list[int], settings: Any,
                 timeline: Optional[Timeline] = None) -> None:
        self.comm = comm
        self.set_id = set_id
        self.ranks = ranks                       # global ranks of the members, in set-rank order
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.fusion_threshold = settings.fusion_threshold
        self.cache_capacity = settings.cache_capacity
        self.cycle_time = settings.cycle_time_ms / 1000.0
        self._hierarchical = bool(settings.hierarchical_allreduce)
        # the executors: host memory over MPI...
        self._host = HostOps(comm, self._hierarchical, self.fusion_threshold)
        self._gpu_operations = settings.gpu_operations
        self._device_ops: Any = None             # ...and device memory over NCCL, made on the first device request
        self.timeline = timeline                 # the live Timeline or None (set by start/stop_timeline)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        # Submitted, not yet taken by the driver. A deque: append/popleft are atomic, so submitters need no lock.
        self._queue: collections.deque[Handle] = collections.deque()
        self._waiting: dict[str, Handle] = {}    # negotiated, not yet ready everywhere (driver-owned)
        self._driving = False
        self._nwaiters = 0
        self._bg: Optional[threading.Thread] = None
        self._bg_sleeping = False
        self._stopping = False
        self._abort: Optional[BaseException] = None
        # Response cache: same content on every member, because it only changes from agreed data.
        self._cache: dict[Any, _Entry] = {}
        self._by_bit: dict[int, _Entry] = {}
        self._free_bits: list[int] = []
        self._next_bit = FIRST_BIT
        self._all_bits = 0                       # mask of the bits of live entries
        self._nbytes = 8
        self._join: Optional[Handle] = None
        self._join_new = False
        self._inflight: list[Handle] = []        # agreed and being executed (failed together on an error)
        self._names = itertools.count(1)         # unnamed collectives (next() is atomic under the GIL)
        self._named: dict[str, Handle] = {}      # the last handle submitted under each name (see _claim_names)
        self._named_limit = NAMED_SWEEP
        self.cycles = 0                          # negotiations started (the same sequence on every member)
        self.agreed = 0                          # negotiations completed
        # (agreed, error) once a member has left cleanly: negotiations past its count can never complete
        self._left: Optional[tuple[int, BaseException]] = None
        self._for_caller = False                 # the driver runs for a caller that waits (not the bg thread)

    # ----------------------------------------------------------------------------------- submission
    def auto_name(self) -> str:
        """The name of the next unnamed collective.

        One counter for every kind of collective: ranks that call different collectives in the same position
        get the same name and hence a mismatch error instead of a hang.
        """
        return f"noname.{next(self._names)}"

    def _claim_names(self, hs: "list[Handle]") -> None:
        """Refuse a name still in flight on this rank, before anything is queued (Horovod raises at submission).

        Two requests under one name cannot be told apart by the other ranks: accepted, they would pair with the
        wrong partners or leave the ranks out of step. Unnamed requests get unique names and are not tracked.
        """
        named = self._named
        batch: set[str] = set()
        for h in hs:
            if not h.unnamed:
                old = named.get(h.name)
                if (old is not None and not old.done) or h.name in batch:
                    raise HpcvodInputError(
                        f"a collective named {h.name!r} is still in flight on this rank (submitted earlier and "
                        f"not finished): names of outstanding collectives must be unique, as in Horovod; "
                        f"synchronize() the first one or use another name")
                batch.add(h.name)
        for h in hs:
            if not h.unnamed:
                named[h.name] = h
        if len(named) > self._named_limit:       # forget finished ones now and then (names that change per step)
            for name in [n for n, o in named.items() if o.done]:
                del named[name]
            self._named_limit = max(NAMED_SWEEP, 2 * len(named))

    def submit(self, h: Handle) -> Handle:
        """Queue ``h`` for the background thread (asynchronous forms). Lock-free in the common case."""
        if self._abort is not None:
            raise self._abort
        if not h.unnamed:
            self._claim_names([h])
        if self.timeline is not None:
            h.t_submit = _perf()               # otherwise the driver stamps it when it takes the request
        self._queue.append(h)
        # Read without the lock: _bg_main publishes "sleeping" *before* it last looks at the queue, so
        # either it sees this request or we see it sleeping.
        if self._bg_sleeping or self._bg is None:
            self._wake_bg()
        return h

    def submit_many(self, hs: list[Handle]) -> None:
        """Queue several handles atomically (one deque.extend), so that they are negotiated together."""
        if self._abort is not None:
            raise self._abort
        self._claim_names(hs)
        for h in hs:
            h.lane = self
        self._queue.extend(hs)
        if self._bg_sleeping or self._bg is None:
            self._wake_bg()

    def _wake_bg(self) -> None:
        with self._lock:
            if not self._driving:              # a driver hands leftover work to the thread when it stops
                self._wake_bg_locked()

    def run(self, h: Handle) -> Any:
        """Submit ``h`` and wait for it. On an idle lane this thread negotiates and runs it itself."""
        h.lane = self
        if not h.unnamed:
            self._claim_names([h])
        h.t_submit = _perf()
        lock = self._lock
        lock.acquire()
        if self._driving or self._queue or self._waiting or self._join is not None or self._abort is not None:
            if self._abort is not None:
                lock.release()
                raise self._abort
            self._queue.append(h)              # under the lock: a driver stopping now sees it
            if self._driving:
                lock.release()
                self.wait(h)
            else:
                self._driving = True
                lock.release()
                self._drive(h)
        else:
            self._driving = True
            lock.release()
            self._solo(h)
        if h.error is not None:
            raise h.error
        return h.result

    def _solo(self, h: Handle) -> None:
        """The idle-lane fast path: one cached request, one tiny negotiation, one MPI call, this thread.

        This is every blocking call of a training loop, so it avoids everything the general cycle needs
        for many requests (kept in step with _cycle and _process).
        """
        self._for_caller = True
        try:
            if h.kind == K.JOIN:
                self._join = h
                self._join_new = True
            else:
                if h.unnamed:
                    h.key = ("#", h.sig, 0)
                e = self._cache.get(h.key)
                if e is not None and e.sig == h.sig:
                    h.entry = e
                    mask = e.mask
                    self.cycles += 1
                    if self._left is not None:
                        self._check_left()
                    buf = bytearray((NOT_JOINED | (self._all_bits & ~mask)).to_bytes(self._nbytes, "little"))
                    req = self.comm.Iallreduce(MPI.IN_PLACE, [buf, MPI.BYTE], MPI.BOR)
                    if not req.Test():
                        self._wait_request(req)
                    self.agreed = self.cycles
                    g = int.from_bytes(buf, "little")
                    if g & (NEED_FULL | SOME_JOINED) or g & mask:
                        self._waiting[h.name] = h
                        self._process(g, False, False, mask)      # the others want more than this request
                    else:
                        e.last = self.cycles
                        tl = self.timeline
                        if tl is not None:
                            h.t_ready = _perf()
                            tl.span(h.name, NEGOTIATE, h.t_submit, h.t_ready)
                        if h.kind == K.ALLREDUCE:
                            self._allreduce_one(h, tl)
                        else:
                            self._run_others([h], tl)
                        return
                else:
                    self._waiting[h.name] = h
            while not h.done:
                self._cycle()
        except BaseException as exc:
            if not h.done and h.name not in self._waiting:
                self._inflight.append(h)
            self._fail_everything(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._release_driver()

    def wait(self, h: Handle) -> None:
        """Block until ``h`` is done, driving the lane whenever no other thread does."""
        if h.done:
            return
        with self._lock:
            while not h.done:
                if self._abort is not None:
                    raise self._abort
                if not self._driving:
                    self._driving = True
                    break
                self._nwaiters += 1
                self._cv.wait()
                self._nwaiters -= 1
            else:
                return
        self._drive(h)

    # ------------------------------------------------------------------------------ the driver loop
    def _wake_bg_locked(self) -> None:
        if self._bg is None:
            self._bg = threading.Thread(target=self._bg_main, name=f"hpcvod-lane-{self.set_id}", daemon=True)
            self._bg.start()
        elif self._bg_sleeping:
            self._bg_sleeping = False
            self._cv.notify_all()

    def _release_driver(self) -> None:
        with self._lock:
            self._driving = False
            if (self._queue or self._waiting or self._join is not None) and not self._stopping \
                    and self._abort is None:
                self._wake_bg_locked()
            if self._nwaiters:
                self._cv.notify_all()

    def _drive(self, target: Optional[Handle]) -> None:
        """Run cycles until ``target`` is done (or, for the background thread, until no work is left)."""
        self._for_caller = target is not None
        try:
            while True:
                self._cycle()
                if target is not None:
                    if target.done:
                        break
                elif not (self._queue or self._waiting or self._join is not None) or self._stopping:
                    break
        except BaseException as exc:  # an MPI error or an abort: nothing in flight can complete any more
            self._fail_everything(exc)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit
        finally:
            self._release_driver()

    def _has_work(self) -> bool:
        return not self._driving and self._abort is None and bool(
            self._queue or self._waiting or self._join is not None)

    def _bg_main(self) -> None:
        while True:
            with self._lock:
                while not self._has_work():
                    if self._stopping:
                        return
                    self._bg_sleeping = True
                    if self._has_work():       # submit() appends without the lock, then reads "sleeping"
                        break
                    self._cv.wait()
                if self._stopping:
                    return
                self._bg_sleeping = False
                self._driving = True
            if self.cycle_time:
                time.sleep(self.cycle_time)
            try:
                self._drive(None)
            except BaseException as exc:  # pragma: no cover - reported to every waiter by _drive
                print(f"hpcvod: engine thread of process set {self.set_id} failed: {exc!r}", file=sys.stderr)

    def _fail_everything(self, exc: BaseException) -> None:
        err = exc if isinstance(exc, HpcvodError) else HpcvodError(
            f"collective failed in process set {self.set_id}: {type(exc).__name__}: {exc}")
        with self._lock:
            if self._abort is None:
                self._abort = err
            pending = list(self._queue) + list(self._waiting.values()) + self._inflight
            self._inflight = []
            self._queue.clear()
            self._waiting.clear()
            if self._join is not None:
                pending.append(self._join)
                self._join = None
            self._cv.notify_all()
        for h in pending:
            if not h.done:
                h.error = err
                h.done = True

    def abort(self, exc: BaseException) -> None:
        """Fail every pending and future operation with ``exc`` and wake every waiter."""
        with self._lock:
            if self._abort is None:
                self._abort = exc
            driving = self._driving
            self._cv.notify_all()
        if not driving:
            self._fail_everything(exc)

    def peer_left(self, agreed: int, exc: BaseException) -> None:
        """A member shut down cleanly after ``agreed`` negotiations of this lane. Negotiations up to that count
        complete (it took part in them); any later one, pending or future, fails with ``exc`` instead of
        waiting for ever (Horovod: "Horovod has been shut down ... after one of the ranks finished")."""
        with self._lock:
            if self._left is None or agreed < self._left[0]:
                self._left = (agreed, exc)
            self._cv.notify_all()

    def _check_left(self) -> None:
        left = self._left
        if left is not None and self.cycles > left[0]:
            raise left[1]

    def busy_at(self) -> Optional[int]:
        """The negotiation a driver is busy with, or None when the lane is idle."""
        return self.cycles if self._driving else None

    def stop(self) -> None:
        """Shut the lane down: pending operations fail with HpcvodShutdownError."""
        with self._lock:
            self._stopping = True
            if self._abort is None and (self._queue or self._waiting or self._join):
                self._abort = HpcvodShutdownError(
                    f"hpcvod was shut down while collectives were pending in process set {self.set_id}")
            self._cv.notify_all()
            bg = self._bg
            driving = self._driving
        if not driving:
            self._fail_everything(HpcvodShutdownError("hpcvod was shut down"))
        if bg is not None and bg is not threading.current_thread():
            bg.join(timeout=2.0)

    def free(self) -> None:
        """Release the lane's communicators (after stop(), when nothing is in flight)."""
        if self._device_ops is not None:
            self._device_ops.close()
            self._device_ops = None
        self._host.free()
        self.comm.Free()

    def pending(self) -> list[tuple[str, int, float]]:
        """(name, kind, seconds waiting) of every request not yet done (for the stall inspector)."""
        now = _perf()
        items = list(self._waiting.values()) + list(self._queue)
        if self._join is not None:
            items.append(self._join)
        # a request still in the queue may not be stamped yet (t_submit 0): it has just arrived
        return [(h.name, h.kind, now - h.t_submit if h.t_submit else 0.0) for h in items if not h.done]

    # ---------------------------------------------------------------------------------- one cycle


    def _wait_request(self, req: MPI.Request) -> None:
        """Poll ``req``: spin (like MPI itself) for SPIN_SECONDS, then sleep with a growing (<= 1 ms) back-off.

        Peers routinely arrive a few hundred microseconds apart (a large reduction ends earlier on one rank
        than on the other), so the spin must cover that; a peer that is still computing costs a sleeping
        poll, not a core.
        """
        test = req.Test
        if test():
            return
        t0 = _perf()
        while not test():
            waited = _perf() - t0
            if waited < SPIN_SECONDS:
                continue
            if self._abort is not None:
                raise self._abort
            if self._left is not None:
                self._check_left()
            time.sleep(min(0.001, waited * 0.05))



    def _finish(self, h: Handle, error: Optional[BaseException] = None) -> None:
        if error is not None:
            h.error = error
        h.done = True
        if self._nwaiters:
            self._notify()

    def _notify(self) -> None:
        with self._lock:
            self._cv.notify_all()

    def _execute(self, ready: list[Handle], tl: Optional[Timeline]) -> None:
        """Run the agreed responses: fused allreduces first (grouped by dtype/op/scaling), then the rest."""
        if len(ready) == 1:
            h = ready[0]
            if h.kind == K.ALLREDUCE:
                self._allreduce_one(h, tl)
            else:
                self._run_others([h], tl)
        else:
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
                        self._allreduce_one(h, tl)
                    continue
                chunk: list[Handle] = []
                nbytes = 0
                for h in group:
                    n = h.tensor.nbytes
                    if chunk and nbytes + n > threshold:
                        self._executor(chunk[0]).allreduce(chunk, nbytes, tl)
                        chunk, nbytes = [], 0
                    chunk.append(h)
                    nbytes += n
                if len(chunk) == 1:
                    self._allreduce_one(chunk[0], tl)
                elif chunk:
                    self._executor(chunk[0]).allreduce(chunk, nbytes, tl)
            if others:
                self._run_others(others, tl)
        if self._nwaiters:
            self._notify()

    def _devices(self) -> Any:
        """The lane's device executor (collective on first use: every member gets here in the agreed order)."""
        ops = self._device_ops
        if ops is None:
            from .nccl import DeviceOps
            ops = self._device_ops = DeviceOps(self.comm, self.set_id, self._host, self._gpu_operations,
                                               self._hierarchical)
        return ops

    def _executor(self, h: Handle) -> Any:
        """The executor of ``h``'s memory (fuse keys keep device and host requests in separate groups)."""
        return self._devices() if h.device else self._host

    def _allreduce_one(self, h: Handle, tl: Optional[Timeline]) -> None:
        if h.device:
            self._devices().allreduce([h], h.tensor.nbytes, tl)
        else:
            self._host.allreduce_one(h, tl)

    def _run_others(self, hs: list[Handle], tl: Optional[Timeline]) -> None:
        """Everything but fused allreduces, host requests first (the same split on every member: signatures
        say which memory a request is in), each executor in the agreed order."""
        host = [h for h in hs if not h.device]
        if host:
            self._host.run_others(host, tl)
        if len(host) < len(hs):
            self._devices().run_others([h for h in hs if h.device], tl)






def dumps(obj: Any) -> np.ndarray:
    """Pickle ``obj`` into a uint8 array (for broadcast_object / allgather_object)."""
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)


def loads(data: np.ndarray) -> Any:
    return pickle.loads(data.tobytes())
