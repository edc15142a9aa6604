"""Device collectives on a real GPU (CuPy arrays and torch CUDA tensors), checked against host arithmetic.

Needs CuPy with a GPU. Every rank prints "GPU OK <backend> <n> checks" at the end; any wrong value raises.
With several ranks on one GPU, NCCL cannot be used: auto falls back to MPI staging (that is checked too).
"""

import sys

import cupy as cp
import numpy as np

import hpcvod.runtime as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
lane = hvd.global_process_set._lane
checks = 0


def same(what: str, got, want) -> None:
    global checks
    got = cp.asnumpy(got) if isinstance(got, cp.ndarray) else np.asarray(got)
    if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
        raise AssertionError(f"rank {rank}: {what}: {got.ravel()[:4]} != {np.asarray(want).ravel()[:4]}")
    checks += 1


ranks_sum = size * (size + 1) / 2
for dtype in (cp.float32, cp.float64, cp.float16, cp.int32, cp.int64):
    x = cp.full((1000, 3), rank + 1, dtype)
    out = hvd.allreduce(x, name=f"sum.{cp.dtype(dtype).name}", op=hvd.Sum)
    assert isinstance(out, cp.ndarray), type(out)
    same(f"allreduce {cp.dtype(dtype).name}", out, np.full((1000, 3), ranks_sum))
    hvd.allreduce_(x, name=f"avg.{cp.dtype(dtype).name}")          # in place, Average
    same(f"allreduce_ {cp.dtype(dtype).name}", x, np.full((1000, 3), ranks_sum / size if dtype in (cp.float32, cp.float64, cp.float16) else int(ranks_sum / size)))
for op, want in ((hvd.Min, 1), (hvd.Max, size), (hvd.Product, float(np.prod(np.arange(1, size + 1))))):
    same(f"op {op}", hvd.allreduce(cp.full(17, rank + 1.0, cp.float32), op=op, name=f"op.{op}"), np.full(17, want))
# a burst of async requests: fused into the device fusion buffer
handles = [hvd.allreduce_async_(cp.full(4096, rank + 1.0, cp.float32), name=f"burst.{i}", op=hvd.Sum)
           for i in range(64)]
for h in handles:
    same("burst", hvd.synchronize(h), np.full(4096, ranks_sum))
# grouped, prescale/postscale
outs = hvd.grouped_allreduce([cp.ones(5, cp.float32) * (rank + 1), cp.ones(7, cp.float32)], name="grp",
                             op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
same("grouped 0", outs[0], np.full(5, ranks_sum))
same("grouped 1", outs[1], np.full(7, size))
# broadcast (in place and out of place) from the last rank
b = cp.full(33, rank, cp.float64)
hvd.broadcast_(b, root_rank=size - 1, name="bcast_")
same("broadcast_", b, np.full(33, size - 1))
same("broadcast", hvd.broadcast(cp.arange(10) * (rank + 1), root_rank=0, name="bcast"), np.arange(10))
# allgather, alltoall and reducescatter run on the device too: results stay device arrays
def on_device(what: str, got):
    global checks
    assert isinstance(got, cp.ndarray), f"rank {rank}: {what} came back as {type(got).__name__}"
    checks += 1
    return got


same("allgather", on_device("allgather", hvd.allgather(cp.full((2, 2), rank, cp.float32), name="ag")),
     np.repeat(np.arange(size), 2)[:, None] * np.ones((1, 2)))
# different first dimensions: rank r gives r + 1 rows
same("allgather uneven", on_device("allgather uneven", hvd.allgather(cp.full((rank + 1, 3), rank, cp.int64),
                                                                     name="ag.uneven")),
     np.concatenate([np.full((r + 1, 3), r) for r in range(size)]))
outs = hvd.grouped_allgather([cp.full(2, rank, cp.float16), cp.full((rank + 1,), rank, cp.float32)], name="gag")
same("grouped allgather 0", on_device("grouped allgather", outs[0]), np.repeat(np.arange(size), 2))
same("grouped allgather 1", outs[1], np.concatenate([np.full(r + 1, r) for r in range(size)]))
# alltoall: r + 1 rows to rank r, and equal splits
sent = cp.asarray(np.concatenate([np.full((d + 1, 2), 10.0 * rank + d) for d in range(size)]).astype(np.float32))
got, received = hvd.alltoall(sent, splits=[d + 1 for d in range(size)], name="a2a.splits")
same("alltoall splits", on_device("alltoall", got), np.concatenate([np.full((rank + 1, 2), 10.0 * r + rank)
                                                                    for r in range(size)]))
assert list(np.asarray(received)) == [rank + 1] * size, received
same("alltoall equal", on_device("alltoall equal", hvd.alltoall(cp.arange(2 * size, dtype=cp.int32) + 100 * rank,
                                                                name="a2a.equal")),
     np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r for r in range(size)]))
