"""Negotiation: how the members of a lane agree on what is ready, in one order.

Every rank that has pending work contributes a bit vector to one ``Iallreduce(BOR)``: a bit per response-cache
entry (response_cache.py) it has *not* submitted, plus flags. An entry whose bit nobody set is ready everywhere;
the common steady-state cycle is therefore one tiny collective. When any rank holds a request the cache does not
know (first iteration, new shape, cache off), the flags say so and all ranks exchange their full pending lists
(``allgather``); each rank then computes the same responses from the same data: a name submitted by every rank
with equal signatures becomes a response (and a cache entry), a name submitted by every rank with different
signatures becomes an :class:`HpcvodMismatchError` on every rank. Joined ranks take part with stand-ins.

:class:`Negotiation` is one part of a lane (engine.Lane): it takes requests from the lane's queue, keeps those
not yet ready everywhere, owns the response cache and the join state, and hands what is agreed to the lane's
``run`` hook. Only the thread that drives the lane calls it (docs/runtime.md, "The engine's parts").
"""

from __future__ import annotations

import collections
import operator
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from . import handles as K
from .errors import HpcvodInputError, HpcvodMismatchError, first_of
from .handles import Handle, Signature
from .response_cache import ResponseCache
from .tables import AVERAGE, arithmetic_dtype, describe_sig, identity_fill, is_bfloat16, mpi_reduce_op, mpi_type

# Negotiation word: flags in the low bits, then one bit per response-cache entry ("I have NOT submitted it").
NEED_FULL = 1      # some rank holds a request the cache does not know: exchange full lists
NOT_JOINED = 2     # some rank has not joined yet
SOME_JOINED = 4    # some rank has joined (it contributes dummies to what the others run)
RETUNE = 8         # rank 0's autotuner has a new setting: every member takes it after this negotiation
FIRST_BIT = 4
_JOIN = K.JOIN

# A request waiting longer than this forces a full round even when every rank's requests are cached, so
# that unnamed collectives submitted in different orders still end in a mismatch error, not a hang.
FULL_ROUND_AFTER_SECONDS = 1.0
DEADLOCK_AFTER_SECONDS = 2.0  # every rank blocked this long on collectives nobody else has: out of step
SPIN_SECONDS = 0.002          # see wait_request

_SOLO_ENDS = NEED_FULL | SOME_JOINED | RETUNE   # flags that send a solo request through a full _process
_IN_PLACE, _BYTE, _BOR = MPI.IN_PLACE, MPI.BYTE, MPI.BOR

_perf = time.perf_counter
_bit_of = operator.attrgetter("entry.bit")


class JoinState:
    """This rank's pending ``join()``: its handle until every member has joined, and whether it arrived since
    the last negotiation (the rank that joins last is agreed from that)."""

    __slots__ = ("handle", "fresh")

    def __init__(self) -> None:
        self.handle: Handle | None = None
        self.fresh = False

    def arrive(self, h: Handle) -> bool:
        """Take ``h``; False when a join is already pending."""
        if self.handle is not None:
            return False
        self.handle = h
        self.fresh = True
        return True

    def take_fresh(self) -> bool:
        fresh, self.fresh = self.fresh, False
        return fresh

    def take(self) -> Handle | None:
        """The pending join's handle, which is no longer pending."""
        h, self.handle = self.handle, None
        return h

    def complete(self, comm: MPI.Comm, me: int, fresh: bool,
                 finish: Callable[[Handle, BaseException | None], None]) -> None:
        """Every member has joined: agree on the last one to join (``me``: this rank's global rank, ``fresh``:
        its join arrived in this negotiation) and release join() everywhere."""
        mine = np.array([me if fresh else -1], np.int64)
        last = np.empty(1, np.int64)
        comm.Allreduce([mine, MPI.INT64_T], [last, MPI.INT64_T], MPI.MAX)
        h = self.take()
        if h is not None:
            h.result = int(last[0])
            finish(h, None)


