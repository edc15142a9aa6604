"""The engine: negotiation by name, the response cache, tensor fusion and the MPI calls.

One :class:`Lane` per process set this rank belongs to. A lane is a small Horovod controller:

* **Queue.** ``submit`` appends a :class:`~hpcvod.runtime.handles.Handle` under a lock and, for asynchronous
  calls, wakes the lane's background thread.
* **Driving.** Exactly one thread at a time "drives" a lane (runs cycles; every MPI call of the lane happens
  in the driver). A blocking call that finds the lane idle drives it itself, in the caller's thread, so a lone
  ``allreduce`` costs one small negotiation plus one MPI call and no thread hand-off. Otherwise the background
  thread drives, and callers of ``synchronize`` take over as soon as it lets go.
* **Negotiation** (one cycle). Every rank that has pending work contributes a bit vector to one
  ``Iallreduce(BOR)``: a bit per response-cache entry it has *not* submitted, plus flags. An entry whose bit
  nobody set is ready everywhere; the common steady-state cycle is therefore one tiny collective. Ranks with
  nothing pending do not take part (there is no cycle floor); the ones waiting poll the request with a short
  spin and then a backing-off sleep, so a rank waiting for a slow peer does not burn a core. When any rank
  holds a request the cache does not know (first iteration, new shape, cache off), the flags say so and all
  ranks exchange their full pending lists (``allgather``); each rank then computes the same responses from the
  same data: a name submitted by every rank with equal signatures becomes a response (and a cache entry), a
  name submitted by every rank with different signatures becomes an :class:`HpcvodMismatchError` on every rank.
* **Execution** in the agreed order. Ready allreduces of the same dtype/op/scaling are fused into one buffer
  (up to ``HPCVOD_FUSION_THRESHOLD`` bytes) with one ``numpy.concatenate`` and reduced with one in-place
  ``MPI_Allreduce``. In-place requests use the lane's reusable fusion buffer; out-of-place requests reduce in a
  fresh block whose slices become the results, so there is no copy-out at all.

Lanes of different process sets have separate communicators and threads, so they cannot deadlock each other
(this needs MPI_THREAD_MULTIPLE, which mpi4py requests by default).
"""

from __future__ import annotations

import collections
import itertools
import operator
import pickle
import sys
import threading
import time
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from . import handles as K
from .errors import (HpcvodError, HpcvodInputError, HpcvodMismatchError, HpcvodShutdownError, first_of)
from .handles import Handle
from .hierarchical import MpiPrimitives, Topology, hierarchical_allreduce
from .timeline import MEMCPY_IN, MEMCPY_OUT, NEGOTIATE, QUEUE, Timeline

# Negotiation word: flags in the low bits, then one bit per response-cache entry ("I have NOT submitted it").
NEED_FULL = 1      # some rank holds a request the cache does not know: exchange full lists
NOT_JOINED = 2     # some rank has not joined yet
SOME_JOINED = 4    # some rank has joined (it contributes dummies to what the others run)
FIRST_BIT = 3
_JOIN = K.JOIN

_perf = time.perf_counter

# Horovod's reduction op numbering.
AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT = 0, 1, 2, 3, 4, 5
OP_NAMES = {AVERAGE: "Average", SUM: "Sum", ADASUM: "Adasum", MIN: "Min", MAX: "Max", PRODUCT: "Product"}

_MPI_NAMES = {K.ALLREDUCE: "MPI_ALLREDUCE", K.ALLGATHER: "MPI_ALLGATHERV", K.BROADCAST: "MPI_BCAST",
              K.ALLTOALL: "MPI_ALLTOALLV", K.REDUCESCATTER: "MPI_REDUCE_SCATTER"}

_mpi_types: dict[str, MPI.Datatype] = {}


SUPPORTED_DTYPES = ("bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, float64, "
                    "complex64, complex128")


def check_dtype(dtype: np.dtype, what: str = "tensor") -> None:
    """Refuse what MPI would move as bytes or reduce as integers: dates and durations (a sum of dates is no
    date), Python objects (pointers), strings and structured records."""
    if dtype.hasobject or dtype.kind in "OUSVMm":
        raise HpcvodInputError(f"{what}: dtype {dtype} is not supported by hpcvod's collectives; supported: "
                               f"{SUPPORTED_DTYPES} (convert first, e.g. datetime64 with .astype('int64'))")