# reducescatter: an even split, an uneven one (first dim0 % size ranks get a row more), scaling, float16
x = cp.asarray(np.arange(4 * size * 3, dtype=np.float32).reshape(4 * size, 3) + rank)
full = sum(np.arange(4 * size * 3, dtype=np.float64).reshape(4 * size, 3) + r for r in range(size))
same("reducescatter even", on_device("reducescatter", hvd.reducescatter(x, op=hvd.Sum, name="rs.even")),
     full[4 * rank:4 * rank + 4])
rows = [(2 * size + 1) // size + (1 if r < (2 * size + 1) % size else 0) for r in range(size)]
y = cp.asarray(np.ones((2 * size + 1, 2), np.float64) * (rank + 1))
start = sum(rows[:rank])
same("reducescatter uneven", hvd.reducescatter(y, op=hvd.Average, name="rs.uneven"),
     np.full((rows[rank], 2), ranks_sum / size))
same("reducescatter scaled", hvd.reducescatter(cp.ones((size, 4), cp.float16), op=hvd.Sum, prescale_factor=0.5,
                                               postscale_factor=3.0, name="rs.scaled"), np.full((1, 4), 1.5 * size))
outs = hvd.grouped_reducescatter([x, y], op=hvd.Sum, name="grs")
same("grouped reducescatter 0", on_device("grouped reducescatter", outs[0]), full[4 * rank:4 * rank + 4])
same("grouped reducescatter 1", outs[1], np.full((rows[rank], 2), ranks_sum))
# bfloat16 (CuPy has none): int16 words wrapped in Bfloat16Words, reduced by NCCL as bfloat16 (staged: as
# float32 on the host); torch does the reference conversions (an environment without torch skips them, saying so)
try:
    import torch
except ImportError:
    torch = None
    print(f"rank {rank}: no torch: bfloat16 checks skipped", flush=True)


if torch is not None:
    def bf16_words(values) -> "cp.ndarray":
        return cp.asarray(torch.tensor(np.asarray(values, np.float32)).to(torch.bfloat16).view(torch.int16).numpy())


    def bf16_values(words) -> np.ndarray:
        return torch.from_numpy(cp.asnumpy(words).astype(np.int16)).view(torch.bfloat16).float().numpy()


    def same_bf16(what: str, got, want) -> None:
        global checks
        assert isinstance(got, cp.ndarray) and got.dtype == cp.int16, f"rank {rank}: {what}: {type(got)} {got.dtype}"
        values = bf16_values(got)
        if not np.allclose(values, want, rtol=size * 2.0 ** -8, atol=1e-6):
            raise AssertionError(f"rank {rank}: {what}: {values.ravel()[:4]} != {np.asarray(want).ravel()[:4]}")
        checks += 1


    base = np.linspace(-3.0, 5.0, 999, dtype=np.float32)
    mine = bf16_values(bf16_words(base * (rank + 1)))
    everyone = sum(bf16_values(bf16_words(base * (r + 1))) for r in range(size))
    same_bf16("bf16 allreduce Sum", hvd.allreduce(hvd.Bfloat16Words(bf16_words(base * (rank + 1))), op=hvd.Sum,
                                                  name="bf16.sum"), everyone)
    w = bf16_words(base * (rank + 1))
    hvd.allreduce_(hvd.Bfloat16Words(w), name="bf16.avg", prescale_factor=2.0)    # in place, Average, prescaled
    same_bf16("bf16 allreduce_ Average prescale 2", w, everyone * 2.0 / size)
    handles = [hvd.allreduce_async(hvd.Bfloat16Words(bf16_words(base[:100 + i] * (rank + 1))), op=hvd.Sum,
                                   name=f"bf16.burst.{i}") for i in range(8)]                  # fused
    for i, h in enumerate(handles):
        same_bf16(f"bf16 burst {i}", hvd.synchronize(h), everyone[:100 + i])
    same_bf16("bf16 Max", hvd.allreduce(hvd.Bfloat16Words(bf16_words(np.full(5, rank - 0.5))), op=hvd.Max,
                                        name="bf16.max"), np.full(5, size - 1.5))
    same_bf16("bf16 broadcast", hvd.broadcast(hvd.Bfloat16Words(bf16_words(base * (rank + 1))), root_rank=size - 1,
                                              name="bf16.bcast"), bf16_values(bf16_words(base * size)))
    same_bf16("bf16 allgather", hvd.allgather(hvd.Bfloat16Words(bf16_words(np.full((2, 3), rank + 0.25))),
                                              name="bf16.ag"), np.repeat(np.arange(size) + 0.25, 2)[:, None] * np.ones(3))
    rs = hvd.reducescatter(hvd.Bfloat16Words(bf16_words(np.tile(base[:4 * size], (1, 1)).reshape(4 * size, 1)
                                                        * (rank + 1))), op=hvd.Average, name="bf16.rs")
    full_rs = sum(bf16_values(bf16_words(base[:4 * size].reshape(4 * size, 1) * (r + 1))) for r in range(size)) / size
    same_bf16("bf16 reducescatter Average", rs, full_rs[4 * rank:4 * rank + 4])
    try:
        hvd.allreduce(hvd.Bfloat16Words(bf16_words(base)), name="bf16.fp16", compression=hvd.Compression.fp16)
        raise AssertionError("compressing bfloat16 words was not refused")
    except hvd.HpcvodInputError as exc:
        assert "bfloat16" in str(exc), exc
        checks += 1
# async bursts: the allgathers (equal and different first dimensions) of one cycle run as one NCCL group, and so
# do the reducescatters (even, uneven, scaled)
gathers = [hvd.allgather_async(cp.full((rank + 1 if i % 2 else 2, 2), 10 * i + rank, cp.float32),
                               name=f"ag.burst.{i}") for i in range(6)]
scatters = [hvd.reducescatter_async(cp.ones((size + i, 3), cp.float32) * (rank + 1), op=hvd.Sum,
                                    prescale_factor=2.0 if i == 3 else 1.0, name=f"rs.burst.{i}") for i in range(4)]
for i, h in enumerate(gathers):
    rows_of = [(r + 1 if i % 2 else 2) for r in range(size)]
    same(f"allgather burst {i}", on_device("allgather burst", hvd.synchronize(h)),
         np.concatenate([np.full((n, 2), 10 * i + r) for r, n in enumerate(rows_of)]))
for i, h in enumerate(scatters):
    mine_rows = (size + i) // size + (1 if rank < (size + i) % size else 0)
    same(f"reducescatter burst {i}", on_device("reducescatter burst", hvd.synchronize(h)),
         np.full((mine_rows, 3), ranks_sum * (2.0 if i == 3 else 1.0)))
# a device tensor on one rank and a host array on another under the same name: a mismatch on every rank
if size > 1:
    mixed = cp.ones(8, cp.float32) if rank == 0 else np.ones(8, np.float32)
    try:
        hvd.allreduce(mixed, name="mixed")
        raise AssertionError(f"rank {rank}: device/host mix was not refused")
    except hvd.HpcvodMismatchError as exc:
        assert "device=cuda" in str(exc), exc
        checks += 1
# torch CUDA tensors: zero-copy through DLPack, a DistributedOptimizer step keeps ranks identical
if "--torch" in sys.argv:
    import hpcvod.torch as thvd
    t = torch.full((100,), float(rank + 1), device="cuda")
    ptr = t.data_ptr()
    thvd.allreduce_(t, op=thvd.Sum, name="torch.inplace")
    assert t.data_ptr() == ptr
    same("torch allreduce_", cp.asarray(t), np.full(100, ranks_sum))
    tb = torch.full((64,), float(rank + 1), device="cuda", dtype=torch.bfloat16)   # NCCL's bfloat16, in place
    ptr = tb.data_ptr()
    thvd.allreduce_(tb, op=thvd.Sum, name="torch.bf16")
    assert tb.dtype == torch.bfloat16 and tb.data_ptr() == ptr, (tb.dtype, tb.data_ptr(), ptr)
    same("torch bf16 allreduce_", cp.asarray(tb.float()), np.full(64, ranks_sum))
    same("torch bf16 allgather", cp.asarray(thvd.allgather(tb[None, :4], name="torch.bf16.ag").float()),
         np.full((size, 4), ranks_sum))
    torch.manual_seed(rank)                       # different initial weights on purpose
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    data = torch.randn(64, 32, device="cuda") + rank
    for _ in range(3):
        opt.zero_grad()
        loss = model(data).pow(2).mean()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy()
    gathered = hvd.allgather(flat[None, :], name="torch.params")
    same("torch params identical on every rank", gathered - gathered[0], np.zeros_like(gathered))
backend = lane.executors.device_ops.backend if lane.executors.device_ops is not None else "none"
print(f"GPU OK {backend} {checks} checks rank {rank}", flush=True)
hvd.shutdown()
