"""A world torn down and built again in one process: ROUNDS times init over a new communicator, collectives,
shutdown; after each shutdown the world holds no MPI communicator or request, and the threads, file descriptors
and memory of the process come back to where they were.

Usage: w_rebuild.py [ROUNDS]. Prints "REBUILT OK <rounds>" per rank, or fails with an assertion.
"""

import gc
import os
import sys
import threading

import numpy as np
from mpi4py import MPI

import hpcvod.runtime as hvd
from hpcvod.runtime import context

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
WARM_UP = 3              # rounds before the memory baseline (allocator pools, first-use caches)
# Under Open MPI the RSS of a healthy run swings by +-16 MiB from round to round (malloc's mmap threshold and
# Open MPI's memory hooks, with no trend over 60 rounds), so growth is the lowest RSS of the last five rounds
# above the highest of the five after the warm-up. One world kept per round would add more than 8 MiB each
# (its fusion buffer): over 100 MiB here.
RSS_GROWTH_KIB = 32 * 1024
world = MPI.COMM_WORLD
me, n = world.Get_rank(), world.Get_size()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate())


def collectives(round_: int, expected_rank: int) -> None:
    r = hvd.rank()
    assert (r, hvd.size()) == (expected_rank, n), (r, hvd.size(), expected_rank)
    total = n * (n - 1) / 2
    out = hvd.allreduce(np.full(1000, float(r)), op=hvd.Sum, name="grad")
    assert np.all(out == total), out[:4]
    assert np.all(hvd.allreduce(np.full(3, float(r)), op=hvd.Sum) == total)          # unnamed
    big = [np.full(256 * 1024, float(r + k), np.float32) for k in range(8)]          # 1 MiB each: fused
    handles = [hvd.allreduce_async(t, op=hvd.Sum, name=f"burst.{k}") for k, t in enumerate(big)]
    for k, h in enumerate(handles):
        assert np.all(hvd.synchronize(h) == total + n * k)
    root = hvd.broadcast(np.arange(10) + r, root_rank=n - 1, name="bcast")
    assert np.all(root == np.arange(10) + n - 1), root
    gathered = hvd.allgather(np.full((r + 1, 2), r))
    assert gathered.shape == (n * (n + 1) // 2, 2)
    ps = hvd.add_process_set([0]) if round_ % 3 == 0 else None    # a process set of its own, now and then
    if ps is not None and ps.included():
        assert np.all(hvd.allreduce(np.ones(4), process_set=ps) == 1)
    hvd.barrier()


seen: list[tuple[list[str], int, int]] = []
for round_ in range(ROUNDS):
    # a new communicator each round: a duplicate, or a split that reverses the ranks
    reverse = round_ % 2 == 1
    comm = world.Split(0, n - 1 - me) if reverse else world.Dup()
    hvd.init(comm=comm)
    live = context.runtime()
    collectives(round_, n - 1 - me if reverse else me)
    hvd.shutdown()
    assert not hvd.is_initialized()
    held = live.mpi_handles()
    assert not held, f"round {round_}: the world still holds {held}"
    del live
    comm.Free()
    # what the next init() does first: the previous world's channel hears rank 0's last word and closes
    # (on a rank other than 0 it stays open until then, to hear how the world ended)
    context._end_previous_world()
    gc.collect()
    seen.append((threads(), open_fds(), rss_kib()))

first_threads, first_fds, _ = seen[0]
assert first_threads == ["MainThread"], first_threads
for round_, (names, fds, _) in enumerate(seen):
    assert names == first_threads, f"round {round_}: threads {names}, after round 0 {first_threads}"
    assert fds == first_fds, f"round {round_}: {fds} open file descriptors, after round 0 {first_fds}"
rss = [kib for _, _, kib in seen]
growth = min(rss[-5:]) - max(rss[WARM_UP:WARM_UP + 5])
assert growth < RSS_GROWTH_KIB, f"RSS grew by {growth} KiB after the warm-up, RSS per round (KiB): {rss}"
print(f"REBUILT OK {ROUNDS} rank {me}: threads {first_threads}, {first_fds} fds, RSS growth {growth} KiB "
      f"after warm-up", flush=True)