def mpi_type(dtype: np.dtype) -> MPI.Datatype:
    """The MPI datatype of a NumPy dtype (cached; raises HpcvodInputError for unsupported dtypes)."""
    key = dtype.str
    t = _mpi_types.get(key)
    if t is None:
        check_dtype(dtype)
        if dtype == np.bool_:
            t = MPI.C_BOOL
        elif not dtype.isnative:
            raise HpcvodInputError(f"dtype {dtype} is not in native byte order; convert with .astype(...) first")
        else:
            # predefined datatypes only: MPI reductions are undefined on derived ones
            t = MPI._typedict.get(dtype.char)
            if t is None or t == MPI.DATATYPE_NULL:
                raise HpcvodInputError(f"dtype {dtype} has no MPI datatype; use a numeric or bool array")
        _mpi_types[key] = t
    return t


def mpi_reduce_op(op: int, dtype: np.dtype) -> MPI.Op:
    """The MPI reduction for a Horovod op on a dtype (raises HpcvodInputError where it is undefined)."""
    if dtype == np.bool_:
        if op == AVERAGE:
            raise HpcvodInputError("op=Average is undefined for bool arrays; use Sum (logical or) or Min/Max")
        return MPI.LOR if op in (SUM, MAX) else MPI.LAND
    if dtype.kind == "c" and op in (MIN, MAX):
        raise HpcvodInputError(f"op={OP_NAMES[op]} is undefined for complex arrays")
    if op in (AVERAGE, SUM):
        return MPI.SUM
    if op == MIN:
        return MPI.MIN
    if op == MAX:
        return MPI.MAX
    if op == PRODUCT:
        return MPI.PROD
    if op == ADASUM:
        raise NotImplementedError(
            "op=Adasum is not implemented in hpcvod yet (use Average or Sum); see docs/runtime.md")
    raise HpcvodInputError(f"unknown reduction op {op!r}; expected Average, Sum, Min, Max or Product")


def identity_fill(op: int, dtype: np.dtype, shape: tuple) -> np.ndarray:
    """A joined rank's neutral contribution to a reduction."""
    if op in (AVERAGE, SUM):
        return np.zeros(shape, dtype)
    if op == PRODUCT:
        return np.ones(shape, dtype)
    if dtype == np.bool_:
        return np.full(shape, op == MIN, dtype)
    info = np.finfo(dtype) if dtype.kind in "fc" else np.iinfo(dtype)
    return np.full(shape, info.max if op == MIN else info.min, dtype)


def scale_into(src: np.ndarray, factor: float, out: np.ndarray) -> None:
    """``out = factor * src`` in Horovod's precision: float16 and float32 in float32 arithmetic (the factor
    rounded to float32, float16 values widened, the product rounded once), everything else in float64 (integers
    truncate toward zero). NumPy alone would round the factor to float16 first: one unit in the last place off."""
    kind = src.dtype.kind
    if kind == "f" and src.dtype.itemsize <= 4:
        # dtype= picks the float32 loop: a float16 array times a float32 scalar still runs NumPy's float16 loop
        np.multiply(src, np.float32(factor), out=out, casting="unsafe", dtype=np.float32)
    elif kind in "iu":
        np.multiply(src, factor, out=out, casting="unsafe", dtype=np.float64)
    else:
        np.multiply(src, factor, out=out, casting="unsafe")


