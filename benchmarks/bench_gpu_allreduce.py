"""Device-buffer collectives: hpcvod over NCCL against raw CuPy NCCL (and torch.distributed with NCCL), one run.

    mpiexec -n N python benchmarks/bench_gpu_allreduce.py [--rounds 5] [--max-mib 256]
                                                          [--collectives allreduce,allgather,...] [--torch]

Needs CuPy with NCCL and one GPU per rank (a single rank is allowed: NCCL then only runs its local copy path).
For float32 sizes from 4 KiB to 256 MiB it times, in interleaved rounds (medians), each collective of hpcvod on a
CuPy array against the raw NCCL call(s) on the same buffers and stream, each call followed by a stream
synchronisation (as hpcvod does before a handle is done): allreduce (``allReduce``), allgather (``allGather``),
broadcast (``bcast``), reducescatter (``reduceScatter``), alltoall (``send``/``recv`` pairs in one group).
``--torch`` adds torch.distributed over NCCL on tensors viewing the same memory (DLPack). Bandwidth is the
"bus bandwidth" of nccl-tests: allreduce 2(n-1)/n, allgather/reducescatter/alltoall (n-1)/n, broadcast 1, times
bytes / time; "ratio" is hpcvod / raw. On the CPU stand-in of tests/runtime/cpu_cupy it runs end to end (a check
of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
from typing import Callable

import cupy as cp
from cupy.cuda import nccl
from mpi4py import MPI

import hpcvod.runtime as hvd
from bench_allreduce import timed as host_timed   # benchmarks/ is the script's folder: on sys.path

KIB, MIB = 1024, 1024 * 1024
SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]
COLLECTIVES = ["allreduce", "allgather", "broadcast", "reducescatter", "alltoall"]


def timed(comm: MPI.Comm, fn: Callable[[], None], iterations: int) -> float:
    """bench_allreduce's timer after one warm-up call (every fn here synchronises its stream itself)."""
    fn()
    return host_timed(comm, fn, iterations)


def bus_factor(name: str, size: int) -> float:
    if size == 1:
        return 1.0
    return {"allreduce": 2 * (size - 1) / size, "broadcast": 1.0}.get(name, (size - 1) / size)


def calls(name: str, x: cp.ndarray, raw: nccl.NcclCommunicator, stream: cp.cuda.Stream, size: int,
          rank: int) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None] | None]:
    """(hpcvod, raw NCCL, torch.distributed or None) for one collective on buffer ``x`` (count elements)."""
    n = x.size
    out = cp.empty(n * size if name == "allgather" else n, cp.float32)
    part = n // size
    f32 = nccl.NCCL_FLOAT32

    def done() -> None:
        stream.synchronize()

    if name == "allreduce":
        def raw_call() -> None:
            raw.allReduce(x.data.ptr, x.data.ptr, n, f32, nccl.NCCL_SUM, stream.ptr)
            done()
        ours = lambda: hvd.allreduce_(x, name="bench.ar", op=hvd.Sum)                  # noqa: E731
    elif name == "allgather":
        def raw_call() -> None:
            raw.allGather(x.data.ptr, out.data.ptr, n, f32, stream.ptr)
            done()
        ours = lambda: hvd.allgather(x, name="bench.ag")                               # noqa: E731
    elif name == "broadcast":
        def raw_call() -> None:
            raw.bcast(x.data.ptr, n, f32, 0, stream.ptr)
            done()
        ours = lambda: hvd.broadcast_(x, 0, name="bench.bc")                           # noqa: E731
    elif name == "reducescatter":
        def raw_call() -> None:
            raw.reduceScatter(x.data.ptr, out.data.ptr, part, f32, nccl.NCCL_SUM, stream.ptr)
            done()
        ours = lambda: hvd.reducescatter(x, name="bench.rs", op=hvd.Sum)               # noqa: E731
    else:
        def raw_call() -> None:
            nccl.groupStart()
            for peer in range(size):
                raw.send(x.data.ptr + peer * part * 4, part, f32, peer, stream.ptr)
                raw.recv(out.data.ptr + peer * part * 4, part, f32, peer, stream.ptr)
            nccl.groupEnd()
            done()
        ours = lambda: hvd.alltoall(x, name="bench.a2a")                               # noqa: E731
    return ours, raw_call, torch_call(name, x, out, size) if TORCH else None


