"""The engine: one :class:`Lane` per process set this rank belongs to, a small Horovod controller.

The parts of a lane (docs/runtime.md, "The engine's parts", says who owns what and which thread touches it):

* **this module, the lane**: the queue and the driver, and the names of requests (:class:`Names`). ``submit`` appends a
  :class:`~hpcvod.runtime.handles.Handle` and, for asynchronous calls, wakes the lane's background thread.
  Exactly one thread at a time "drives" a lane (runs cycles; every MPI call of the lane happens in the driver).
  A blocking call that finds the lane idle drives it itself, in the caller's thread, so a lone ``allreduce``
  costs one small negotiation plus one MPI call and no thread hand-off. Otherwise the background thread drives,
  and callers of ``synchronize`` take over as soon as it lets go. Ranks with nothing pending do not take part
  in negotiations (there is no cycle floor); the ones waiting poll with a short spin and then a backing-off
  sleep, so a rank waiting for a slow peer does not burn a core.
* **negotiation.py**: one cycle of agreement (a bit vector per rank in one ``Iallreduce``), the full round when
  a request is new, mismatch and out-of-step errors, the join state, joined ranks' stand-ins; it owns the
  **response cache** (response_cache.py).
* **executors.py**: groups the agreed requests (allreduces of one dtype/op/scaling fused up to
  ``HPCVOD_FUSION_THRESHOLD`` bytes) and gives each group to the executor of its memory: host.py (host memory
  over MPI: fusion into one buffer and one in-place ``MPI_Allreduce``, results from a pool of aligned blocks)
  and nccl.py (device memory over NCCL, or staged through the host executor).
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
from typing import Any

import numpy as np
from mpi4py import MPI

from . import handles as K
from .errors import HpcvodError, HpcvodInputError, HpcvodShutdownError
from .executors import Executors
from .handles import Handle
from .negotiation import RETUNE, Negotiation, wait_request
from .timeline import Timeline

_perf = time.perf_counter

NAMED_SWEEP = 4096          # names remembered before finished ones are forgotten (Names.claim)


class Names:
    """The names of a lane's requests: unnamed collectives get the next of one counter, and a name still in
    flight on this rank is refused (submitting threads call it; next() and dict stores are atomic)."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)
        self._named: dict[str, Handle] = {}      # the last handle submitted under each name
        self._limit = NAMED_SWEEP

    def auto(self) -> str:
        """The name of the next unnamed collective.

        One counter for every kind of collective: ranks that call different collectives in the same position
        get the same name and hence a mismatch error instead of a hang.
        """
        return f"noname.{next(self._counter)}"

    def claim(self, hs: list[Handle]) -> None:
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
        if len(named) > self._limit:
            self._sweep()

    def claim_one(self, h: Handle) -> None:
        """claim([h]) for one named handle without the batch bookkeeping (every blocking call comes here)."""
        named = self._named
        old = named.get(h.name)
        if old is not None and not old.done:
            self.claim([h])                      # raises the error
        named[h.name] = h
        if len(named) > self._limit:
            self._sweep()

    def _sweep(self) -> None:
        """Forget finished names now and then (names that change per step)."""
        named = self._named
        for name in [n for n, o in named.items() if o.done]:
            del named[name]
        self._limit = max(NAMED_SWEEP, 2 * len(named))


