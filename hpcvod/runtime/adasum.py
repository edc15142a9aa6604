"""Adasum (``op=hvd.Adasum``): Horovod's adaptive summation of host tensors over MPI.

Two vectors ``a`` and ``b`` combine as ``(1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b``: their sum when they
are orthogonal, their average when they are parallel. ``2^k`` ranks combine pairwise in ``k`` levels by
recursive vector halving, distance doubling (VHDD), as Horovod's ``AdasumMPIAllreduceOp`` does:

- level ``L`` (1, 2, 4, ...): each rank swaps half of the segment it still holds with the rank ``rank ^ L``
  (the lower rank keeps the first half) and combines its half with the neighbour's. The dot products and
  norms of a tensor are sums over the pieces of it that the ``2L`` ranks of the block hold, so they are
  summed over that block before the combination. Each tensor of a fused group has its own dot product and
  norms (``counts``: elements per tensor), so fusing changes no value.
- then the segments travel back (distance halving) until every rank holds the whole result.

Dot products and norms are accumulated in float64; float32/float64 results are ``acoeff * a + bcoeff * b``
computed in float64 and rounded once (Horovod's ``ScaledAdd``), float16 ones in float32 (Horovod's AVX path).
A norm below ``sqrt(DBL_MIN)`` leaves its coefficient at 1, as Horovod does. The block sums are recursive
doubling over the same pairs (every member adds the same two numbers, so all get the same bits); no
sub-communicators are created.

Horovod supports power-of-two process counts only and float16/32/64 tensors; the same limits hold here
(refused on every rank when the request is made, with Horovod's exception types).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from .errors import HpcvodInputError

ADASUM_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_TAG = 0x4144          # point-to-point messages of the lane's communicator that are Adasum's
_TINY = float(np.sqrt(sys.float_info.min))   # Horovod's sqrt(DBL_MIN): a smaller squared norm is taken as 0


class _AdasumOp:
    """Stands in the place of an ``MPI.Op`` in a request's reduction plan: the host executor sees it and runs
    :func:`adasum_allreduce` instead of ``MPI_Allreduce``."""

    def __repr__(self) -> str:
        return "ADASUM_OP"


ADASUM_OP = _AdasumOp()


def check_dtype(dtype: np.dtype) -> None:
    """Refuses (HpcvodInputError) a dtype Horovod's Adasum has no kernels for."""
    if dtype not in ADASUM_DTYPES:
        raise HpcvodInputError(f"op=Adasum reduces float16, float32 and float64 tensors; got {dtype}")


def check_size(size: int) -> None:
    """Refuses a process count that is not a power of two (Horovod's exception type and message)."""
    if size < 1 or size & (size - 1):
        raise NotImplementedError(f"Running Adasum with non-power of 2 ranks is not supported yet "
                                  f"({size} ranks in the process set; Adasum needs 1, 2, 4, 8, ...)")


def _split(counts: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-tensor element counts of the first ``keep`` elements of a segment and of the rest."""
    starts = np.cumsum(counts) - counts
    first = np.clip(keep - starts, 0, counts)
    return first, counts - first


def _block_sum(comm: MPI.Comm, rank: int, values: np.ndarray, level: int) -> np.ndarray:
    """The sum of ``values`` over the ``2 * level`` ranks that differ from ``rank`` in the bits below ``2 * level``
    (recursive doubling: both partners add the same two vectors, so every member ends with the same bits)."""
    received = np.empty_like(values)
    step = 1
    while step <= level:
        partner = rank ^ step
        comm.Sendrecv([values, MPI.DOUBLE], partner, _TAG, [received, MPI.DOUBLE], partner, _TAG)
        values = values + received
        step <<= 1
    return values


def _combine(mine: np.ndarray, theirs: np.ndarray, counts: np.ndarray, comm: MPI.Comm, rank: int,
             level: int, left: bool) -> None:
    """``mine = acoeff * mine + bcoeff * theirs`` per tensor, with dot products and norms over the block."""
    n = len(counts)
    stats = np.empty((n, 3), np.float64)      # per tensor: dot, |left piece|^2, |right piece|^2
    edges = np.concatenate(([0], np.cumsum(counts)))
    wide_mine = mine.astype(np.float64)
    wide_theirs = theirs.astype(np.float64)
    for i in range(n):
        a = wide_mine[edges[i]:edges[i + 1]]
        b = wide_theirs[edges[i]:edges[i + 1]]
        own, other = float(np.dot(a, a)), float(np.dot(b, b))
        stats[i] = (float(np.dot(a, b)), own, other) if left else (float(np.dot(a, b)), other, own)
    stats = _block_sum(comm, rank, stats.reshape(-1), level).reshape(n, 3)
    compute = np.float32 if mine.dtype == np.float16 else np.float64
    for i in range(n):
        lo, hi = edges[i], edges[i + 1]
        if lo == hi:
            continue
        dot = stats[i, 0]
        own, other = (stats[i, 1], stats[i, 2]) if left else (stats[i, 2], stats[i, 1])
        acoeff = 1.0 - dot / own * 0.5 if own >= _TINY else 1.0
        bcoeff = 1.0 - dot / other * 0.5 if other >= _TINY else 1.0
        if compute is np.float64:
            a, b = wide_mine[lo:hi], wide_theirs[lo:hi]
        else:
            a, b = mine[lo:hi].astype(np.float32), theirs[lo:hi].astype(np.float32)
        mine[lo:hi] = compute(acoeff) * a + compute(bcoeff) * b


def adasum_allreduce(buf: np.ndarray, counts: Sequence[int], comm: MPI.Comm) -> None:
    """Adasum of the 1-D float array ``buf`` over ``comm`` (a power-of-two size), in place on every rank.

    ``counts``: elements of each tensor packed in ``buf`` one after the other (their sum is ``buf.size``).
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return
    raw = buf.view(np.uint8)
    item = buf.itemsize
    scratch = np.empty_like(buf)
    held = np.asarray(counts, np.int64)      # elements of each tensor in the segment this rank holds
    lo, count = 0, int(buf.size)             # the segment: buf[lo:lo + count]
    given: list[np.ndarray] = []             # per level: the neighbour's counts, for the way back
    level = 1
    while level < size:
        neighbour = rank ^ level
        left = not rank & level
        first, second = _split(held, count >> 1)
        if left:
            keep, held, theirs = lo, first, second
            send_lo = lo + int(first.sum())
        else:
            keep, held, theirs = lo + int(first.sum()), second, first
            send_lo = lo
        kept, sent = int(held.sum()), int(theirs.sum())
        comm.Sendrecv([raw[send_lo * item:(send_lo + sent) * item], MPI.BYTE], neighbour, _TAG,
                      [scratch.view(np.uint8)[keep * item:(keep + kept) * item], MPI.BYTE], neighbour, _TAG)
        _combine(buf[keep:keep + kept], scratch[keep:keep + kept], held, comm, rank, level, left)
        given.append(theirs)
        lo, count = keep, kept
        level <<= 1
    level = size >> 1
    while level:
        neighbour = rank ^ level
        theirs = given.pop()
        sent = int(theirs.sum())
        other_lo = lo + count if not rank & level else lo - sent
        comm.Sendrecv([raw[lo * item:(lo + count) * item], MPI.BYTE], neighbour, _TAG,
                      [raw[other_lo * item:(other_lo + sent) * item], MPI.BYTE], neighbour, _TAG)
        lo, count = min(lo, other_lo), count + sent
        held = held + theirs
        level >>= 1
