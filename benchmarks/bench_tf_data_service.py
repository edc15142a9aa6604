"""The tf.data service compute job against the same pipeline run locally, in one invocation.

    .venv/bin/python benchmarks/bench_tf_data_service.py [--compute-ranks 2] [--elements 2000] [--rounds 3]
        [--engine mpi|spark]

A CPU-heavy pure-TF map (a few matrix products per element, as an augmentation would cost) feeds a consumer that
counts batches: in interleaved rounds (medians) the pipeline runs in the consumer's own process ("local") and
in a compute job of ``--compute-ranks`` ranks started with the MPICH wheel's ``mpiexec`` (``python -m
hpcvod.tensorflow.data.compute_worker``; ``--engine spark``: ``spark-submit --master local[N]
compute_worker_spark.py``, pyspark and Java needed), the consumer pulling with ``distributed_epoch``. It
prints elements/s of both and their ratio. The win needs cores the consumer does not use (CPU nodes); on a 2-core
machine everything shares the same two cores and the service can only lose (docs/measured.md: 0.58x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def pipeline(tf, elements: int):
    def heavy(x):
        m = tf.reshape(tf.cast(tf.range(64 * 64), tf.float32) * tf.cast(x + 1, tf.float32) * 1e-6, (64, 64))
        for _ in range(6):
            m = tf.linalg.matmul(m, m) * 0.5
        return tf.reduce_sum(m)
    return tf.data.Dataset.range(elements).map(heavy).batch(32)


def rate(dataset) -> float:
    start, count = time.perf_counter(), 0
    for batch in dataset:
        count += int(batch.shape[0])
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute-ranks", type=int, default=2)
    parser.add_argument("--elements", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", choices=["mpi", "spark"], default="mpi", help="what runs the compute job")
    args = parser.parse_args()
    import tensorflow as tf

    from hpcvod.tensorflow.data.compute_service import TfDataServiceConfig, tf_data_service
    folder = Path(tempfile.mkdtemp(prefix="bench-data-service-"))
    config_path = folder / "service.json"
    if args.engine == "mpi":
        argv = [str(MPIEXEC), "-n", str(args.compute_ranks), sys.executable, "-m",
                "hpcvod.tensorflow.data.compute_worker", str(config_path)]
    else:
        import hpcvod.tensorflow.data.compute_worker_spark as spark_worker
        argv = [str(Path(sys.executable).parent / "spark-submit"), "--master", f"local[{args.compute_ranks}]",
                spark_worker.__file__, str(config_path)]
    compute = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    try:
        config = TfDataServiceConfig.read(str(config_path), wait_for_file_creation=True, timeout=120)
        local, service = [], []
        with tf_data_service(config, 0) as address:
            for r in range(args.rounds):
                local.append(rate(pipeline(tf, args.elements)))
                service.append(rate(pipeline(tf, args.elements).apply(tf.data.experimental.service.distribute(
                    processing_mode="distributed_epoch", service=address, job_name=f"bench{r}"))))
        config.shutdown()
        compute.wait(timeout=60)
    finally:
        if compute.poll() is None:
            compute.kill()
    lo, se = statistics.median(local), statistics.median(service)
    print(f"machine: {os.uname().nodename}, {os.cpu_count()} cores, TensorFlow {tf.__version__}; "
          f"{args.elements} elements, medians of {args.rounds} interleaved rounds")
    print(f"local pipeline:                         {lo:10.1f} elements/s")
    print(f"through the service ({args.compute_ranks} compute ranks, {args.engine}): {se:10.1f} elements/s   "
          f"= {se / lo:.2f}x local")


if __name__ == "__main__":
    main()
