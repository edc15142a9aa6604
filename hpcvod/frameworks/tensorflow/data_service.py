"""The TensorFlow data service compute job (Horovod's ``horovod.tensorflow.data``), coordinated through files.

A *compute job* (CPU-rich ranks) runs tf.data service dispatchers and workers; the *training job* pulls ready
batches from them. The two jobs meet in a config file on a shared path and a folder beside it (``CONFIG.d/``):

* ``CONFIG``: written atomically by the compute job's rank 0 once every server listens (with compute-side
  dispatchers, their addresses are in it): ``TfDataServiceConfig.read(path, wait_for_file_creation=True)``.
* ``CONFIG.d/dispatcher.<i>``: a training-side dispatcher's address (``dispatcher_side="training"``);
  ``CONFIG.d/worker.<i>.<rank>``: a compute rank's worker serving dispatcher i is registered;
  ``CONFIG.d/released.<i>``: training-side dispatcher i is about to stop, its workers stop first and answer with
  ``CONFIG.d/stopped.<i>.<rank>`` (a worker whose dispatcher is gone cannot stop while a task still asks it for
  splits: TensorFlow retries for about a minute);
  ``CONFIG.d/heartbeat``: touched every second by the compute job's rank 0 while it lives;
  ``CONFIG.d/shutdown``: the training side is done (``config.shutdown()``), the compute job stops cleanly;
  ``CONFIG.d/finished``: every compute rank has stopped its servers (what ``compute_client().shutdown()`` waits for).

``config.compute_client()`` is Horovod's ``ComputeClient`` (register/wait/shutdown) over that folder.

TensorFlow's own clients wait for ever on a dispatcher that died (docs/measured.md): a training process that uses the
service watches the heartbeat and ends its job with a clear line when the compute job is gone for ``timeout`` s.
Addresses are built from the host's IP, never ``localhost`` (consumers on another node would hang).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from hpcvod.support.safe_read import Refused, json_kind, load_json, read_bounded

HEARTBEAT_SECONDS = 1.0
DISPATCHER_SIDES = ("compute", "training")
CONFIG_LIMIT = 1 << 20   # one address per dispatcher: a few KiB even with a dispatcher per rank of a large job
CONFIG_DEPTH = 4         # an object holding a list of strings: 2 levels
MAX_COUNT = 1 << 20      # dispatchers, workers per dispatcher
MAX_TIMEOUT = 30 * 24 * 3600
_ADDRESS = re.compile(r"grpc://(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]):([0-9]{1,5})", re.ASCII)


def _whole(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _address(value: Any) -> bool:
    match = _ADDRESS.fullmatch(value) if isinstance(value, str) else None
    return match is not None and 1 <= int(match.group(1)) <= 65535


def shown_value(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


# key -> (check of its JSON value, what it must be): the one description of a config file's keys
CONFIG_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "dispatchers": (_whole(1, MAX_COUNT), f"a whole number of dispatchers from 1 to {MAX_COUNT}"),
    "workers_per_dispatcher": (_whole(1, MAX_COUNT), f"a whole number of workers from 1 to {MAX_COUNT}"),
    "dispatcher_side": (lambda v: v in DISPATCHER_SIDES, "one of " + ", ".join(f'"{s}"' for s in DISPATCHER_SIDES)),
    "addresses": (lambda v: isinstance(v, list) and all(map(_address, v)),
                  'a list of dispatcher addresses like "grpc://10.0.0.1:5050"'),
    "rendezvous": (lambda v: isinstance(v, str) and v != "" and "\0" not in v, "the path of the CONFIG.d folder"),
    "timeout": (_whole(1, MAX_TIMEOUT), f"a whole number of seconds from 1 to {MAX_TIMEOUT}"),
}
_REQUIRED_KEYS = ("dispatchers", "workers_per_dispatcher", "dispatcher_side", "rendezvous")


class DataServiceError(RuntimeError):
    """The data service cannot be used: a config that never appeared, a compute job that is gone."""


class ComputeSizeError(ValueError):
    """The compute job's size does not fit its dispatchers (Horovod raises ValueError for it)."""


