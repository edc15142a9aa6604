"""op=Adasum against a NumPy transcription of Horovod's formula, on every rank. Exits non-zero on the first failure.

The reference combines the ranks' whole tensors pairwise, in the order of Horovod's levels: (0,1), (2,3), ...
then (01, 23), ... Each pair is ``a * (1 - dot / (2 |a|^2)) + b * (1 - dot / (2 |b|^2))`` (a coefficient stays 1
where the squared norm is below sqrt(DBL_MIN)), computed in float64 and rounded to the tensor's dtype after each
level (float16 in float32), as Horovod's kernels do. Every rank builds every rank's data from its seed.

On a process count that is not a power of two, every rank must get Horovod's NotImplementedError and the runtime
must stay usable. Rank 0 prints "ADASUM OK <checks> checks on <size> ranks" at the end.
"""

from __future__ import annotations

import sys

import numpy as np

import hpcvod.runtime as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
checks = 0
TINY = np.sqrt(np.finfo(np.float64).tiny)
TOLERANCE = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-12}


def check(name: str, ok: bool, detail: str = "") -> None:
    global checks
    checks += 1
    if not ok:
        raise AssertionError(f"rank {rank}: check {name!r} failed {detail}")


def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Horovod's pairwise Adasum of two whole tensors."""
    wa, wb = a.astype(np.float64), b.astype(np.float64)
    dot, na, nb = np.vdot(wa, wb), np.vdot(wa, wa), np.vdot(wb, wb)
    ca = 1.0 - dot / na * 0.5 if na >= TINY else 1.0
    cb = 1.0 - dot / nb * 0.5 if nb >= TINY else 1.0
    if a.dtype == np.float16:
        return (np.float32(ca) * a.astype(np.float32) + np.float32(cb) * b.astype(np.float32)).astype(np.float16)
    return (ca * wa + cb * wb).astype(a.dtype)


def reference(tensors: list[np.ndarray]) -> np.ndarray:
    while len(tensors) > 1:
        tensors = [pair(tensors[i], tensors[i + 1]) for i in range(0, len(tensors), 2)]
    return tensors[0]


def data(seed: int, r: int, n: int, dtype: type) -> np.ndarray:
    return np.random.default_rng([seed, r]).standard_normal(n).astype(dtype)


