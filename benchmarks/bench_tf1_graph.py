"""TF1 graph mode at size: what a session.run of hpcvod allreduces costs as the graph grows (issue 29 item 5).

    .venv/bin/python benchmarks/bench_tf1_graph.py [--sizes 50,100,200] [--compare GIT_REV]

On 2 ranks, a ``tf.compat.v1`` graph of N unnamed allreduces (1024 float32 each) is evaluated piece by piece (one
``session.run`` per op, N runs: the first time, which includes TensorFlow building an executor for each new fetch,
itself proportional to the graph's size, and again) and all at once (one run fetching all N ops). The time per op
is printed for each N; piece by piece (again) it stays flat when each op runs only what it depends on. ``--compare`` runs the same worker
on the hpcvod of another commit (e.g. one whose graph ops were chained to each other, where running op i also
ran ops 0..i-1, so piece by piece cost grew with N) and prints both side by side.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib.metadata import version
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic_driver import RESULT_TAG, ROOT, launch  # noqa: E402


def worker(args: argparse.Namespace) -> None:
    import json

    import numpy as np
    import tensorflow as tf

    import hpcvod.tensorflow as hvd

    hvd.init()
    tf.compat.v1.disable_eager_execution()
    result: dict[str, dict[str, float]] = {}
    for n in (int(s) for s in args.sizes.split(",")):
        graph = tf.Graph()
        with graph.as_default():
            ops = [hvd.allreduce(tf.constant(np.full(1024, i, np.float32)), op=hvd.Sum) for i in range(n)]
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(ops)                                   # warm-up: every kernel created once
            hvd.barrier()
            start = time.perf_counter()
            for op in ops:                                     # first fetch of each op: TensorFlow builds (and
                session.run(op)                                # caches) an executor for it, O(graph) each
            first = (time.perf_counter() - start) / n
            hvd.barrier()
            start = time.perf_counter()
            for op in ops:                                     # again: what each op itself costs
                session.run(op)
            piece = (time.perf_counter() - start) / n
            hvd.barrier()
            start = time.perf_counter()
            for _ in range(args.repeats):
                values = session.run(ops)
            together = (time.perf_counter() - start) / (n * args.repeats)
            assert all(float(v[0]) == i * hvd.size() for i, v in enumerate(values)), "wrong sums"
        result[str(n)] = {"first_ms": first * 1e3, "piece_ms": piece * 1e3, "together_ms": together * 1e3}
    if hvd.rank() == 0:
        print(RESULT_TAG + json.dumps(result), flush=True)
    hvd.shutdown()


def checkout(rev: str, into: Path) -> Path:
    """``hpcvod/`` of commit ``rev`` extracted under ``into`` (the working tree is left alone)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "hpcvod"], capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def driver(args: argparse.Namespace) -> None:
    worker_args = ["--sizes", args.sizes, "--repeats", str(args.repeats)]
    columns = {"this tree": launch(__file__, "hpcvod", 2, worker_args)}
    if args.compare:
        with tempfile.TemporaryDirectory() as tmp:
            columns[args.compare] = launch(__file__, "hpcvod", 2, worker_args, root=checkout(args.compare, Path(tmp)))
    print(f"\nmachine: {platform.node()}, {os.cpu_count()} cores, tensorflow {version('tensorflow_cpu')}, 2 ranks, "
          f"1024 float32 per allreduce; ms per op")
    print(f"{'':>5s}" + "".join(f" | {c:^39s}" for c in columns))
    print(f"{'ops':>5s}" + " | first fetch piece by piece  all at once" * len(columns))
    for n in args.sizes.split(","):
        print(f"{n:>5s}" + "".join(f" | {r[n]['first_ms']:11.2f} {r[n]['piece_ms']:14.2f} {r[n]['together_ms']:12.3f}"
                                   for r in columns.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,100,200", help="graph sizes (allreduces per graph)")
    parser.add_argument("--repeats", type=int, default=5, help="all-at-once runs per size")
    parser.add_argument("--compare", metavar="GIT_REV", help="also run the hpcvod of this commit")
    parser.add_argument("--worker", choices=["hpcvod"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