TORCH = None    # torch.distributed, when --torch is given and torch sees CUDA


def torch_call(name: str, x: cp.ndarray, out: cp.ndarray, size: int) -> Callable[[], None]:
    import torch
    dist = TORCH
    tx, tout = torch.from_dlpack(x), torch.from_dlpack(out)

    def call() -> None:
        if name == "allreduce":
            dist.all_reduce(tx)
        elif name == "allgather":
            dist.all_gather_into_tensor(tout, tx)
        elif name == "broadcast":
            dist.broadcast(tx, 0)
        elif name == "reducescatter":
            dist.reduce_scatter_tensor(tout[:tx.numel() // size], tx)
        else:
            dist.all_to_all_single(tout, tx)
        torch.cuda.synchronize()
    return call


def main() -> None:
    global TORCH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-mib", type=float, default=256)
    parser.add_argument("--collectives", default=",".join(COLLECTIVES),
                        help=f"comma-separated, from {', '.join(COLLECTIVES)}")
    parser.add_argument("--torch", action="store_true", help="also torch.distributed over NCCL")
    args = parser.parse_args()
    chosen = [c for c in args.collectives.split(",") if c]
    unknown = sorted(set(chosen) - set(COLLECTIVES))
    if unknown:
        parser.error(f"--collectives: unknown {', '.join(unknown)}; expected some of {', '.join(COLLECTIVES)}")
    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    raw = nccl.NcclCommunicator(size, uid, rank)
    stream = cp.cuda.Stream.null
    if args.torch:
        import torch
        import torch.distributed as dist
        if not torch.cuda.is_available():
            raise SystemExit("--torch: torch sees no CUDA device")
        address = comm.bcast(socket.gethostname() if rank == 0 else None, root=0)
        os.environ.setdefault("MASTER_ADDR", address)
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=rank, world_size=size)
        TORCH = dist
    if rank == 0:
        try:
            device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        except Exception as exc:          # the CPU stand-in has no device properties
            device = f"no device properties ({exc.__class__.__name__})"
        print(f"# {size} rank(s), {device}, NCCL {nccl.get_version()}, CuPy {cp.__version__}")
        peer = f" {'torch GB/s':>10} {'ratio':>6}" if TORCH else ""
        print(f"{'collective':>13} {'size':>9} | {'raw NCCL GB/s':>13} {'hpcvod GB/s':>12} {'ratio':>6}{peer} | "
              f"{'raw us':>8} {'hpcvod us':>9}")
    for name in chosen:
        factor = bus_factor(name, size)
        for nbytes in [s for s in SIZES if s <= args.max_mib * MIB]:
            count = max(size, nbytes // 4 // size * size)        # divisible by the ranks (scatter / alltoall)
            x = cp.ones(count, cp.float32)
            ours, raw_call, torch_fn = calls(name, x, raw, stream, size, rank)
            iterations = max(3, min(1000, int(0.2 / max(timed(comm, ours, 2), 1e-6))))
            raw_t, ours_t, torch_t = [], [], []
            for _ in range(args.rounds):
                raw_t.append(timed(comm, raw_call, iterations))
                ours_t.append(timed(comm, ours, iterations))
                if torch_fn is not None:
                    torch_t.append(timed(comm, torch_fn, iterations))
            r, o = statistics.median(raw_t), statistics.median(ours_t)
            if rank == 0:
                b = count * 4
                peer = ""
                if torch_t:
                    t = statistics.median(torch_t)
                    peer = f" {factor * b / t / 1e9:>10.2f} {t / o:>6.2f}"
                print(f"{name:>13} {b // KIB:>5} KiB | {factor * b / r / 1e9:>13.2f} {factor * b / o / 1e9:>12.2f} "
                      f"{r / o:>6.2f}{peer} | {r * 1e6:>8.1f} {o * 1e6:>9.1f}", flush=True)
    if TORCH is not None:
        TORCH.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
