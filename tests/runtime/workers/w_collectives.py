"""Every collective, op and dtype against a NumPy reference, on every rank. Exits non-zero on the first failure.

Usage: w_collectives.py [TIMELINE_API_PATH]
Rank 0 prints "ALL OK <n> checks" at the end. Every rank computes the reference for all ranks locally from
deterministic per-rank data, so a wrong value on any rank fails that rank (and the job).
"""

from __future__ import annotations

import os
import sys

import numpy as np

import hpcvod.runtime as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
checks = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global checks
    checks += 1
    if not ok:
        raise AssertionError(f"rank {rank}: check {name!r} failed {detail}")


def close(name: str, got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got = np.asarray(got)
    want = np.asarray(want)
    same_meta = got.shape == want.shape and got.dtype == want.dtype
    if got.dtype == np.bool_ or got.dtype.kind in "iu":
        ok = same_meta and np.array_equal(got, want)
    else:
        ok = same_meta and np.allclose(got, want, rtol=rtol, atol=atol)
    check(name, ok, f"\n got  {got.dtype}{got.shape} {got.ravel()[:8]}\n want {want.dtype}{want.shape} "
                    f"{want.ravel()[:8]}")


def data(r: int, shape: tuple, dtype: np.dtype, salt: int, product: bool = False) -> np.ndarray:
    rng = np.random.default_rng(salt * 7919 + r)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if product:
        values = rng.choice([1, 2] if dtype.kind == "u" else [-1, 1, 2], size=shape)
        return values.astype(dtype) if dtype.kind != "c" else (values + 0j).astype(dtype)
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -20
        return rng.integers(lo, 20, shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def reference(op: int, stack: np.ndarray, n: int) -> np.ndarray:
    dtype = stack.dtype
    if dtype == np.bool_:
        return stack.any(axis=0) if op in (hvd.Sum, hvd.Max) else stack.all(axis=0)
    if op == hvd.Sum:
        return stack.sum(axis=0, dtype=dtype)
    if op == hvd.Average:
        total = stack.sum(axis=0, dtype=dtype)
        return (total * (1.0 / n)).astype(dtype) if dtype.kind in "iu" else (total / n).astype(dtype)
    if op == hvd.Min:
        return stack.min(axis=0)
    if op == hvd.Max:
        return stack.max(axis=0)
    return stack.prod(axis=0, dtype=dtype)


def tol(dtype: np.dtype) -> dict:
    return {"rtol": 2e-2, "atol": 2e-2} if np.dtype(dtype) == np.float16 else {"rtol": 1e-5, "atol": 1e-5}


OPS = {"Average": hvd.Average, "Sum": hvd.Sum, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64,
          np.uint32, np.uint64, np.bool_, np.complex64, np.complex128]

# ---------------------------------------------------------------- allreduce: every op x dtype x form
salt = 0
for dtype in DTYPES:
    for op_name, op in OPS.items():
        dt = np.dtype(dtype)
        if dt == np.bool_ and op == hvd.Average:
            continue
        if dt.kind == "c" and op in (hvd.Min, hvd.Max):
            continue
        salt += 1
        shape = (3, 5)
        is_product = op == hvd.Product
        mine = data(rank, shape, dt, salt, is_product)
        stack = np.stack([data(r, shape, dt, salt, is_product) for r in range(size)])
        want = reference(op, stack, size)
        tag = f"allreduce {op_name} {dt.name}"
        close(tag + " blocking", hvd.allreduce(mine, op=op, name=f"ar.{dt.name}.{op_name}"), want, **tol(dt))
        inplace = mine.copy()
        got = hvd.allreduce_(inplace, op=op, name=f"ar_.{dt.name}.{op_name}")
        check(tag + " in-place returns its argument", got is inplace)
        close(tag + " in-place", inplace, want, **tol(dt))
        h1 = hvd.allreduce_async(mine, op=op)                       # unnamed, fused with the next one
        buf = mine.copy()
        h2 = hvd.allreduce_async_(buf, op=op)
        close(tag + " async", hvd.synchronize(h1), want, **tol(dt))
        close(tag + " async in-place", hvd.synchronize(h2), want, **tol(dt))
        check(tag + " poll after synchronize", hvd.poll(h1) and hvd.poll(h2))

# ------------------------------------------------------------- scaling, compression, non-contiguous, out=
x = data(rank, (64,), np.float32, 1001)
stack = np.stack([data(r, (64,), np.float32, 1001) for r in range(size)])
close("prescale/postscale Sum", hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
      stack.sum(0) * 0.5, rtol=1e-5)
close("postscale Average", hvd.allreduce(x, op=hvd.Average, postscale_factor=3.0), stack.mean(0) * 3, rtol=1e-5)
close("deprecated average=False", hvd.allreduce(x, average=False), stack.sum(0), rtol=1e-5)
fp16 = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
close("fp16 compression keeps float32", fp16, stack.sum(0), rtol=1e-2, atol=1e-2)
y = x.copy()
hvd.allreduce_(y, op=hvd.Sum, compression=hvd.Compression.fp16)
close("fp16 compression in-place", y, stack.sum(0), rtol=1e-2, atol=1e-2)
big = data(rank, (8, 10), np.float64, 1002)
bigstack = np.stack([data(r, (8, 10), np.float64, 1002) for r in range(size)])
view = big[:, ::2]
close("non-contiguous input", hvd.allreduce(view, op=hvd.Sum), bigstack[:, :, ::2].sum(0))
work = big.copy()
hvd.allreduce_(work[:, ::2], op=hvd.Sum)
close("non-contiguous in-place writes through", work[:, ::2], bigstack[:, :, ::2].sum(0))
close("non-contiguous in-place leaves the rest", work[:, 1::2], big[:, 1::2])
out = np.empty((64,), np.float32)
res = hvd.allreduce(x, op=hvd.Sum, out=out)
check("out= is used", res is out)
close("out= value", out, stack.sum(0), rtol=1e-5)
close("scalar (0-d) allreduce", hvd.allreduce(np.float64(rank), op=hvd.Sum), np.float64(sum(range(size))))
mv = memoryview(bytearray(np.full(4, rank, np.int32).tobytes())).cast("i")
close("buffer-protocol input", hvd.allreduce(mv, op=hvd.Sum), np.full(4, sum(range(size)), np.int32))


class DLPackOnly:
    """An object NumPy can only see through DLPack (like a framework tensor)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


close("DLPack input", hvd.allreduce(DLPackOnly(np.full(3, rank, np.float32)), op=hvd.Sum),
      np.full(3, sum(range(size)), np.float32))

# --------------------------------------------------------------------------------- grouped allreduce
tensors = [data(rank, (i + 1, 3), np.float32, 1100 + i) for i in range(6)]
wants = [np.stack([data(r, (i + 1, 3), np.float32, 1100 + i) for r in range(size)]).mean(0) for i in range(6)]
for got, want in zip(hvd.grouped_allreduce(tensors, name="grp"), wants):
    close("grouped_allreduce", got, want)
copies = [t.copy() for t in tensors]
hvd.synchronize(hvd.grouped_allreduce_async_(copies, op=hvd.Average))
for got, want in zip(copies, wants):
    close("grouped_allreduce_async_ in-place", got, want)

# ------------------------------------------------- rank-dependent submission order (negotiation by name)
for iteration in range(3):  # the 2nd and 3rd iterations are served by the response cache
    shapes = [(k % 7 + 1, 4) for k in range(24)]
    order = list(range(24)) if rank % 2 == 0 else list(reversed(range(24)))
    if rank == 1:
        order = order[12:] + order[:12]
    handles = {}
    bufs = {}
    for k in order:
        bufs[k] = np.full(shapes[k], float(k + 100 * rank), np.float64)
        if k % 3 == 0:
            handles[k] = hvd.allreduce_async_(bufs[k], name=f"order.{k}", op=hvd.Sum)
        elif k % 3 == 1:
            handles[k] = hvd.allgather_async(bufs[k][: rank + 1], name=f"order.{k}")
        else:
            handles[k] = hvd.broadcast_async(bufs[k], root_rank=k % size, name=f"order.{k}")
    for k in sorted(handles, reverse=bool(rank % 2)):
        got = hvd.synchronize(handles[k])
        if k % 3 == 0:
            want = np.full(shapes[k], sum(float(k + 100 * r) for r in range(size)))
        elif k % 3 == 1:
            want = np.concatenate([np.full((min(r + 1, shapes[k][0]), 4), float(k + 100 * r)) for r in range(size)])
        else:
            want = np.full(shapes[k], float(k + 100 * (k % size)))
        close(f"rank-dependent order iteration {iteration} {k}", got, want)

# -------------------------------------------------- unnamed async bursts (cached by position, in order)
for iteration in range(3):
    hs = [hvd.allreduce_async(np.full(16, float(k * size + rank), np.float32), op=hvd.Sum) for k in range(40)]
    for k, h in enumerate(hs):
        close(f"unnamed burst {iteration} #{k}", hvd.synchronize(h),
              np.full(16, float(sum(k * size + r for r in range(size))), np.float32))

# -------------------------------------------------------------------------------------------- allgather
for dtype in (np.float32, np.int64, np.uint8, np.bool_, np.complex64):
    rows = rank + 1
    mine = data(rank, (rows, 2, 3), dtype, 1200)
    want = np.concatenate([data(r, (r + 1, 2, 3), dtype, 1200) for r in range(size)])
    close(f"allgather uneven first dim {np.dtype(dtype).name}", hvd.allgather(mine), want)
close("allgather 1-d", hvd.allgather(np.arange(rank + 2)), np.concatenate([np.arange(r + 2) for r in range(size)]))
close("allgather empty on some ranks", hvd.allgather(np.zeros((rank % 2, 3))), np.zeros((sum(r % 2 for r in range(size)), 3)))
got = hvd.grouped_allgather([np.full((rank + 1,), rank), np.full((1, 2), rank * 1.5)])
close("grouped_allgather 0", got[0], np.concatenate([np.full((r + 1,), r) for r in range(size)]))
close("grouped_allgather 1", got[1], np.concatenate([np.full((1, 2), r * 1.5) for r in range(size)]))

# -------------------------------------------------------------------------------------------- broadcast
for root in range(size):
    for dtype in (np.float64, np.int32, np.bool_, np.float16):
        mine = data(rank, (4, 3), dtype, 1300 + root)
        want = data(root, (4, 3), dtype, 1300 + root)
        close(f"broadcast root {root} {np.dtype(dtype).name}", hvd.broadcast(mine, root_rank=root), want)
        check("broadcast leaves the input alone", np.array_equal(mine, data(rank, (4, 3), dtype, 1300 + root)))
        buf = mine.copy()
        hvd.broadcast_(buf, root_rank=root)
        close(f"broadcast_ root {root} {np.dtype(dtype).name}", buf, want)
state = {"epoch": 3, "name": f"from rank {size - 1}", "weights": np.arange(5) * (size - 1)} \
    if rank == size - 1 else None
got = hvd.broadcast_object(state, root_rank=size - 1)
check("broadcast_object", got["name"] == f"from rank {size - 1}" and np.array_equal(got["weights"], np.arange(5) * (size - 1)))
everyone = hvd.allgather_object({"rank": rank, "payload": "x" * (rank * 10)})
check("allgather_object", everyone == [{"rank": r, "payload": "x" * (r * 10)} for r in range(size)])

# --------------------------------------------------------------------------------------------- alltoall
splits = [(rank + j) % 3 for j in range(size)]
mine = np.concatenate([np.full((splits[j], 2), 100 * rank + j, np.int64) for j in range(size)])
got, received = hvd.alltoall(mine, splits=splits)
want_splits = [(r + rank) % 3 for r in range(size)]
close("alltoall received splits", received, np.array(want_splits, np.int64))
close("alltoall data", got, np.concatenate([np.full((want_splits[r], 2), 100 * r + rank, np.int64)
                                             for r in range(size)]).reshape(-1, 2))
even = np.arange(size * 2, dtype=np.float32) + 10 * rank
got = hvd.alltoall(even)
close("alltoall equal splits", got, np.concatenate([np.arange(rank * 2, rank * 2 + 2, dtype=np.float32) + 10 * r
                                                    for r in range(size)]))

# ---------------------------------------------------------------------------------------- reducescatter
for op_name, op in (("Sum", hvd.Sum), ("Average", hvd.Average), ("Max", hvd.Max)):
    rows = 2 * size + 1                                   # uneven: the first rank gets one row more
    mine = data(rank, (rows, 3), np.float64, 1400)
    total = reference(op, np.stack([data(r, (rows, 3), np.float64, 1400) for r in range(size)]), size)
    base, extra = divmod(rows, size)
    start = rank * base + min(rank, extra)
    stop = start + base + (1 if rank < extra else 0)
    close(f"reducescatter {op_name}", hvd.reducescatter(mine, op=op), total[start:stop])
got = hvd.grouped_reducescatter([np.ones((size, 2)) * rank, np.ones((size * 2,)) * rank], op=hvd.Sum)
close("grouped_reducescatter 0", got[0], np.ones((1, 2)) * sum(range(size)))
close("grouped_reducescatter 1", got[1], np.ones((2,)) * sum(range(size)))

# ---------------------------------------------------------------------------------------- process sets
if size >= 2:  # with one rank the even set would be the global set
    evens = hvd.add_process_set(list(range(0, size, 2)))
    odds = hvd.add_process_set(hvd.ProcessSet(list(range(1, size, 2))))
    check("process set ids", evens.process_set_id == 1 and odds.process_set_id == 2)
    for ps, members in ((evens, list(range(0, size, 2))), (odds, list(range(1, size, 2)))):
        check("process set included", ps.included() == (rank in members))
        check("process set size", ps.size() == len(members))
        if rank in members:
            check("process set rank", ps.rank() == members.index(rank))
            # async on the set and blocking on the global set, in rank-dependent order
            h = hvd.allreduce_async(np.full(3, float(rank)), op=hvd.Sum, name="ps.sum", process_set=ps)
            g = hvd.allreduce(np.full(2, 1.0), op=hvd.Sum, name=f"global.during.{ps.process_set_id}")
            close("global allreduce while a set op is pending", g, np.full(2, float(size)))
            close("process set allreduce", hvd.synchronize(h), np.full(3, float(sum(members))))
            close("process set Average divides by the set size",
                  hvd.allreduce(np.full(2, float(rank)), op=hvd.Average, process_set=ps),
                  np.full(2, float(np.mean(members))))
            close("process set allgather", hvd.allgather(np.array([rank]), process_set=ps), np.array(members))
            close("process set broadcast", hvd.broadcast(np.array([rank * 1.0]), root_rank=members[-1], process_set=ps),
                  np.array([members[-1] * 1.0]))
            hvd.barrier(process_set=ps)
            try:
                hvd.broadcast(np.zeros(1), root_rank=[r for r in range(size) if r not in members][0]
                              if len(members) < size else size, process_set=ps)
                check("broadcast from a non-member root raises", False)
            except hvd.HpcvodInputError:
                check("broadcast from a non-member root raises", True)
        else:
            g = hvd.allreduce(np.full(2, 1.0), op=hvd.Sum, name=f"global.during.{ps.process_set_id}")
            close("global allreduce while a set op is pending", g, np.full(2, float(size)))
            try:
                hvd.allreduce(np.zeros(1), process_set=ps)
                check("a non-member using the set raises", False)
            except hvd.HpcvodInputError as exc:
                check("a non-member using the set raises", "not a member" in str(exc))
    check("remove_process_set", hvd.remove_process_set(odds))
    check("removed set is unregistered", odds.process_set_id is None and odds.included() is None)
    try:
        hvd.allreduce(np.zeros(1), process_set=odds)
        check("using a removed set raises", False)
    except hvd.HpcvodInputError:
        check("using a removed set raises", True)

# ------------------------------------------------------------------------------------- input validation
for what, call, error in (
    ("Adasum of an int array", lambda: hvd.allreduce(np.ones(2, np.int32), op=hvd.Adasum), hvd.HpcvodInputError),
    ("bool Average", lambda: hvd.allreduce(np.ones(2, bool)), hvd.HpcvodInputError),
    ("object dtype", lambda: hvd.allreduce(np.array([object()])), hvd.HpcvodInputError),
    ("bad root", lambda: hvd.broadcast(np.ones(2), root_rank=size), hvd.HpcvodInputError),
    ("bad splits", lambda: hvd.alltoall(np.ones(3), splits=[5] * size), hvd.HpcvodInputError),
    ("read-only in-place", lambda: hvd.allreduce_(np.frombuffer(b"\0" * 8, np.float32)), hvd.HpcvodInputError),
    ("unknown op", lambda: hvd.allreduce(np.ones(2), op=42), hvd.HpcvodInputError),
):
    try:
        call()
        check(what, False, "no exception")
    except error:
        check(what, True)
    except Exception as exc:  # noqa: BLE001 - report the wrong type
        check(what, False, f"raised {type(exc).__name__}: {exc}")

# ------------------------------------------------------------------------------- start/stop_timeline
if len(sys.argv) > 1:
    hvd.start_timeline(sys.argv[1])
    hvd.allreduce(np.ones(10), name="timeline.api.tensor")
    hvd.stop_timeline()

# ----------------------------------------------------------------------------------------------- join
steps = 2 * (rank + 1)
for step in range(steps):
    active = [r for r in range(size) if step < 2 * (r + 1)]
    got = hvd.allreduce(np.full(3, float(rank + 1)), op=hvd.Average, name="join.grad")
    close(f"allreduce with joined ranks (step {step})", got, np.full(3, sum(r + 1.0 for r in active) / size))
last = hvd.join()
check("join returns the last rank to join", last == size - 1, f"got {last}")
close("after join everything is normal again", hvd.allreduce(np.ones(2), op=hvd.Sum, name="after.join"),
      np.full(2, float(size)))

hvd.barrier()
if rank == 0:
    print(f"ALL OK {checks} checks on {size} ranks "
          f"(fusion threshold {os.environ.get('HPCVOD_FUSION_THRESHOLD', 'default')}, "
          f"cache {os.environ.get('HPCVOD_CACHE_CAPACITY', 'default')})", flush=True)
hvd.shutdown()