def describe_sig(sig: tuple) -> str:
    """A short human description of a request signature (for mismatch errors)."""
    kind = sig[0]
    name = K.KIND_NAMES.get(kind, "?")
    if sig[-1] == K.DEVICE:
        return describe_sig(sig[:-1]).replace("(", "(device=cuda, ", 1)
    if kind in (K.ALLREDUCE, K.REDUCESCATTER):
        _, dt, shape, op, pre, post = sig
        extra = f" prescale={pre}" if pre != 1.0 else ""
        extra += f" postscale={post}" if post != 1.0 else ""
        return f"{name}(dtype={np.dtype(dt).name}, shape={shape}, op={OP_NAMES.get(op, op)}{extra})"
    if kind in (K.ALLGATHER, K.ALLTOALL):
        return f"{name}(dtype={np.dtype(sig[1]).name}, shape=(*, {', '.join(map(str, sig[2]))}))" \
            if sig[2] else f"{name}(dtype={np.dtype(sig[1]).name}, shape=(*,))"
    if kind == K.BROADCAST:
        return f"{name}(dtype={np.dtype(sig[1]).name}, shape={sig[2]}, root_rank={sig[3]})"
    return f"{name}()"


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
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
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


class _Entry:
    __slots__ = ("key", "sig", "bit", "mask", "last", "fuse")

    def __init__(self, key: Any, sig: tuple, bit: int, last: int) -> None:
        self.key = key
        self.sig = sig
        self.bit = bit
        self.mask = 1 << bit
        self.last = last          # LRU tick: the negotiation count, identical on every member
        self.fuse = fuse_key(sig)


_fuse_keys: dict[tuple, tuple] = {}


def fuse_key(sig: tuple) -> Any:
    """Allreduces with the same key (dtype, op, scaling) can share one fusion buffer.

    Keys are interned, so the engine compares them with ``is``.
    """
    if sig[0] != K.ALLREDUCE:
        return None
    key = (sig[1], sig[3], sig[4], sig[5], sig[-1] == K.DEVICE)
    return _fuse_keys.setdefault(key, key)


# A request waiting longer than this forces a full round even when every rank's requests are cached, so
# that unnamed collectives submitted in different orders still end in a mismatch error, not a hang.
FULL_ROUND_AFTER_SECONDS = 1.0
NAMED_SWEEP = 4096          # names remembered before finished ones are forgotten (Lane._claim_names)
DEADLOCK_AFTER_SECONDS = 2.0  # every rank blocked this long on collectives nobody else has: out of step
SPIN_SECONDS = 0.002       # see Lane._wait_request