class Lane:
    """The engine of one process set on this rank: the queue and the driver (see the module docstring),
    composing its :class:`~hpcvod.runtime.negotiation.Negotiation` and
    :class:`~hpcvod.runtime.executors.Executors`."""

    def __init__(self, comm: MPI.Comm, set_id: int, ranks: list[int], settings: Any,
                 timeline: Timeline | None = None) -> None:
        self.comm = comm
        self.set_id = set_id
        self.ranks = ranks                       # global ranks of the members, in set-rank order
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.cycle_time = settings.cycle_time_ms / 1000.0
        self.timeline = timeline                 # the live Timeline or None (set by start/stop_timeline)
        self.names = Names()
        self._claim = self.names.claim          # bound once: every named call goes through it
        self._claim_one = self.names.claim_one
        self.executors = Executors(comm, set_id, settings)
        self._host_allreduce_one = self.executors.host.allreduce_one
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        # Submitted, not yet taken by the driver. A deque: append/popleft are atomic, so submitters need no lock.
        self._queue: collections.deque[Handle] = collections.deque()
        self.negotiation = Negotiation(comm, set_id, ranks, settings.cache_capacity, self._queue, self._run,
                                       self._finish, self._caller_waits, self._aborted)
        # the negotiation's own containers, read on the hot path without an attribute hop (never rebound)
        self._waiting = self.negotiation.waiting
        self._join = self.negotiation.join
        self._driving = False
        self._nwaiters = 0
        self.background = BackgroundDriver(self)
        self._stopping = False
        self._abort: BaseException | None = None
        self._inflight: list[Handle] = []        # agreed and being executed (failed together on an error)
        self._for_caller = False                 # the driver runs for a caller that waits (not the bg thread)
        self.tuner: Any = None                   # rank 0's autotune.Autotuner (global lane), while it tunes
        self.tuned: list[Any] = []               # autotune settings applied here, in order (the same everywhere)
        self.negotiation.on_retune = self.retune

    @property
    def agreed(self) -> int:
        """Negotiations completed (the same sequence on every member)."""
        return self.negotiation.agreed

    # ----------------------------------------------------------------------------------- submission
    def auto_name(self) -> str:
        return self.names.auto()

    def submit(self, h: Handle) -> Handle:
        """Queue ``h`` for the background thread (asynchronous forms). Lock-free in the common case."""
        if self._abort is not None:
            raise self._abort
        if not h.unnamed:
            self._claim_one(h)
        if self.timeline is not None:
            h.t_submit = _perf()               # otherwise the driver stamps it when it takes the request
        self._queue.append(h)
        # Read without the lock: the background thread publishes "sleeping" *before* it last looks at the
        # queue, so either it sees this request or we see it sleeping.
        bg = self.background
        if bg.sleeping or bg.thread is None:
            bg.wake()
        return h

    def submit_many(self, hs: list[Handle]) -> None:
        """Queue several handles atomically (one deque.extend), so that they are negotiated together."""
        if self._abort is not None:
            raise self._abort
        self._claim(hs)
        for h in hs:
            h.lane = self
        self._queue.extend(hs)
        bg = self.background
        if bg.sleeping or bg.thread is None:
            bg.wake()

    def run(self, h: Handle) -> Any:
        """Submit ``h`` and wait for it. On an idle lane this thread negotiates and runs it itself."""
        h.lane = self
        if not h.unnamed:
            self._claim_one(h)
        h.t_submit = _perf()
        lock = self._lock
        lock.acquire()
        if self._driving or self._queue or self._waiting or self._join.handle is not None or \
                self._abort is not None:
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
        """The idle-lane fast path (Negotiation.solo): one cached request, one tiny negotiation, one MPI call,
        this thread. This is every blocking call of a training loop."""
        self._for_caller = True
        try:
            if self.negotiation.solo(h):
                tl = self.timeline
                if tl is not None:
                    h.t_ready = _perf()
                    tl.cycle_mark(h.t_submit)   # this fast path is a cycle of its own
                    tl.negotiated([h], h.t_submit, h.t_ready)
                if h.kind == K.ALLREDUCE:
                    if h.device:
                        self.executors.allreduce_one(h, tl)
                    else:
                        self._host_allreduce_one(h, tl)   # one hop fewer: every blocking host call
                else:
                    self.executors.run_others([h], tl)
                if tl is not None:
                    tl.executed([h], _perf())
                if self.tuner is not None and self.tuner.record((h,)):
                    self.negotiation.retune = RETUNE
                return
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
    def _has_work(self) -> bool:
        return bool(self._queue or self._waiting or self._join.handle is not None)

    def _release_driver(self) -> None:
        with self._lock:
            self._driving = False
            # _has_work() inline: this runs after every blocking call
            if (self._queue or self._waiting or self._join.handle is not None) and not self._stopping and \
                    self._abort is None:
                self.background.wake_locked()
            if self._nwaiters:
                self._cv.notify_all()

    def _drive(self, target: Handle | None) -> None:
        """Run cycles until ``target`` is done (or, for the background thread, until no work is left)."""
        self._for_caller = target is not None
        try:
            while True:
                self._cycle()
                if target is not None:
                    if target.done:
                        break
                elif not self._has_work() or self._stopping:
                    break
        except BaseException as exc:  # an MPI error or an abort: nothing in flight can complete any more
            self._fail_everything(exc)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit
        finally:
            self._release_driver()

    def _cycle(self) -> None:
        now = _perf()
        tl = self.timeline
        if tl is not None:
            tl.cycle_mark(now)
        self.negotiation.cycle(now)

    # ------------------------------------------------------------------------- the negotiation's hooks
    def _run(self, ready: list[Handle]) -> None:
        """Execute what a negotiation agreed on (every member runs the same list in the same order)."""
        tl = self.timeline
        if tl is not None:
            tl.negotiated(ready, min(h.t_submit for h in ready), ready[0].t_ready)
        self._inflight = ready
        self.executors.run(ready, tl)
        if tl is not None:
            tl.executed(ready, _perf())
        if self.tuner is not None and self.tuner.record(ready):
            self.negotiation.retune = RETUNE
        self._inflight = []
        if self._nwaiters:
            self._notify()

    def _finish(self, h: Handle, error: BaseException | None = None) -> None:
        if error is not None:
            h.error = error
        h.done = True
        if self._nwaiters:
            self._notify()

    def _notify(self) -> None:
        with self._lock:
            self._cv.notify_all()

    def _caller_waits(self) -> bool:
        return self._for_caller or bool(self._nwaiters)

    def _aborted(self) -> BaseException | None:
        return self._abort

    # ----------------------------------------------------------------------------------- autotune
    def retune(self) -> None:
        """Every member, after a negotiation rank 0 flagged RETUNE: receive rank 0's new autotune setting
        (one broadcast, at the same point of the agreed order everywhere) and apply it (autotune.py)."""
        from .autotune import Params
        tuner = self.tuner
        if tuner is not None and tuner.pending is not None:
            words = tuner.pending.encode(tuner.final)
        else:
            words = np.zeros(5, np.float64)
        req = self.negotiation.request = self.comm.Ibcast([words, MPI.DOUBLE], root=0)
        if not req.Test():
            wait_request(req, self.negotiation._raise_if_stopped)
        self.negotiation.request = None
        params, final = Params.decode(words)
        self.cycle_time = params.cycle_time_ms / 1000.0
        self.executors.retune(params.fusion_threshold, params.hierarchical_allreduce)
        self.negotiation.cache.enable(params.cache_enabled)
        self.tuned.append(params)
        if tuner is not None:
            self.negotiation.retune = 0
            if final:
                tuner.close()
                self.tuner = None
            else:
                tuner.applied(params)

    # ----------------------------------------------------------------------------- ending, failures
    def _fail_everything(self, exc: BaseException) -> None:
        err = exc if isinstance(exc, HpcvodError) else HpcvodError(
            f"collective failed in process set {self.set_id}: {type(exc).__name__}: {exc}")
        with self._lock:
            if self._abort is None:
                self._abort = err
            pending = list(self._queue) + self.negotiation.drain() + self._inflight
            self._inflight = []
            self._queue.clear()
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
            self.negotiation.peer_left(agreed, exc)
            self._cv.notify_all()

    def busy_at(self) -> int | None:
        """The negotiation a driver is busy with, or None when the lane is idle."""
        return self.negotiation.cycles if self._driving else None

    def stop(self) -> None:
        """Shut the lane down: pending operations fail with HpcvodShutdownError."""
        with self._lock:
            self._stopping = True
            if self._abort is None and self._has_work():
                self._abort = HpcvodShutdownError(
                    f"hpcvod was shut down while collectives were pending in process set {self.set_id}")
            self._cv.notify_all()
            bg = self.background.thread
            driving = self._driving
        if not driving:
            self._fail_everything(HpcvodShutdownError("hpcvod was shut down"))
        if bg is not None and bg is not threading.current_thread():
            bg.join(timeout=2.0)

    def free(self) -> None:
        """Release the lane's communicators (after stop(), when nothing is in flight)."""
        if self.tuner is not None:               # a job that ended before autotune settled: its log is complete
            self.tuner.close()
            self.tuner = None
        self.executors.free()
        self.comm.Free()

    def mpi_handles(self) -> list[Any]:
        """The MPI communicators and the request this lane still holds (none after free())."""
        held = [self.comm] if self.comm != MPI.COMM_NULL else []
        held += self.executors.mpi_handles()
        if self.negotiation.request is not None:
            held.append(self.negotiation.request)
        return held

    def pending(self) -> list[tuple[str, int, float]]:
        """(name, kind, seconds waiting) of every request not yet done (for the stall inspector)."""
        now = _perf()
        items = self.negotiation.pending() + list(self._queue)
        # a request still in the queue may not be stamped yet (t_submit 0): it has just arrived
        return [(h.name, h.kind, now - h.t_submit if h.t_submit else 0.0) for h in items if not h.done]


