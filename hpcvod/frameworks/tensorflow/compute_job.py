"""The tf.data service compute job: each compute rank's dispatcher and worker (``serve``), over MPI ranks or the
tasks of a Spark barrier stage, and its command line (``python -m hpcvod.tensorflow.data.compute_worker``, or
Horovod's ``compute_worker.main(dispatchers, dispatcher_side, configfile, timeout)``). The training side, the
config and the client are in data_service.py (docs/data-service.md)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from hpcvod.frameworks.tensorflow.data_service import (CONFIG_KEYS, DISPATCHER_SIDES, HEARTBEAT_SECONDS,
                                                       ComputeSizeError, DataServiceError, TfDataServiceConfig,
                                                       host_address, shown_value)


@dataclasses.dataclass(frozen=True)
class ComputeGroup:
    """The compute job's ranks as one of them sees them: MPI ranks (hpcvod.runtime) or the tasks of a Spark barrier
    stage (``BarrierTaskContext``); ``serve`` needs nothing else from either."""

    rank: int
    size: int
    barrier: Callable[[], None]
    allgather: Callable[[str], list[str]]      # every rank's string, in rank order


def split_error(size: int, dispatchers: int) -> str | None:
    """Why ``size`` compute ranks cannot serve ``dispatchers`` dispatchers (None when they can)."""
    if dispatchers < 1 or size % dispatchers:
        return (f"{size} ranks cannot be split among {dispatchers} dispatcher(s): the size must be a multiple of "
                f"--dispatchers")
    return None


def serve(config_path: str, dispatchers: int, dispatcher_side: str, timeout: int, group: ComputeGroup) -> None:
    """One compute rank's part: its dispatcher (every size/dispatchers-th rank, compute side), its worker, the
    config and the heartbeat (rank 0); returns once the training side has called ``shutdown()`` and every rank has
    stopped its servers. Raises DataServiceError when the training-side dispatchers never register."""
    import tensorflow as tf
    rank, size = group.rank, group.size
    per = size // dispatchers
    index = rank // per
    path = Path(config_path)
    folder = path.with_name(path.name + ".d")
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.iterdir():          # a previous run's registrations and shutdown
            stale.unlink()
    group.barrier()
    ip = host_address()
    dispatcher = None
    if dispatcher_side == "compute" and rank % per == 0:
        dispatcher = tf.data.experimental.service.DispatchServer(
            tf.data.experimental.service.DispatcherConfig(port=0))
    mine = f"grpc://{ip}:{dispatcher.target.rsplit(':', 1)[1]}" if dispatcher is not None else ""
    addresses = tuple(a for a in group.allgather(mine) if a)
    config = TfDataServiceConfig(dispatchers=dispatchers, workers_per_dispatcher=per,
                                 dispatcher_side=dispatcher_side, addresses=addresses, rendezvous=str(folder),
                                 timeout=timeout)
    if rank == 0:
        (folder / "heartbeat").touch()
        if dispatcher_side == "training":
            config.write(str(path))              # the training side registers its dispatchers through it
    target = config.dispatcher_address(index).split("://", 1)[1]
    worker = tf.data.experimental.service.WorkerServer(tf.data.experimental.service.WorkerConfig(
        dispatcher_address=target, worker_address=f"{ip}:%port%", heartbeat_interval_ms=1000,
        dispatcher_timeout_ms=timeout * 1000))
    config.compute_client().register_worker_for_dispatcher(index, rank)
    group.barrier()                              # every server listens: the config may go out
    if rank == 0 and dispatcher_side == "compute":
        config.write(str(path))
    if rank == 0:
        # TensorFlow's servers take no credentials: say so where the user sees it, not only in the docs
        print(f"hpcvod compute_worker: warning: the tf.data service has no authentication: any process that can "
              f"reach its ports ({', '.join(addresses) or 'the training side'} and each worker's) can read this "
              f"job's data and run its own tf.data graphs in it, as you; use it only on a network you trust "
              f"(docs/data-service.md)", file=sys.stderr, flush=True)
    # DispatchServer.join() blocks in C++ (no signal handler would run): poll the markers instead
    released = folder / f"released.{index}"
    while not (folder / "shutdown").exists():
        if worker is not None and released.exists():   # stop before the training-side dispatcher does
            worker.stop()
            worker = None
            (folder / f"stopped.{index}.{rank}").touch()
        if rank == 0:
            (folder / "heartbeat").touch()
        time.sleep(HEARTBEAT_SECONDS)
    if worker is not None:
        worker.stop()
    if dispatcher is not None:
        dispatcher.stop()
    group.barrier()
    if rank == 0:
        (folder / "finished").touch()            # every rank's servers are down: compute_client().shutdown() returns


def serve_mpi_rank(config_path: str, dispatchers: int, dispatcher_side: str, timeout: int) -> None:
    """This MPI rank's part of the compute job (hpcvod.runtime started here if not yet); returns once the training
    side has called ``shutdown()``. ComputeSizeError when the size does not fit the dispatchers."""
    import hpcvod.runtime as rt
    rt.init()
    problem = split_error(rt.size(), dispatchers)
    if problem:
        raise ComputeSizeError(problem)
    group = ComputeGroup(rank=rt.rank(), size=rt.size(), barrier=rt.barrier, allgather=rt.allgather_object)
    serve(config_path, dispatchers, dispatcher_side, timeout, group)


def compute_worker(config_path: str, dispatchers: int, dispatcher_side: str, timeout: int) -> int:
    """Runs on every rank of an MPI compute job; returns once the training side has called ``shutdown()`` (0), or
    2 when the size does not fit the dispatchers."""
    try:
        serve_mpi_rank(config_path, dispatchers, dispatcher_side, timeout)
    except ComputeSizeError as exc:
        import hpcvod.runtime as rt
        if rt.rank() == 0:
            print(f"hpcvod compute_worker: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The compute worker's options, shared by the MPI and the Spark compute job."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--dispatchers", type=int, default=1, help="dispatchers (the size must be a multiple)")
    parser.add_argument("--dispatcher-side", choices=DISPATCHER_SIDES, default="compute")
    parser.add_argument("--timeout", type=int, default=60, help="seconds to wait for each other side")
    parser.add_argument("config", metavar="CONFIG.json", help="where to write the config (a shared path)")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.timeout < 1:
        parser.error(f"--timeout {args.timeout}: expected a number of seconds >= 1")
    return args


def main(dispatchers: int | list[str] | None = None, dispatcher_side: str = "compute",
         configfile: str | os.PathLike[str] | None = None, timeout: int = 60) -> int:
    """The compute job's entry point, two ways:

    * ``main(argv)`` / ``main()``: the command line (``python -m hpcvod.tensorflow.data.compute_worker``), exit
      status returned, errors as one line;
    * ``main(dispatchers, dispatcher_side, configfile, timeout)``: Horovod's signature, e.g. in a thread of a
      training process; returns 0 once ``config.compute_client().shutdown()`` was called; raises ValueError on a
      bad argument or a size that does not fit, DataServiceError when the other side never comes or when called
      in a thread before ``hvd.init()``."""
    if configfile is None and (dispatchers is None or isinstance(dispatchers, (list, tuple))):
        return command_line(None if dispatchers is None else list(dispatchers))
    given = {"dispatchers": dispatchers, "dispatcher_side": dispatcher_side, "timeout": timeout}
    for key, value in given.items():
        check, expected = CONFIG_KEYS[key]
        if not check(value):
            raise ValueError(f"compute_worker.main: {key}: expected {expected}, got {shown_value(value)}")
    if not isinstance(configfile, (str, os.PathLike)) or not str(configfile):
        raise ValueError(f"compute_worker.main: configfile: expected the path to write the config to, got "
                         f"{shown_value(configfile)}")
    import hpcvod.runtime as rt
    if threading.current_thread() is not threading.main_thread() and not rt.is_initialized():
        # the training's own hvd.init() would start MPI at the same time as this thread: MPI fails, or hangs
        raise DataServiceError("compute_worker.main in a thread: call hvd.init() in the main thread before starting "
                               "the thread (hpcvod's runtime is started once, by one thread)")
    serve_mpi_rank(os.fspath(configfile), dispatchers, dispatcher_side, timeout)   # type: ignore[arg-type]
    return 0


def command_line(argv: list[str] | None = None) -> int:
    """``python -m hpcvod.tensorflow.data.compute_worker [options] CONFIG.json``: its exit status."""
    args = parse_args(parser("python -m hpcvod.tensorflow.data.compute_worker",
                             "Run the tf.data service compute job on every rank (docs/frameworks.md)."), argv)
    try:
        return compute_worker(args.config, args.dispatchers, args.dispatcher_side, args.timeout)
    except DataServiceError as exc:
        print(f"hpcvod compute_worker: {exc}", file=sys.stderr, flush=True)
        return 1