class Lane:
    """The engine of one process set on this rank (see the module docstring)."""

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
        # HPCVOD_HIERARCHICAL_ALLREDUCE: the node split is made on the first allreduce (a collective; every
        # member runs it at the same point of the agreed order) and dropped if it cannot help (one node).
        self._hierarchical = bool(settings.hierarchical_allreduce) and self.size > 1
        self._topology: Any = None
        self._gpu_operations = settings.gpu_operations
        self._device_ops: Any = None             # nccl.DeviceOps, made on the first device request
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
        self._fusion = np.empty(0, np.uint8)     # reusable fusion buffer (grows up to the threshold)
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
                            self._run_other([h], tl)
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
        if self._topology is not None:
            self._topology.free()
            self._topology = None
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
    def _cycle(self) -> None:
        queue = self._queue
        waiting = self._waiting
        cache = self._cache
        now = _perf()
        old = now - FULL_ROUND_AFTER_SECONDS
        need_full = False
        mine = 0                                 # bits of my cached requests
        counts: Optional[dict] = None
        # Requests carried over from earlier cycles are classified again: the cache may have changed.
        carried = list(waiting.values()) if waiting else ()
        # Take the new requests and classify them in the same pass (the usual case: nothing carried over).
        # Classification: a request the response cache knows, with the same signature, sets its bit in
        # ``mine``; anything else asks every rank for a full round. Kept in step with the loop below.
        for _ in range(len(queue)):            # a snapshot: later submissions wait for the next cycle
            h = queue.popleft()
            if not h.t_submit:
                h.t_submit = now
            if h.kind == _JOIN:
                if self._join is not None:
                    self._finish(h, HpcvodInputError("join() called while this rank's join is pending"))
                else:
                    self._join = h
                    self._join_new = True
                continue
            name = h.name
            if name in waiting:
                self._finish(h, HpcvodInputError(
                    f"a collective named {name!r} is already pending on this rank; names of "
                    f"outstanding collectives must be unique"))
                continue
            waiting[name] = h
            if carried:
                continue                           # classified below, after the carried ones
            if h.unnamed:
                # unnamed requests are cached by (signature, position among my waiting ones of that signature)
                if counts is None:
                    counts = {}
                j = counts.get(h.sig, 0)
                counts[h.sig] = j + 1
                h.key = ("#", h.sig, j)
            e = cache.get(h.key)
            if e is not None and e.sig == h.sig:
                h.entry = e
                mine |= e.mask
            else:
                h.entry = None
                need_full = True
        if carried:
            for h in waiting.values():
                if h.unnamed:
                    if counts is None:
                        counts = {}
                    j = counts.get(h.sig, 0)
                    counts[h.sig] = j + 1
                    h.key = ("#", h.sig, j)
                e = cache.get(h.key)
                if e is not None and e.sig == h.sig:
                    h.entry = e
                    mine |= e.mask
                else:
                    h.entry = None
                    need_full = True
                if h.t_submit < old:
                    need_full = True
        tl = self.timeline
        if tl is not None:
            tl.cycle_mark(now)
        joined = self._join is not None
        word = SOME_JOINED if joined else NOT_JOINED | (self._all_bits & ~mine)
        if need_full:
            word |= NEED_FULL
        fresh_join = self._join_new
        self._join_new = False
        self.cycles += 1
        if self._left is not None:
            self._check_left()
        self._process(self._exchange(word), joined, fresh_join, mine)

    def _exchange(self, word: int) -> int:
        """The negotiation collective: OR of every member's word."""
        buf = bytearray(word.to_bytes(self._nbytes, "little"))
        req = self.comm.Iallreduce(MPI.IN_PLACE, [buf, MPI.BYTE], MPI.BOR)
        if not req.Test():
            self._wait_request(req)
        self.agreed = self.cycles
        return int.from_bytes(buf, "little")

    def _process(self, g: int, joined: bool, fresh_join: bool, mine: int) -> None:
        """Derive what is ready from the negotiation result ``g`` (identically on every member) and run it.

        ``mine``: the bits of this rank's cached requests in this negotiation.
        """
        t_agreed = _perf()
        waiting = self._waiting
        everything = False                       # every waiting request of mine is ready
        if g & SOME_JOINED or joined:
            if not g & NOT_JOINED:
                self._complete_join(fresh_join)
                return
            ready = []
            by_key = {h.key: h for h in waiting.values() if h.entry is not None}
            free = ~g & self._all_bits
            while free:
                low = free & -free
                entry = self._by_bit[low.bit_length() - 1]
                h = by_key.get(entry.key)
                if h is None or h.entry is not entry:
                    h = self._dummy(entry.key, entry.sig)
                    h.entry = entry
                ready.append(h)
                free ^= low
        else:
            ready_bits = mine & ~g
            if not ready_bits:
                ready = []
            elif ready_bits == mine:             # the steady state: everything I have is ready everywhere
                ready = [h for h in waiting.values() if h.entry is not None]
                everything = len(ready) == len(waiting)
            else:
                ready = [h for h in waiting.values() if h.entry is not None and h.entry.mask & ready_bits]
            if len(ready) > 1:
                ready.sort(key=_bit_of)          # the same order on every member (cheap: usually sorted)
        if ready:
            if len(self._cache) * 2 >= self.cache_capacity:
                # LRU recency matters only once eviction can come near (same cache size on every member)
                tick = self.cycles
                for h in ready:
                    h.entry.last = tick
            if everything:
                waiting.clear()
            else:
                for h in ready:
                    if not h.dummy:
                        del waiting[h.name]
        if g & NEED_FULL:
            ready.extend(self._full_round(joined))
        if g & SOME_JOINED and ready:
            ready = self._refuse_after_join(ready)
        if not ready:
            return
        for h in ready:
            h.t_ready = t_agreed
        tl = self.timeline
        if tl is not None:
            tl.spans([h.name for h in ready if not h.dummy], NEGOTIATE, min(h.t_submit for h in ready), t_agreed)
        self._inflight = ready
        self._execute(ready, tl)
        self._inflight = []

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

    def _full_round(self, joined: bool) -> list[Handle]:
        """Exchange every rank's pending list and derive the same responses on every member."""
        waiting = self._waiting
        items = [(h.name, h.key if h.unnamed else None, h.entry.bit if h.entry is not None else h.sig)
                 for h in waiting.values()]
        everyone = self.comm.allgather((joined, items, self._stuck()))
        by_bit = self._by_bit
        seen: dict[str, dict[int, tuple]] = {}
        keys: dict[str, Any] = {}
        order: list[str] = []
        active = [r for r, (j, _, _) in enumerate(everyone) if not j]
        for r, (_, its, _) in enumerate(everyone):
            for name, key, s in its:
                sig = by_bit[s].sig if isinstance(s, int) else s
                d = seen.get(name)
                if d is None:
                    seen[name] = d = {}
                    order.append(name)
                    keys[name] = name if key is None else key
                d[r] = sig
        out: list[Handle] = []
        for name in order:
            d = seen[name]
            if not all(r in d for r in active):
                continue
            sigs = set(d.values())
            mine = waiting.pop(name, None)
            key = keys[name]
            if len(sigs) == 1:
                sig = next(iter(sigs))
                entry = self._cache_put(key, sig)
                if mine is None:
                    mine = self._dummy(key, sig)
                    mine.name = name
                mine.entry = entry
                out.append(mine)
            else:
                self._cache_drop(key)
                detail = "; ".join(f"rank {self.ranks[r]}: {describe_sig(s)}" for r, s in sorted(d.items()))
                err = HpcvodMismatchError(
                    f"collective {name!r} differs across ranks (process set {self.set_id}): {detail}")
                if mine is not None:
                    self._finish(mine, err)
        if not out and len(active) == self.size and all(stuck for _, _, stuck in everyone):
            self._fail_deadlock(everyone)
        return out

    def _stuck(self) -> bool:
        """This rank can submit nothing more: a caller waits on a collective, nothing new came for a while."""
        if self._queue or not (self._for_caller or self._nwaiters) or not self._waiting:
            return False
        newest = max(h.t_submit for h in self._waiting.values())
        return _perf() - newest > DEADLOCK_AFTER_SECONDS

    def _fail_deadlock(self, everyone: list) -> None:
        """Every member waits on collectives no other member submitted, and none can submit more: a rank
        skipped collectives (an exception it caught between two of them) and the ranks are out of step. Waiting
        would hang for ever; the same error on every member is what the user can act on."""
        detail = "; ".join(f"rank {self.ranks[r]} waits for {first_of([repr(name) for name, _, _ in its], 4)}"
                           for r, (_, its, _) in enumerate(everyone))
        err = HpcvodMismatchError(
            f"ranks are out of step in process set {self.set_id}: every rank waits for collectives that no other "
            f"rank submitted ({detail}); a rank skipped collectives (an exception between two of them?)")
        for h in list(self._waiting.values()):
            self._finish(h, err)
        self._waiting.clear()

    def _refuse_after_join(self, ready: list[Handle]) -> list[Handle]:
        """While a rank has joined, only allreduces (and barriers) can run: a joined rank can add neutral
        values to a sum but has no rows to gather, no slice to reduce and no value to broadcast. As in Horovod,
        the others' allgather, broadcast, alltoall and reducescatter fail (on every member the same: ``g`` is
        agreed) and nothing runs for them."""
        keep = []
        for h in ready:
            if h.kind in (K.ALLREDUCE, K.BARRIER):
                keep.append(h)
            elif not h.dummy:
                self._finish(h, HpcvodInputError(
                    f"{K.KIND_NAMES.get(h.kind, 'collective')} {h.name!r}: not supported while a rank has joined "
                    f"(only allreduce is, as in Horovod); with DistributedOptimizer use sparse_as_dense=True"))
        return keep

    def _complete_join(self, fresh: bool) -> None:
        """Every rank has joined: agree on the last one to join and release join() everywhere."""
        mine = np.array([self.ranks[self.rank] if fresh else -1], np.int64)
        last = np.empty(1, np.int64)
        self.comm.Allreduce([mine, MPI.INT64_T], [last, MPI.INT64_T], MPI.MAX)
        h, self._join = self._join, None
        if h is not None:
            h.result = int(last[0])
            h.done = True
            self._notify()

    # ------------------------------------------------------------------------------ response cache
    def _cache_put(self, key: Any, sig: tuple) -> Optional[_Entry]:
        if not self.cache_capacity:
            return None
        cache = self._cache
        e = cache.get(key)
        if e is not None:
            e.sig = sig
            e.fuse = fuse_key(sig)
            e.last = self.cycles
            return e
        if self._free_bits:
            bit = self._free_bits.pop()
        elif len(cache) < self.cache_capacity:
            bit = self._next_bit
            self._next_bit += 1
            self._nbytes = (self._next_bit + 63) // 64 * 8
        else:
            oldest = min(cache.values(), key=_last_of)   # rare: only when the cache is full
            del cache[oldest.key]
            del self._by_bit[oldest.bit]
            bit = oldest.bit
        e = _Entry(key, sig, bit, self.cycles)
        cache[key] = e
        self._by_bit[bit] = e
        self._all_bits |= e.mask
        return e

    def _cache_drop(self, key: Any) -> None:
        e = self._cache.pop(key, None)
        if e is not None:
            del self._by_bit[e.bit]
            self._all_bits &= ~(1 << e.bit)
            self._free_bits.append(e.bit)
            self._free_bits.sort(reverse=True)

    # ----------------------------------------------------------------------------------- execution
    def _dummy(self, key: Any, sig: tuple) -> Handle:
        """A joined rank's stand-in for a collective the others run."""
        kind = sig[0]
        dt = sig[1] if len(sig) > 1 else None
        if kind in (K.ALLREDUCE, K.REDUCESCATTER):
            tensor = identity_fill(sig[3], dt, sig[2])
        elif kind == K.BROADCAST:
            tensor = np.zeros(sig[2], dt)
        elif kind in (K.ALLGATHER, K.ALLTOALL):
            tensor = np.zeros((0,) + tuple(sig[2]), dt)
        else:
            tensor = None
        h = Handle(str(key), kind, sig, tensor, None)
        h.key = key
        h.dummy = True
        h.lane = self
        if sig[-1] == K.DEVICE and tensor is not None:
            # not through _devices(): making it is collective, and the others make it later, in _execute
            from .gpu import probe
            h.tensor = probe()[0].asarray(tensor)
            h.device = True
        if dt is not None:
            h.mpi_type = mpi_type(dt)
        if kind in (K.ALLREDUCE, K.REDUCESCATTER):
            h.mpi_op = mpi_reduce_op(sig[3], dt)
            h.prescale = sig[4]
            h.postscale = sig[5] / self.size if sig[3] == AVERAGE else sig[5]
        elif kind == K.BROADCAST:
            h.root = self.ranks.index(sig[3])
        elif kind == K.ALLTOALL:
            h.splits = np.zeros(self.size, np.int64)
        return h

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
                self._run_other([h], tl)
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
                        self._allreduce_fused(chunk, nbytes, tl)
                        chunk, nbytes = [], 0
                    chunk.append(h)
                    nbytes += n
                if len(chunk) == 1:
                    self._allreduce_one(chunk[0], tl)
                elif chunk:
                    self._allreduce_fused(chunk, nbytes, tl)
            if others:
                self._run_other(others, tl)
        if self._nwaiters:
            self._notify()

    def _devices(self) -> Any:
        """The lane's device executor (collective on first use: every member gets here in the agreed order)."""
        ops = self._device_ops
        if ops is None:
            from .nccl import DeviceOps
            ops = self._device_ops = DeviceOps(self, self._gpu_operations, bool(self._hierarchical))
        return ops

    def _run_host(self, h: Handle) -> None:
        """Run one request with the host code (device requests staged through host memory come here)."""
        if h.kind == K.ALLREDUCE:
            self._allreduce_one(h, None)
        else:
            self._run_other([h], None)

    def _allreduce_one(self, h: Handle, tl: Optional[Timeline]) -> None:
        if h.device:
            self._devices().allreduce([h], h.tensor.nbytes)
            return
        a = h.tensor
        t0 = _perf() if tl is not None else 0.0
        out = h.output
        comm = self.comm
        if out is a:
            if h.prescale != 1.0:
                scale_into(out, h.prescale, out)
            t1 = _perf() if tl is not None else 0.0
            self._allreduce_in_place(out, h)
        else:
            if out is None:
                out = np.empty_like(a) if a.nbytes < POOL_MIN_BYTES else _results.empty(a.shape, a.dtype)
            if h.prescale != 1.0 or self._hierarchical:
                scale_into(a, h.prescale, out)
                t1 = _perf() if tl is not None else 0.0
                self._allreduce_in_place(out, h)
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

    def _allreduce_in_place(self, buf: np.ndarray, h: Handle) -> None:
        """One in-place MPI allreduce of ``buf`` (contiguous), hierarchical when asked for and useful."""
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

    def _allreduce_fused(self, group: list[Handle], nbytes: int, tl: Optional[Timeline]) -> None:
        first = group[0]
        if first.device:                         # fuse keys keep device and host requests apart
            self._devices().allreduce(group, nbytes)
            return
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
        self._allreduce_in_place(flat, first)
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

    def _run_other(self, hs: list[Handle], tl: Optional[Timeline]) -> None:
        gathers = [h for h in hs if h.kind == K.ALLGATHER and not h.device]
        if gathers:
            self._allgather(gathers, tl)
        for h in hs:
            kind = h.kind
            if h.device:
                ops = self._devices()
                run = getattr(ops, _DEVICE_RUNS[kind]) if kind in _DEVICE_RUNS else ops.staged
                run(h)
                continue
            if kind == K.ALLGATHER:
                continue
            t0 = _perf()
            if kind == K.ALLREDUCE:
                self._allreduce_one(h, tl)
                continue
            if kind == K.BROADCAST:
                self._broadcast(h)
            elif kind == K.ALLTOALL:
                self._alltoall(h)
            elif kind == K.REDUCESCATTER:
                self._reducescatter(h)
            elif kind == K.BARRIER:
                h.result = None   # negotiation already proved every member got here
            h.done = True
            if tl is not None and not h.dummy:
                tl.span(h.name, QUEUE, h.t_ready, t0)
                if kind in _MPI_NAMES:
                    tl.span(h.name, _MPI_NAMES[kind], t0, _perf())

    def _allgather(self, hs: list[Handle], tl: Optional[Timeline]) -> None:
        t0 = _perf()
        comm = self.comm
        mine = np.array([h.tensor.shape[0] for h in hs], np.int64)
        rows = np.empty((self.size, len(hs)), np.int64)
        comm.Allgather([mine, MPI.INT64_T], [rows, MPI.INT64_T])
        for j, h in enumerate(hs):
            a = h.tensor
            trailing = a.shape[1:]
            per_row = int(np.prod(trailing, dtype=np.int64))
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

    def _broadcast(self, h: Handle) -> None:
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

    def _alltoall(self, h: Handle) -> None:
        a = h.tensor
        comm = self.comm
        splits = h.splits
        received = np.empty(self.size, np.int64)
        comm.Alltoall([splits, MPI.INT64_T], [received, MPI.INT64_T])
        trailing = a.shape[1:]
        per_row = int(np.prod(trailing, dtype=np.int64))
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

    def _reducescatter(self, h: Handle) -> None:
        a = h.tensor
        base, extra = divmod(a.shape[0] if a.ndim else 1, self.size)
        rows = np.array([base + (1 if r < extra else 0) for r in range(self.size)], np.int64)
        per_row = int(np.prod(a.shape[1:], dtype=np.int64))
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


# The device executor's method for each kind it runs on NCCL (others are staged through host memory).
_DEVICE_RUNS = {K.BROADCAST: "broadcast", K.ALLGATHER: "allgather", K.ALLTOALL: "alltoall",
                K.REDUCESCATTER: "reducescatter"}

_bit_of = operator.attrgetter("entry.bit")


def _last_of(e: _Entry) -> int:
    return e.last


def dumps(obj: Any) -> np.ndarray:
    """Pickle ``obj`` into a uint8 array (for broadcast_object / allgather_object)."""
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)


def loads(data: np.ndarray) -> Any:
    return pickle.loads(data.tobytes())
