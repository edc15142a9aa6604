"""hpcvod's framework-free allreduce runtime: ``import hpcvod.runtime as hvd``.

Horovod's API over NumPy arrays (anything NumPy can view without a copy: buffer protocol,
``__array_interface__``, DLPack), running over mpi4py with a background engine that negotiates by name,
caches responses and fuses small tensors. docs/runtime.md describes it; docs/contract.md lists the
environment settings. Importing this package does not initialise MPI; ``hvd.init()`` does.
"""

from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .context import (add_process_set, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                      gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                      mpi_enabled, mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built,
                      shutdown, size, start_timeline, stop_timeline)
from .errors import (HorovodInternalError, HpcvodConfigError, HpcvodError, HpcvodInputError,
                     HpcvodMismatchError, HpcvodNotInitializedError, HpcvodRankFailureError,
                     HpcvodShutdownError, HpcvodStallError, HpcvodWorldSizeError)
from .gpu import Bfloat16Words
from .process_sets import ProcessSet, global_process_set


def __getattr__(name: str):  # the collectives import mpi4py.MPI (which initialises MPI): load them lazily
    if name not in _COLLECTIVES:
        raise AttributeError(f"module 'hpcvod.runtime' has no attribute {name!r}")
    from .mpi_start import start_mpi
    start_mpi()              # MPI_Init under HPCVOD_INIT_TIMEOUT, when it comes before hvd.init()
    from . import collectives
    value = getattr(collectives, name)
    globals()[name] = value
    return value


_COLLECTIVES = (
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "Handle", "GroupHandle", "as_array",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async",
    "barrier", "join", "broadcast_object", "allgather_object", "poll", "synchronize",
)

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
    "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "nccl_built",
    "gloo_enabled", "gloo_built", "ccl_built", "cuda_built", "rocm_built", "ddl_built",
    "start_timeline", "stop_timeline", "Bfloat16Words", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "Compression", "Compressor", "NoneCompressor", "FP16Compressor",
    "HpcvodError", "HpcvodNotInitializedError", "HpcvodConfigError", "HpcvodInputError",
    "HpcvodWorldSizeError", "HpcvodMismatchError", "HpcvodRankFailureError", "HpcvodStallError",
    "HpcvodShutdownError", "HorovodInternalError", *_COLLECTIVES,
]