class BackgroundDriver:
    """A lane's background thread, ``hpcvod-lane-<set>``: started by the first asynchronous request, it drives
    the lane while work is left that no caller drives, and sleeps on the lane's condition otherwise. Its state
    is guarded by the lane's lock; ``sleeping`` is also read without it by submitters (Lane.submit)."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.thread: threading.Thread | None = None
        self.sleeping = False

    def wake(self) -> None:
        lane = self.lane
        with lane._lock:
            if not lane._driving:              # a driver hands leftover work to the thread when it stops
                self.wake_locked()

    def wake_locked(self) -> None:
        """Start the thread, or wake it if it sleeps (the caller holds the lane's lock)."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._main, name=f"hpcvod-lane-{self.lane.set_id}", daemon=True)
            self.thread.start()
        elif self.sleeping:
            self.sleeping = False
            self.lane._cv.notify_all()

    def _can_drive(self) -> bool:
        lane = self.lane
        return not lane._driving and lane._abort is None and lane._has_work()

    def _main(self) -> None:
        lane = self.lane
        while True:
            with lane._lock:
                while not self._can_drive():
                    if lane._stopping:
                        return
                    self.sleeping = True
                    if self._can_drive():      # submit() appends without the lock, then reads "sleeping"
                        break
                    lane._cv.wait()
                if lane._stopping:
                    return
                self.sleeping = False
                lane._driving = True
            if lane.cycle_time:
                time.sleep(lane.cycle_time)
            try:
                lane._drive(None)
            except BaseException as exc:  # pragma: no cover - reported to every waiter by _drive
                print(f"hpcvod: engine thread of process set {lane.set_id} failed: {exc!r}", file=sys.stderr)


def dumps(obj: Any) -> np.ndarray:
    """Pickle ``obj`` into a uint8 array (for broadcast_object / allgather_object)."""
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)


def loads(data: np.ndarray) -> Any:
    return pickle.loads(data.tobytes())
