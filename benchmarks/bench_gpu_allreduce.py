"""Device-buffer allreduce: hpcvod over NCCL against raw CuPy NCCL on the same GPUs, in one invocation.

    mpiexec -n N python benchmarks/bench_gpu_allreduce.py [--rounds 5] [--max-mib 256]

Needs CuPy with NCCL and one GPU per rank (a single rank is allowed: NCCL then only runs its local copy path).
For float32 sizes from 4 KiB to 256 MiB it times, in interleaved rounds (medians), ``hvd.allreduce_(x)`` on a
CuPy array against ``NcclCommunicator.allReduce`` on the same buffer and stream, each call followed by a stream
synchronisation (as hvd.allreduce_ does before it returns). Bus bandwidth = 2(n-1)/n * bytes / time (with one
rank: bytes / time); "ratio" is hpcvod / raw.
"""

from __future__ import annotations

import argparse
import statistics

import cupy as cp
from cupy.cuda import nccl
from mpi4py import MPI

import hpcvod.runtime as hvd
from bench_allreduce import timed as host_timed   # benchmarks/ is the script's folder: on sys.path

KIB, MIB = 1024, 1024 * 1024
SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]


def timed(comm: MPI.Comm, fn, iterations: int) -> float:
    """bench_allreduce's timer after one warm-up call (every fn here synchronises its stream itself)."""
    fn()
    return host_timed(comm, fn, iterations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-mib", type=int, default=256)
    args = parser.parse_args()
    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    raw = nccl.NcclCommunicator(size, uid, rank)
    stream = cp.cuda.Stream.null
    if rank == 0:
        print(f"# {size} rank(s), {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
              f"NCCL {nccl.get_version()}, CuPy {cp.__version__}")
        print(f"{'size':>9} | {'raw NCCL GB/s':>13} {'hpcvod GB/s':>12} {'ratio':>6} | {'raw us':>8} {'hpcvod us':>9}")
    factor = 2 * (size - 1) / size if size > 1 else 1.0
    for nbytes in [s for s in SIZES if s <= args.max_mib * MIB]:
        x = cp.ones(nbytes // 4, cp.float32)

        def raw_call() -> None:
            raw.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
            stream.synchronize()

        def ours() -> None:
            hvd.allreduce_(x, name="bench", op=hvd.Sum)

        iterations = max(3, min(1000, int(0.2 / max(timed(comm, ours, 2), 1e-6))))
        raw_t, ours_t = [], []
        for _ in range(args.rounds):
            raw_t.append(timed(comm, raw_call, iterations))
            ours_t.append(timed(comm, ours, iterations))
        r, o = statistics.median(raw_t), statistics.median(ours_t)
        if rank == 0:
            print(f"{nbytes // KIB:>6} KiB | {factor * nbytes / r / 1e9:>13.2f} {factor * nbytes / o / 1e9:>12.2f} "
                  f"{r / o:>6.2f} | {r * 1e6:>8.1f} {o * 1e6:>9.1f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
