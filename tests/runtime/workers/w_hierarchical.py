"""The hierarchical allreduce algorithm over real MPI sub-communicators, against a flat MPI Allreduce.

Four ranks on one machine are split into "nodes" by an explicit node id (two layouts: ranks {0,1},{2,3} and the
interleaved {0,2},{1,3}); every op and several dtypes and lengths (shorter than, not divisible by, and
multiples of the local size) must give exactly what one flat Allreduce gives. Prints "HIERARCHICAL OK <n>".
"""

import sys

import numpy as np
from mpi4py import MPI

from hpcvod.runtime.hierarchical import MpiPrimitives, Topology, hierarchical_allreduce

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 4, size
checks = 0
# --nccl: also through runtime/nccl.py's NCCL primitives (on a GPU, or on the CPU stand-in of tests/runtime/cpu_cupy)
nccl_too = "--nccl" in sys.argv
if nccl_too:
    import cupy as cp
    from cupy.cuda import nccl

    from hpcvod.runtime.nccl import _NcclPrimitives
    from hpcvod.runtime.tables import NCCL_TYPES

    def nccl_over(c: MPI.Comm):
        uid = c.bcast(nccl.get_unique_id() if c.Get_rank() == 0 else None, root=0)
        return nccl.NcclCommunicator(c.Get_size(), uid, c.Get_rank())
for layout in (lambda r: r // 2, lambda r: r % 2):
    topo = Topology(comm, local_key=layout(rank))
    assert topo.usable and topo.local_size == 2 and topo.cross_size == 2, topo.why_not
    if nccl_too:
        nccl_comms = (nccl_over(topo.local), nccl_over(topo.cross), nccl_over(comm))
    for op_name, op in (("SUM", MPI.SUM), ("MIN", MPI.MIN), ("MAX", MPI.MAX), ("PROD", MPI.PROD)):
        for dtype in (np.float32, np.float64, np.int32, np.int64):
            for n in (0, 1, 2, 3, 5, 1001, 4096):
                rng = np.random.default_rng(1000 * rank + n)
                values = rng.integers(-3, 4, n) if op is MPI.PROD else rng.standard_normal(n) * 100
                mine = values.astype(dtype)
                want = np.empty_like(mine)
                t = MPI._typedict[np.dtype(dtype).char]
                comm.Allreduce([mine, t], [want, t], op)
                got = mine.copy()
                hierarchical_allreduce(got, op, topo.local, topo.local_size, topo.cross, comm, MpiPrimitives(t))
                # float sums in another order differ in the last bits (values are ~100: atol 1e-3)
                if not np.array_equal(got, want) and not np.allclose(got, want, rtol=1e-5, atol=1e-3):
                    raise AssertionError(f"rank {rank}: {op_name} {np.dtype(dtype)} n={n}: {got[:4]} != {want[:4]}")
                checks += 1
                if nccl_too:
                    dev = cp.asarray(mine.copy())
                    nccl_type = getattr(nccl, NCCL_TYPES[np.dtype(dtype).name])
                    nccl_op = getattr(nccl, f"NCCL_{op_name}")
                    local, cross, world = nccl_comms
                    hierarchical_allreduce(dev, nccl_op, local, topo.local_size, cross, world,
                                           _NcclPrimitives(cp, nccl_type, 0))
                    cp.cuda.Stream.null.synchronize()
                    got = cp.asnumpy(dev)
                    if not np.array_equal(got, want) and not np.allclose(got, want, rtol=1e-5, atol=1e-3):
                        raise AssertionError(f"rank {rank}: NCCL {op_name} {np.dtype(dtype)} n={n}: {got[:4]}")
                    checks += 1
    if nccl_too:
        for c in nccl_comms:
            c.destroy()
    topo.free()
uneven = Topology(comm, local_key=0 if rank == 0 else 1)       # a node of 1 rank beside a node of 3
assert not uneven.usable and uneven.why_not == "nodes have different numbers of ranks", uneven.why_not
uneven.free()
single = Topology(comm)                                        # the real machine: one node
assert not single.usable and single.why_not == "a single node", single.why_not
single.free()
if rank == 0:
    print(f"HIERARCHICAL OK {checks}", flush=True)