def host_address() -> str:
    """This host's IP as other nodes reach it (the loopback address only when the name does not resolve)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _wait_for(path: Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise DataServiceError(f"{what}: {path} did not appear within {timeout:g} s")
        time.sleep(0.1)


@dataclasses.dataclass(frozen=True)
class TfDataServiceConfig:
    """What the training job needs to reach the compute job (Horovod's ``TfDataServiceConfig``)."""

    dispatchers: int
    workers_per_dispatcher: int
    dispatcher_side: str
    addresses: tuple[str, ...]      # compute-side dispatchers: "grpc://ip:port", by dispatcher index
    rendezvous: str                 # the CONFIG.d folder
    timeout: int = 60

    def to_dict(self) -> dict[str, Any]:
        return dict(dataclasses.asdict(self), addresses=list(self.addresses))

    @staticmethod
    def from_dict(config: Any, origin: str = "the data service config") -> "TfDataServiceConfig":
        """The config a dict describes, every key checked (type, range, choice); DataServiceError naming
        ``origin``, the key, what was expected and what it holds, in one line."""
        if not isinstance(config, dict):
            raise DataServiceError(f"{origin}: expected a JSON object, got a JSON {json_kind(config)}")
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise DataServiceError(f"{origin}: unknown key {shown_value(unknown[0])} (expected only "
                                   f"{', '.join(CONFIG_KEYS)})")
        missing = [key for key in _REQUIRED_KEYS if key not in config]
        if missing:
            raise DataServiceError(f"{origin}: {missing[0]}: missing (expected {CONFIG_KEYS[missing[0]][1]})")
        for key, (check, expected) in CONFIG_KEYS.items():
            if key in config and not check(config[key]):
                raise DataServiceError(f"{origin}: {key}: expected {expected}, got {shown_value(config[key])}")
        side, addresses = config["dispatcher_side"], tuple(config.get("addresses", ()))
        wanted = config["dispatchers"] if side == "compute" else 0
        if len(addresses) != wanted:
            raise DataServiceError(f"{origin}: addresses: expected {wanted} (one per dispatcher on the {side} side), "
                                   f"got {len(addresses)}")
        return TfDataServiceConfig(dispatchers=config["dispatchers"],
                                   workers_per_dispatcher=config["workers_per_dispatcher"], dispatcher_side=side,
                                   addresses=addresses, rendezvous=config["rendezvous"],
                                   timeout=config.get("timeout", 60))

    def write(self, filename: str) -> None:
        _write_atomically(Path(filename), json.dumps(self.to_dict()))

    @staticmethod
    def read(filename: str, wait_for_file_creation: bool = False,
             timeout: float | None = None) -> "TfDataServiceConfig":
        """The config at ``filename``; with ``wait_for_file_creation`` waits for the compute job to write it
        (at most ``timeout`` seconds, default 600; then DataServiceError naming the path). Read like a site
        profile: a regular file (no FIFO, device or symbolic link) of at most CONFIG_LIMIT bytes, JSON nested at
        most CONFIG_DEPTH deep with finite numbers, every key checked; DataServiceError, one line, otherwise."""
        path = Path(filename)
        if wait_for_file_creation:
            _wait_for(path, 600.0 if timeout is None else timeout, "the data service config")
        try:
            config = load_json(read_bounded(path, CONFIG_LIMIT, nofollow=True), CONFIG_DEPTH)
        except FileNotFoundError:
            raise DataServiceError(f"{path}: cannot read the data service config: no such file") from None
        except Refused as err:
            raise DataServiceError(f"{path}: cannot read the data service config: {err}") from None
        return TfDataServiceConfig.from_dict(config, str(path))

    # ---------------------------------------------------------------- the rendezvous folder
    @property
    def folder(self) -> Path:
        return Path(self.rendezvous)

    def shutdown(self) -> None:
        """Tells the compute job that training is done (it stops its servers and exits 0); returns at once
        (``compute_client().shutdown()`` also waits until the compute job has stopped)."""
        _write_atomically(self.folder / "shutdown", "done\n")

    def compute_client(self, verbose: int = 1) -> "ComputeClient":
        """Horovod's client of the compute job: register/wait for dispatchers and workers, shut the job down."""
        return ComputeClient(self, verbose)

    def dispatcher_address(self, index: int) -> str:
        """Dispatcher ``index``'s address, waiting for a training-side dispatcher to register it."""
        return self.compute_client().wait_for_dispatcher_registration(index, self.timeout)

    def wait_for_workers(self, index: int) -> None:
        """Until every compute worker of dispatcher ``index`` has registered."""
        self.compute_client().wait_for_dispatcher_worker_registration(index, self.timeout)

    def every_worker_marked(self, mark: str, index: int, give_up: Callable[[], bool] = lambda: False,
                            timeout: float | None = None) -> bool:
        """Whether every compute worker of dispatcher ``index`` left ``CONFIG.d/<mark>.<index>.<rank>`` within
        ``timeout`` s (default the config's; False once that passed, or ``give_up()`` says so)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(list(self.folder.glob(f"{mark}.{index}.*"))) < self.workers_per_dispatcher:
            if time.monotonic() > deadline or give_up():
                return False
            time.sleep(0.1)
        return True

    def compute_job_alive(self) -> bool:
        beat = self.folder / "heartbeat"
        try:
            return time.time() - beat.stat().st_mtime < self.timeout
        except OSError:
            return False


class ComputeClient:
    """Horovod's ``ComputeClient`` (``config.compute_client(verbose)``): the compute job's registrations and its
    shutdown, through the config's rendezvous folder. Every wait is bounded by its timeout (DataServiceError, one
    line); ``verbose`` is accepted for Horovod's signature (this client logs nothing)."""

    def __init__(self, config: TfDataServiceConfig, verbose: int = 1) -> None:
        self.config = config
        self.verbose = verbose

    def _index(self, dispatcher_id: int) -> int:
        if not _whole(0, self.config.dispatchers - 1)(dispatcher_id):
            raise ValueError(f"dispatcher_id: expected 0 to {self.config.dispatchers - 1} (the config has "
                             f"{self.config.dispatchers} dispatcher(s)), got {shown_value(dispatcher_id)}")
        return dispatcher_id

    def register_dispatcher(self, dispatcher_id: int, dispatcher_address: str) -> None:
        """A training-side dispatcher's address, for the compute workers and the other training ranks."""
        _write_atomically(self.config.folder / f"dispatcher.{self._index(dispatcher_id)}", f"{dispatcher_address}\n")

    def wait_for_dispatcher_registration(self, dispatcher_id: int, timeout: float) -> str:
        """Dispatcher ``dispatcher_id``'s address (a training-side one: once registered, ``timeout`` s at most)."""
        index = self._index(dispatcher_id)
        if self.config.dispatcher_side == "compute":
            return self.config.addresses[index]
        path = self.config.folder / f"dispatcher.{index}"
        _wait_for(path, timeout, f"training-side dispatcher {index}")
        return path.read_text().strip()

    def register_worker_for_dispatcher(self, dispatcher_id: int, worker_id: int) -> None:
        (self.config.folder / f"worker.{self._index(dispatcher_id)}.{int(worker_id)}").touch()

    def wait_for_dispatcher_worker_registration(self, dispatcher_id: int, timeout: float) -> None:
        """Until every compute worker of the dispatcher has registered (``timeout`` s at most)."""
        index = self._index(dispatcher_id)
        if not self.config.every_worker_marked("worker", index, timeout=timeout):
            raise DataServiceError(f"the workers of dispatcher {index} did not register in {self.config.folder} "
                                   f"within {timeout:g} s (is the compute job running?)")

    def shutdown(self) -> None:
        """Stops the compute job and waits until every compute rank has stopped its servers (the job then exits
        0); DataServiceError when the job is gone (no heartbeat for the config's timeout) or does not stop within
        it."""
        config = self.config
        if not config.compute_job_alive():
            raise DataServiceError(f"cannot shut down the tf.data service compute job: it is gone (no heartbeat in "
                                   f"{config.folder} for {config.timeout} s)")
        config.shutdown()
        try:
            _wait_for(config.folder / "finished", config.timeout, "the compute job's confirmation that it stopped")
        except DataServiceError as exc:
            raise DataServiceError(f"the tf.data service compute job did not stop after shutdown: {exc}") from None

    def wait_for_shutdown(self) -> None:
        """Until the training side has asked the compute job to stop (as Horovod's: no timeout)."""
        while not (self.config.folder / "shutdown").exists():
            time.sleep(0.1)