class Negotiation:
    """One cycle of agreement, the full round, and joined ranks' stand-ins, for the members of ``comm``.

    Hooks into the lane: ``inbox`` (the lane's queue, taken from in cycles), ``run(ready)`` (execute agreed
    requests), ``finish(h, error)`` (a request failed here), ``caller_waits()`` (a caller blocks on this lane)
    and ``aborted()`` (the lane's abort error, or None).
    """

    def __init__(self, comm: MPI.Comm, set_id: int, ranks: list[int], cache_capacity: int,
                 inbox: collections.deque[Handle], run: Callable[[list[Handle]], None],
                 finish: Callable[[Handle, BaseException | None], None], caller_waits: Callable[[], bool],
                 aborted: Callable[[], BaseException | None]) -> None:
        self.comm = comm
        self.set_id = set_id
        self.ranks = ranks                       # global ranks of the members, in set-rank order
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.cache = ResponseCache(cache_capacity, FIRST_BIT)
        self.join = JoinState()
        self.waiting: dict[str, Handle] = {}     # taken from the inbox, not yet ready everywhere
        self.cycles = 0                          # negotiations started (the same sequence on every member)
        self.agreed = 0                          # negotiations completed
        self.request: MPI.Request | None = None  # the negotiation collective while it is in flight
        # (agreed, error) once a member has left cleanly: negotiations past its count can never complete
        self.left: tuple[int, BaseException] | None = None
        self._inbox = inbox
        self._run = run
        self._finish = finish
        self._caller_waits = caller_waits
        self._aborted = aborted
        self.retune = 0                          # RETUNE while rank 0's autotuner has a setting to hand out
        self.on_retune: Callable[[], None] | None = None   # the lane's: broadcast and apply it (autotune.py)

    def pending(self) -> list[Handle]:
        """The requests taken and not yet ready, the pending join included."""
        items = list(self.waiting.values())
        if self.join.handle is not None:
            items.append(self.join.handle)
        return items

    def drain(self) -> list[Handle]:
        """Forget every pending request and return them (the lane fails them)."""
        items = self.pending()
        self.waiting.clear()
        self.join.take()
        return items

    def peer_left(self, agreed: int, exc: BaseException) -> None:
        """A member left after ``agreed`` negotiations: any later one fails with ``exc``."""
        if self.left is None or agreed < self.left[0]:
            self.left = (agreed, exc)

    def check_left(self) -> None:
        left = self.left
        if left is not None and self.cycles > left[0]:
            raise left[1]

    # ------------------------------------------------------------------------ the idle-lane fast path
    def solo(self, h: Handle) -> bool:
        """Negotiate ``h`` on a lane with nothing else pending. True: ``h`` alone is agreed and the caller runs
        it now (every blocking call of a training loop: one cached request, one tiny negotiation). False: it
        waits among the pending requests (new, a join, or the others wanted more, which ran); the caller
        cycles until it is done. Kept in step with cycle() and _process()."""
        if h.kind == _JOIN:
            self.join.arrive(h)
            return False
        if h.unnamed:
            h.key = ("#", h.sig, 0)
        cache = self.cache
        e = cache.get(h.key)
        if e is None or e.sig != h.sig:
            self.waiting[h.name] = h
            return False
        h.entry = e
        mask = e.mask
        cycles = self.cycles = self.cycles + 1
        if self.left is not None:
            self.check_left()
        # the exchange of _exchange, inline: this is the hot path of every blocking call
        buf = bytearray((NOT_JOINED | self.retune | (cache.all_bits & ~mask)).to_bytes(cache.nbytes, "little"))
        req = self.request = self.comm.Iallreduce(_IN_PLACE, [buf, _BYTE], _BOR)
        if not req.Test():
            wait_request(req, self._raise_if_stopped)
        self.request = None
        self.agreed = cycles
        g = int.from_bytes(buf, "little")
        if g & _SOLO_ENDS or g & mask:
            self.waiting[h.name] = h
            self._process(g, False, False, mask)      # the others want more than this request
            return False
        e.last = cycles
        return True

    # ---------------------------------------------------------------------------------- one cycle
    def cycle(self, now: float) -> None:
        """One negotiation: take the inbox, agree with the members, run what is ready everywhere."""
        queue = self._inbox
        waiting = self.waiting
        cache = self.cache
        old = now - FULL_ROUND_AFTER_SECONDS
        need_full = False
        mine = 0                                 # bits of my cached requests
        counts: dict | None = None
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
                if not self.join.arrive(h):
                    self._finish(h, HpcvodInputError("join() called while this rank's join is pending"))
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
        joined = self.join.handle is not None
        word = (SOME_JOINED if joined else NOT_JOINED | (cache.all_bits & ~mine)) | self.retune
        if need_full:
            word |= NEED_FULL
        fresh_join = self.join.take_fresh()
        self.cycles += 1
        if self.left is not None:
            self.check_left()
        self._process(self._exchange(word), joined, fresh_join, mine)

    def _exchange(self, word: int) -> int:
        """The negotiation collective: OR of every member's word."""
        buf = bytearray(word.to_bytes(self.cache.nbytes, "little"))
        req = self.request = self.comm.Iallreduce(MPI.IN_PLACE, [buf, MPI.BYTE], MPI.BOR)
        if not req.Test():
            wait_request(req, self._raise_if_stopped)
        self.request = None
        self.agreed = self.cycles
        return int.from_bytes(buf, "little")

    def _process(self, g: int, joined: bool, fresh_join: bool, mine: int) -> None:
        """Derive what is ready from the negotiation result ``g`` (identically on every member) and run it;
        then, when rank 0 asked for it, every member takes the autotuner's new setting (the same point of the
        agreed order everywhere). ``mine``: the bits of this rank's cached requests in this negotiation."""
        self._run_ready(g, joined, fresh_join, mine)
        if g & RETUNE and self.on_retune is not None:
            self.on_retune()

    def _run_ready(self, g: int, joined: bool, fresh_join: bool, mine: int) -> None:
        t_agreed = _perf()
        waiting = self.waiting
        everything = False                       # every waiting request of mine is ready
        if g & SOME_JOINED or joined:
            if not g & NOT_JOINED:
                self.join.complete(self.comm, self.ranks[self.rank], fresh_join, self._finish)
                return
            ready = []
            by_key = {h.key: h for h in waiting.values() if h.entry is not None}
            free = ~g & self.cache.all_bits
            while free:
                low = free & -free
                entry = self.cache.at_bit(low.bit_length() - 1)
                h = by_key.get(entry.key)
                if h is None or h.entry is not entry:
                    h = stand_in(entry.key, entry.sig, self.ranks)
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
            if self.cache.near_full():
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
            ready = refuse_after_join(ready, self._finish)
        if not ready:
            return
        for h in ready:
            h.t_ready = t_agreed
        self._run(ready)

    def _full_round(self, joined: bool) -> list[Handle]:
        """Exchange every rank's pending list and derive the same responses on every member."""
        waiting = self.waiting
        items = [(h.name, h.key if h.unnamed else None, h.entry.bit if h.entry is not None else h.sig)
                 for h in waiting.values()]
        everyone = self.comm.allgather((joined, items, self._stuck()))
        cache = self.cache
        seen: dict[str, dict[int, tuple]] = {}
        keys: dict[str, Any] = {}
        order: list[str] = []
        active = [r for r, (j, _, _) in enumerate(everyone) if not j]
        for r, (_, its, _) in enumerate(everyone):
            for name, key, s in its:
                sig = cache.at_bit(s).sig if isinstance(s, int) else s
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
                entry = cache.put(key, sig, self.cycles)
                if mine is None:
                    mine = stand_in(key, sig, self.ranks)
                    mine.name = name
                mine.entry = entry
                out.append(mine)
            else:
                cache.drop(key)
                detail = "; ".join(f"rank {self.ranks[r]}: {describe_sig(s)}" for r, s in sorted(d.items()))
                err = HpcvodMismatchError(
                    f"collective {name!r} differs across ranks (process set {self.set_id}): {detail}")
                if mine is not None:
                    self._finish(mine, err)
        if not out and len(active) == self.size and all(stuck for _, _, stuck in everyone):
            fail_deadlock(everyone, self.waiting, self._finish, self.set_id, self.ranks)
        return out

    def _stuck(self) -> bool:
        """This rank can submit nothing more: a caller waits on a collective, nothing new came for a while."""
        if self._inbox or not self.waiting or not self._caller_waits():
            return False
        newest = max(h.t_submit for h in self.waiting.values())
        return _perf() - newest > DEADLOCK_AFTER_SECONDS

    def _raise_if_stopped(self) -> None:
        """While waiting: the lane's abort error, or the error of a member that left before this negotiation."""
        aborted = self._aborted()
        if aborted is not None:
            raise aborted
        if self.left is not None:
            self.check_left()


