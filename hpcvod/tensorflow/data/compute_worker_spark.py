"""The tf.data service compute job as a Spark barrier stage (Horovod's ``horovod.spark.tensorflow.compute_worker``).

    worker_py=$(python -c "import hpcvod.tensorflow.data.compute_worker_spark as w; print(w.__file__)")
    PYSPARK_PYTHON=$(command -v python) spark-submit --master "local[4]" "$worker_py" \\
        [--dispatchers N] [--dispatcher-side compute|training] [--timeout S] [--tasks T] CONFIG.json

or, on this machine only, ``python -m hpcvod.tensorflow.data.compute_worker_spark ...`` (master ``local[*]``).

One barrier task per compute rank (``--tasks``, default the context's default parallelism: N of ``local[N]``);
each runs the same ``serve`` as an MPI compute rank, its rank, size, barrier and all-gather taken from
``BarrierTaskContext``. The training job is unchanged (it reads CONFIG). The stage ends when the training side
calls ``config.shutdown()``; a task that dies fails the stage (Spark stops the other tasks, the heartbeat stops,
the training side ends with its clear line).
"""

from __future__ import annotations

import re
import sys
from typing import Callable, Iterator

from hpcvod.frameworks.tensorflow.compute_job import ComputeGroup, parse_args, parser, serve, split_error
from hpcvod.frameworks.tensorflow.data_service import DataServiceError

PROG = "spark-submit compute_worker_spark.py"
# Without these a stage with more barrier tasks than free slots waits for ever (docs/measured.md); with them Spark gives
# up after 3 checks, 1 s apart.
BARRIER_CHECK = {"spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
                 "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "3"}


def local_listeners() -> dict[str, str]:
    """Spark settings for ``local[N]``, where driver and executors are this one JVM: its RPC and block manager
    listen on the loopback interface only (Spark binds the host's address by default), with a fresh shared secret
    (other users of the node can reach loopback too), and no web UI (port 4040 on every interface, no login).
    A user's own setting of any of them wins; on a real Spark cluster they are the cluster's business."""
    import secrets

    return {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1", "spark.ui.enabled": "false",
            "spark.authenticate": "true", "spark.authenticate.secret": secrets.token_hex(32)}


def barrier_task(config_path: str, dispatchers: int, dispatcher_side: str,
                 timeout: int) -> Callable[[Iterator[int]], Iterator[int]]:
    """The function every barrier task runs (pickled to the executors by reference: this module)."""
    def task(_partition: Iterator[int]) -> Iterator[int]:
        from pyspark import BarrierTaskContext
        context = BarrierTaskContext.get()
        group = ComputeGroup(rank=context.partitionId(), size=len(context.getTaskInfos()),
                             barrier=context.barrier, allgather=lambda message: list(context.allGather(message)))
        serve(config_path, dispatchers, dispatcher_side, timeout, group)
        yield group.rank
    return task


def failure_line(exc: BaseException, tasks: int) -> str:
    """One line for a failed stage (Py4J wraps it in pages of Java stack)."""
    text = str(exc)
    if "BARRIER_JOB_SLOTS_NUMBER_CHECK_FAILED" in text or "BarrierJobSlotsNumberCheckFailed" in text:
        return (f"Spark cannot run {tasks} barrier tasks at once (fewer free task slots: use --tasks <= the N of "
                f"local[N], or more executor cores)")
    ours = re.search(r"DataServiceError: (.*)", text)
    if ours:
        return ours.group(1).strip()
    if "Python worker exited unexpectedly" in text:
        return "a barrier task's Python worker died (killed or crashed), so Spark failed the whole stage"
    aborted = re.search(r"Job aborted due to stage failure: (.*)", text)
    python = re.findall(r"^\w*(?:Error|Exception|Exit)\w*: .*$", text, re.MULTILINE)
    reason = (aborted.group(1) if aborted else python[-1] if python
              else (text.strip().splitlines() or ["(no message)"])[0])
    return f"the Spark compute job failed: {reason[:400]}"


def main(argv: list[str] | None = None) -> int:
    options = parser(PROG, "Run the tf.data service compute job as a Spark barrier stage (docs/frameworks.md).")
    options.add_argument("--tasks", type=int, default=None,
                         help="barrier tasks, one per compute rank (default: the default parallelism, N of local[N])")
    args = parse_args(options, argv)
    if args.tasks is not None and args.tasks < 1:
        options.error(f"--tasks {args.tasks}: expected a number of tasks >= 1")
    try:
        from pyspark import SparkConf, SparkContext
    except ImportError:
        print(f"hpcvod compute_worker_spark: pyspark is not installed in {sys.prefix} (pip install 'hpcvod[spark]')",
              file=sys.stderr, flush=True)
        return 2
    conf = SparkConf().setAppName("hpcvod tf.data service compute job")
    conf.setIfMissing("spark.master", "local[*]")    # `python -m ...` without spark-submit: this machine's cores
    for key, value in BARRIER_CHECK.items():
        conf.setIfMissing(key, value)
    if conf.get("spark.master", "local").startswith("local"):
        for key, value in local_listeners().items():
            conf.setIfMissing(key, value)
    # local mode: the tasks' Python is the driver's (it has hpcvod and TensorFlow) unless the user chose one
    conf.setIfMissing("spark.pyspark.python", sys.executable)
    conf.setIfMissing("spark.log.level", "WARN")
    context = SparkContext.getOrCreate(conf)
    tasks = args.tasks or context.defaultParallelism
    problem = split_error(tasks, args.dispatchers)
    if problem:
        print(f"hpcvod compute_worker_spark: {problem.replace('ranks', 'barrier tasks', 1)}", file=sys.stderr,
              flush=True)
        context.stop()
        return 2
    try:
        context.parallelize(range(tasks), tasks).barrier().mapPartitions(
            barrier_task(args.config, args.dispatchers, args.dispatcher_side, args.timeout)).collect()
    except DataServiceError as exc:
        print(f"hpcvod compute_worker_spark: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - Py4JJavaError and friends: one line instead of the Java stack
        print(f"hpcvod compute_worker_spark: {failure_line(exc, tasks)}", file=sys.stderr, flush=True)
        return 1
    finally:
        context.stop()
    print(f"hpcvod compute_worker_spark: {tasks} barrier tasks served until the training side was done", flush=True)
    return 0


if __name__ == "__main__":
    # spark-submit runs this file as __main__: take the functions from the module so that the tasks' pickles name
    # it (the executors import it) rather than carrying copies
    from hpcvod.tensorflow.data.compute_worker_spark import main as module_main
    sys.exit(module_main())