# ----------------------------------------------------------------------------------- training side
_watchers: dict[str, threading.Thread] = {}


def _watch_compute_job(config: TfDataServiceConfig) -> None:
    """Ends this training process's job when the compute job stops beating: TensorFlow's client would wait for
    ever on a dead dispatcher."""
    if config.rendezvous in _watchers:
        return

    def watch() -> None:
        while not (config.folder / "shutdown").exists():
            if not config.compute_job_alive():
                line = (f"hpcvod: the tf.data service compute job is gone (no heartbeat in {config.folder} for "
                        f"{config.timeout} s); ending the training job")
                _end_job(line)
            time.sleep(HEARTBEAT_SECONDS)

    thread = threading.Thread(target=watch, name="hpcvod-data-service-watch", daemon=True)
    _watchers[config.rendezvous] = thread
    thread.start()


def _end_job(line: str) -> None:
    import hpcvod.runtime as rt
    from hpcvod.runtime.mpi_start import abort_world
    if rt.is_initialized():
        from mpi4py import MPI
        abort_world(MPI.COMM_WORLD, line)
    print(line, file=sys.stderr, flush=True)
    os._exit(1)


@contextmanager
def tf_data_service(config: TfDataServiceConfig, rank: int) -> Iterator[str]:
    """The address of this training rank's dispatcher: one shared by every rank (``dispatchers=1``) or one per
    rank. With ``dispatcher_side="training"`` this rank (rank 0, or every rank with per-rank dispatchers) runs the
    dispatcher for as long as the block lasts."""
    import tensorflow as tf
    server = None
    index = rank if config.dispatchers > 1 else 0
    if config.dispatcher_side == "training" and (config.dispatchers > 1 or rank == 0):
        if (config.folder / f"released.{index}").exists():
            raise DataServiceError(f"training-side dispatcher {index} already ran its block and its compute workers "
                                   f"have stopped: one tf_data_service() block per dispatcher and compute job")
        server = tf.data.experimental.service.DispatchServer(
            tf.data.experimental.service.DispatcherConfig(port=0))
        port = server.target.rsplit(":", 1)[1]
        config.compute_client().register_dispatcher(index, f"grpc://{host_address()}:{port}")
    address = config.dispatcher_address(index)
    config.wait_for_workers(index)
    _watch_compute_job(config)
    try:
        yield address
    finally:
        if server is not None:
            _release_workers(config, index)
            server.stop()