def fail_deadlock(everyone: list, waiting: dict[str, Handle], finish: Callable[[Handle, BaseException | None], None],
                  set_id: int, ranks: list[int]) -> None:
    """Every member waits on collectives no other member submitted, and none can submit more: a rank
    skipped collectives (an exception it caught between two of them) and the ranks are out of step. Waiting
    would hang for ever; the same error on every member is what the user can act on. ``everyone``: the full
    round's (joined, items, stuck) of every member; the ``waiting`` requests fail with ``finish``."""
    detail = "; ".join(f"rank {ranks[r]} waits for {first_of([repr(name) for name, _, _ in its], 4)}"
                       for r, (_, its, _) in enumerate(everyone))
    err = HpcvodMismatchError(
        f"ranks are out of step in process set {set_id}: every rank waits for collectives that no other "
        f"rank submitted ({detail}); a rank skipped collectives (an exception between two of them?)")
    for h in list(waiting.values()):
        finish(h, err)
    waiting.clear()


def refuse_after_join(ready: list[Handle], finish: Callable[[Handle, BaseException | None], None]) -> list[Handle]:
    """While a rank has joined, only allreduces (and barriers) can run: a joined rank can add neutral
    values to a sum but has no rows to gather, no slice to reduce and no value to broadcast. As in Horovod,
    the others' allgather, broadcast, alltoall and reducescatter fail (on every member the same: ``g`` is
    agreed) and nothing runs for them."""
    keep = []
    for h in ready:
        if h.kind in (K.ALLREDUCE, K.BARRIER):
            keep.append(h)
        elif not h.dummy:
            finish(h, HpcvodInputError(
                f"{K.KIND_NAMES.get(h.kind, 'collective')} {h.name!r}: not supported while a rank has joined "
                f"(only allreduce is, as in Horovod); with DistributedOptimizer use sparse_as_dense=True"))
    return keep


