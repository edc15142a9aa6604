"""hpcvod.tensorflow's GPU branch (tensors to the runtime through DLPack, bfloat16 as tagged int16 words, results
back through DLPack) on the CPU stand-in for CuPy and NCCL (tests/runtime/cpu_cupy): every tensor is declared to
be on a GPU, so the glue takes its device branch; the stand-in's "device" memory is host memory. It proves the
plumbing (dtypes, bitcasts, out-of-place forms, grouping), not CUDA. Prints "TF DEVICE GLUE OK <checks>"."""

import numpy as np
import tensorflow as tf

import hpcvod.tensorflow as hvd
from hpcvod.frameworks.tensorflow import bridge, functions, mpi_ops

bridge.on_gpu = mpi_ops.on_gpu = functions.on_gpu = lambda t: True   # every tensor takes the GPU branch
hvd.init()
rank, size = hvd.rank(), hvd.size()
checks = 0


def close(what: str, got: tf.Tensor, want, dtype: tf.DType, rtol: float = 1e-6) -> None:
    global checks
    assert got.dtype == dtype, f"rank {rank}: {what}: dtype {got.dtype}, expected {dtype}"
    values = tf.cast(got, tf.float64).numpy()
    if not np.allclose(values, want, rtol=rtol, atol=1e-6):
        raise AssertionError(f"rank {rank}: {what}: {values.ravel()[:4]} != {np.asarray(want).ravel()[:4]}")
    checks += 1


def bf16(values) -> tf.Tensor:
    return tf.cast(tf.constant(np.asarray(values, np.float32)), tf.bfloat16)


base = np.linspace(-2.0, 3.0, 257, dtype=np.float32)
rounded = [tf.cast(bf16(base * (r + 1)), tf.float64).numpy() for r in range(size)]
mine = bf16(base * (rank + 1))
# bfloat16 stays bfloat16 in eager mode on a GPU: the runtime sees BFLOAT16 words (NCCL's bfloat16 reduction)
close("bf16 allreduce Sum", hvd.allreduce(mine, op=hvd.Sum, name="glue.sum"), sum(rounded), tf.bfloat16, 2 ** -7)
close("bf16 allreduce Average", hvd.allreduce(mine, name="glue.avg"), sum(rounded) / size, tf.bfloat16, 2 ** -7)
outs = hvd.grouped_allreduce([mine, bf16(np.ones(5) * (rank + 1))], op=hvd.Sum, name="glue.grouped")
close("bf16 grouped 0", outs[0], sum(rounded), tf.bfloat16, 2 ** -7)
close("bf16 grouped 1", outs[1], np.full(5, size * (size + 1) / 2), tf.bfloat16)
close("bf16 broadcast", hvd.broadcast(mine, root_rank=size - 1, name="glue.bcast"), rounded[-1], tf.bfloat16)
close("bf16 allgather", hvd.allgather(bf16(np.full((2, 3), rank + 0.5)), name="glue.ag"),
      np.repeat(np.arange(size) + 0.5, 2)[:, None] * np.ones(3), tf.bfloat16)
close("bf16 reducescatter", hvd.reducescatter(bf16(np.ones((2 * size, 2)) * (rank + 1)), op=hvd.Sum,
                                              name="glue.rs"), np.full((2, 2), size * (size + 1) / 2), tf.bfloat16)
got = hvd.alltoall(bf16(np.repeat(np.arange(size, dtype=np.float32) + 10 * rank, 2)), name="glue.a2a")
close("bf16 alltoall", got, np.repeat(10.0 * np.arange(size) + rank, 2), tf.bfloat16)
# other dtypes: the tensor itself goes to the runtime (out of place), results come back as tensors of its dtype
close("float32 allreduce", hvd.allreduce(tf.fill([6], float(rank + 1)), op=hvd.Sum, name="glue.f32"),
      np.full(6, size * (size + 1) / 2), tf.float32)
close("int64 broadcast", hvd.broadcast(tf.fill([3], tf.constant(rank, tf.int64)), root_rank=0, name="glue.i64"),
      np.zeros(3), tf.int64)
v = [tf.Variable(tf.fill([4], float(rank))), tf.Variable(bf16(np.full(3, rank + 2.0)))]
hvd.broadcast_variables(v, root_rank=size - 1)
close("broadcast_variables float32", v[0], np.full(4, size - 1.0), tf.float32)
close("broadcast_variables bfloat16", v[1], np.full(3, size + 1.0), tf.bfloat16)


# inside a tf.function the device is unknown when the graph is built: bfloat16 is widened there (a cast)
@tf.function
def step(x):
    return hvd.allreduce(x, op=hvd.Sum, name="glue.graph")


close("bf16 allreduce in tf.function", step(mine), sum(rounded), tf.bfloat16, 2 ** -7)
print(f"TF DEVICE GLUE OK {checks}", flush=True)