def _release_workers(config: TfDataServiceConfig, index: int) -> None:
    """Has dispatcher ``index``'s compute workers stop while it still answers them, waiting for them ``timeout`` s
    at most (a compute job that is gone answers nothing: the dispatcher stops anyway)."""
    _write_atomically(config.folder / f"released.{index}", "released\n")
    config.every_worker_marked("stopped", index, give_up=lambda: not config.compute_job_alive())


def send_to_data_service(dataset: Any, config: TfDataServiceConfig, rank: int, size: int | None = None,
                         processing_mode: str = "distributed_epoch", reuse_dataset: bool = False,
                         round_robin: bool = False) -> Any:
    """``dataset`` processed by the compute job (Horovod's ``Dataset.send_to_data_service``): with
    ``reuse_dataset`` every rank of a dispatcher shares one job (``distributed_epoch``: each element reaches one
    rank once per epoch; ``round_robin``: rank ``rank`` of ``size`` consumers, needs ``.repeat()``)."""
    import tensorflow as tf
    if config.dispatcher_side == "training":
        raise RuntimeError("with dispatcher_side='training' use the tf_data_service(config, rank) context manager "
                           "(the dispatcher lives as long as it)")
    if round_robin and size is None:
        raise ValueError("round_robin needs size (the number of consuming ranks)")
    with tf_data_service(config, rank) as address:
        return dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=processing_mode, service=address, job_name="job" if reuse_dataset else None,
            consumer_index=rank if reuse_dataset and round_robin else None,
            num_consumers=size if reuse_dataset and round_robin else None))


def add_dataset_method() -> None:
    """``tf.data.Dataset.send_to_data_service`` (Horovod adds the same method)."""
    import tensorflow as tf
    tf.data.Dataset.send_to_data_service = send_to_data_service