def stand_in(key: Any, sig: Signature, ranks: list[int]) -> Handle:
    """A joined rank's stand-in for a collective the others run."""
    kind = sig.kind
    elem = sig.elem
    # bfloat16 device requests: int16 words in memory, float32 for the host's arithmetic
    dt = np.dtype(np.int16) if is_bfloat16(elem) else elem
    if kind in (K.ALLREDUCE, K.REDUCESCATTER):
        tensor = identity_fill(sig.op, elem, sig.shape)
    elif kind == K.BROADCAST:
        tensor = np.zeros(sig.shape, dt)
    elif kind in (K.ALLGATHER, K.ALLTOALL):
        tensor = np.zeros((0,) + tuple(sig.shape), dt)
    else:
        tensor = None
    h = Handle(str(key), kind, sig, tensor, None)
    h.key = key
    h.dummy = True
    if sig.device and tensor is not None:
        # not through _devices(): making it is collective, and the others make it later, in _execute
        from .gpu import probe
        h.tensor = probe()[0].asarray(tensor)
        h.device = True
    if dt is not None:
        h.mpi_type = mpi_type(dt)
    if kind in (K.ALLREDUCE, K.REDUCESCATTER):
        h.mpi_op = mpi_reduce_op(sig.op, arithmetic_dtype(elem))
        h.prescale = sig.prescale
        h.postscale = sig.postscale / len(ranks) if sig.op == AVERAGE else sig.postscale
    elif kind == K.BROADCAST:
        h.root = ranks.index(sig.root)
    elif kind == K.ALLTOALL:
        h.splits = np.zeros(len(ranks), np.int64)
    return h


def wait_request(req: MPI.Request, raise_if_stopped: Callable[[], None]) -> None:
    """Poll ``req``: spin (like MPI itself) for SPIN_SECONDS, then sleep with a growing (<= 1 ms) back-off,
    calling ``raise_if_stopped`` between sleeps.

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
        raise_if_stopped()
        time.sleep(min(0.001, waited * 0.05))