def close(name: str, got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.asarray(got), np.asarray(want)
    scale = max(float(np.linalg.norm(want.astype(np.float64))), 1e-300)
    error = float(np.linalg.norm(got.astype(np.float64) - want.astype(np.float64))) / scale
    check(name, got.shape == want.shape and got.dtype == want.dtype and error <= TOLERANCE[want.dtype.type],
          f"\n got  {got.dtype}{got.shape} {got.ravel()[:6]}\n want {want.dtype}{want.shape} {want.ravel()[:6]}"
          f"\n relative error {error:.3g}")


def same_everywhere(name: str, result: np.ndarray) -> None:
    rows = hvd.allgather(np.ascontiguousarray(result).reshape(1, -1).view(np.uint8), name=f"same.{name}")
    check(f"{name}: every rank has the same bits", all(np.array_equal(rows[0], row) for row in rows))


if size & (size - 1):
    # Horovod's error, on every rank, before anything is sent; the runtime goes on working
    try:
        hvd.allreduce(np.ones(4, np.float32), op=hvd.Adasum, name="refused")
        check("non-power-of-two refused", False, "no exception")
    except NotImplementedError as exc:
        check("non-power-of-two refused", "non-power of 2 ranks is not supported" in str(exc)
              and f"{size} ranks" in str(exc), str(exc))
    total = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after.refusal")
    check("usable after the refusal", np.array_equal(total, np.full(2, float(size))))
    if rank == 0:
        print(f"ADASUM REFUSED OK {checks} checks on {size} ranks", flush=True)
    sys.exit(0)

# one tensor, each float dtype, lengths below, at and above the rank count (uneven halving)
for dtype in (np.float16, np.float32, np.float64):
    for n in (1, 3, size + 1, 1000, 4099):
        mine = data(n, rank, n, dtype)
        want = reference([data(n, r, n, dtype) for r in range(size)])
        got = hvd.allreduce(mine, op=hvd.Adasum, name=f"one.{np.dtype(dtype).name}.{n}")
        close(f"one {np.dtype(dtype).name}[{n}]", got, want)
        check(f"input untouched {n}", np.array_equal(mine, data(n, rank, n, dtype)))
        same_everywhere(f"one.{np.dtype(dtype).name}.{n}", got)

# in place, with a 2-D shape
mine = data(7, rank, 60, np.float32).reshape(6, 10)
want = reference([data(7, r, 60, np.float32).reshape(6, 10) for r in range(size)])
hvd.allreduce_(mine, op=hvd.Adasum, name="in.place")
close("in place", mine, want)

# fused: a grouped allreduce packs its tensors into one buffer, yet each keeps its own dot products and norms
lengths = [5, 1, 300, 2, 77, size * 3 + 1]
mine = [data(100 + i, rank, n, np.float32) for i, n in enumerate(lengths)]
wants = [reference([data(100 + i, r, n, np.float32) for r in range(size)]) for i, n in enumerate(lengths)]
for i, (got, want) in enumerate(zip(hvd.grouped_allreduce(mine, op=hvd.Adasum, name="fused"), wants)):
    close(f"fused member {i}", got, want)
    same_everywhere(f"fused.{i}", got)
if size > 1:
    whole = reference([np.concatenate([data(100 + i, r, n, np.float32) for i, n in enumerate(lengths)])
                       for r in range(size)])
    check("fusion is not one long vector", not np.allclose(np.concatenate(wants), whole, rtol=1e-3))

# asynchronous requests, fused by the engine when they meet in one cycle
handles = [hvd.allreduce_async(data(200 + i, rank, 50 + i, np.float64), op=hvd.Adasum, name=f"async.{i}")
           for i in range(20)]
for i, h in enumerate(handles):
    close(f"async {i}", hvd.synchronize(h), reference([data(200 + i, r, 50 + i, np.float64) for r in range(size)]))

# Horovod's special cases: orthogonal vectors add up, equal vectors average, zero vectors leave the other alone
basis = np.eye(max(size, 2))[:size]
close("orthogonal: the sum", hvd.allreduce(basis[rank] * (rank + 1), op=hvd.Adasum, name="orthogonal"),
      np.sum([basis[r] * (r + 1) for r in range(size)], axis=0))
v = data(300, 0, 64, np.float64)
close("parallel: the average", hvd.allreduce(v, op=hvd.Adasum, name="parallel"), v)
lone = data(301, 0, 64, np.float64) if rank == size - 1 else np.zeros(64)
close("zeros elsewhere: the one vector", hvd.allreduce(lone, op=hvd.Adasum, name="lone"),
      data(301, 0, 64, np.float64))

# pre- and postscale around the combination (Horovod: scale, Adasum, scale)
mine = data(400, rank, 33, np.float64)
close("pre/postscale", hvd.allreduce(mine, op=hvd.Adasum, prescale_factor=3.0, postscale_factor=0.5, name="scaled"),
      reference([data(400, r, 33, np.float64) * 3.0 for r in range(size)]) * 0.5)

# a process set of two ranks reduces over its own communicator
if size >= 4:
    pairs = hvd.add_process_set([1, 3])
    if pairs.included():
        mine = data(500, rank, 41, np.float32)
        close("process set [1, 3]", hvd.allreduce(mine, op=hvd.Adasum, process_set=pairs, name="set"),
              reference([data(500, r, 41, np.float32) for r in (1, 3)]))
    hvd.remove_process_set(pairs)

# refusals: dtypes Horovod has no Adasum kernel for, and reducescatter
for what, call in (("int32", lambda: hvd.allreduce(np.ones(2, np.int32), op=hvd.Adasum, name="int")),
                   ("reducescatter", lambda: hvd.reducescatter(np.ones(size * 2), op=hvd.Adasum, name="rs"))):
    try:
        call()
        check(f"{what} refused", False, "no exception")
    except hvd.HpcvodInputError as exc:
        check(f"{what} refused", "Adasum" in str(exc), str(exc))

hvd.shutdown()
if rank == 0:
    print(f"ADASUM OK {checks} checks on {size} ranks", flush=True)
