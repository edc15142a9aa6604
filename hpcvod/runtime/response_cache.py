"""The response cache of one lane: the requests the members have agreed on before, one bit each.

A request whose name (or, for unnamed requests, signature and position) and signature are in the cache is
negotiated by its bit alone (negotiation.py). The content is the same on every member, because it only
changes from agreed data: entries are added by full rounds, evicted least recently used by the negotiation
count, and dropped on a mismatch, in the same order everywhere.

Only the thread that drives the lane touches it.
"""

from __future__ import annotations

from typing import Any

from . import handles as K
from .handles import Signature


class CacheEntry:
    """One agreed request: its key, signature, bit in the negotiation word and fuse key."""

    __slots__ = ("key", "sig", "bit", "mask", "last", "fuse")

    def __init__(self, key: Any, sig: Signature, bit: int, last: int) -> None:
        self.key = key
        self.sig = sig
        self.bit = bit
        self.mask = 1 << bit
        self.last = last          # LRU tick: the negotiation count, identical on every member
        self.fuse = fuse_key(sig)


_fuse_keys: dict[tuple, tuple] = {}


def fuse_key(sig: Signature) -> Any:
    """Allreduces with the same key (dtype, op, scaling, memory) can share one fusion buffer.

    Keys are interned, so the engine compares them with ``is``.
    """
    if sig.kind != K.ALLREDUCE:
        return None
    key = (sig.elem, sig.op, sig.prescale, sig.postscale, sig.device)
    return _fuse_keys.setdefault(key, key)


def _last_of(e: CacheEntry) -> int:
    return e.last


class ResponseCache:
    """Up to ``capacity`` entries (0: the cache is off), with bits from ``first_bit`` up."""

    def __init__(self, capacity: int, first_bit: int) -> None:
        self.capacity = capacity
        self.configured = capacity         # the capacity when enabled (autotune turns the cache off and on)
        self._first_bit = first_bit
        self._entries: dict[Any, CacheEntry] = {}
        self.get = self._entries.get       # key -> entry or None (the hot path: no method of our own)
        self._by_bit: dict[int, CacheEntry] = {}
        self._free_bits: list[int] = []
        self._next_bit = first_bit
        self.all_bits = 0                  # mask of the bits of live entries
        self.nbytes = 8                    # bytes of a negotiation word that holds every bit

    def __len__(self) -> int:
        return len(self._entries)

    def at_bit(self, bit: int) -> CacheEntry:
        return self._by_bit[bit]

    def near_full(self) -> bool:
        """Whether eviction can come near (then LRU recency must be kept; the same answer on every member)."""
        return len(self._entries) * 2 >= self.capacity

    def put(self, key: Any, sig: Signature, tick: int) -> CacheEntry | None:
        """Remember an agreed request (None when the cache is off); ``tick``: the negotiation count."""
        if not self.capacity:
            return None
        entries = self._entries
        e = entries.get(key)
        if e is not None:
            e.sig = sig
            e.fuse = fuse_key(sig)
            e.last = tick
            return e
        if self._free_bits:
            bit = self._free_bits.pop()
        elif len(entries) < self.capacity:
            bit = self._next_bit
            self._next_bit += 1
            self.nbytes = (self._next_bit + 63) // 64 * 8
        else:
            oldest = min(entries.values(), key=_last_of)   # rare: only when the cache is full
            del entries[oldest.key]
            del self._by_bit[oldest.bit]
            bit = oldest.bit
        e = CacheEntry(key, sig, bit, tick)
        entries[key] = e
        self._by_bit[bit] = e
        self.all_bits |= e.mask
        return e

    def enable(self, on: bool) -> None:
        """Turn the cache on (its configured capacity) or off (forgetting every entry). Called by every member
        at the same point of the agreed order (autotune), so the content stays the same everywhere."""
        self.capacity = self.configured if on else 0
        if not on:
            self._entries.clear()          # in place: ``get`` stays bound to it
            self._by_bit.clear()
            self._free_bits = []
            self._next_bit = self._first_bit
            self.all_bits = 0
            self.nbytes = 8

    def drop(self, key: Any) -> None:
        """Forget ``key`` (its request mismatched); its bit is reused first."""
        e = self._entries.pop(key, None)
        if e is not None:
            del self._by_bit[e.bit]
            self.all_bits &= ~(1 << e.bit)
            self._free_bits.append(e.bit)
            self._free_bits.sort(reverse=True)
