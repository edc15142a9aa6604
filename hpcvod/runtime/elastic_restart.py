"""Elastic training by restarting the world: the mode for MPIs without ULFM (MPICH, Intel MPI) and for losing a
whole node (docs/elastic.md, "Restarting the world").

The elastic driver (hpcvod/launchers/elastic_driver.py) starts each world as one launch (``mpiexec``, ``srun``) and
sets ``HPCVOD_ELASTIC_RESTART=GENERATION`` (0 for the first world) and ``HPCVOD_ELASTIC_STATE_DIR``, a folder on
node-local storage. Inside ``hvd.elastic.run``:

* **commit()** writes the committed state (every rank holds the same) to ``STATE_DIR/HOST/state`` from one rank per
  host (local rank 0), before ``commit`` returns: the node-local copy is never older than the last commit of a
  host whose ranks are alive. Written to a temporary file then renamed, so a rank killed while writing leaves the
  previous commit whole. Only this user can read it (folders 0700, file 0600; a folder someone else owns is
  refused in one line).
* **A rank that dies** ends its world as any hpcvod job does (the others get an error, never a hang); each rank
  that saw it tells the driver (``{"op": "bye", "why": "peer"}``) before it exits, so that the driver blacklists
  only the hosts whose ranks went silent or failed, and starts the next world on the rest.
* **A host change** (``HostsUpdatedInterrupt``) makes every rank save the state as it is (Horovod carries it over
  uncommitted too), write it, say ``restart`` and exit with :data:`EXIT_RESTART`.
* **The next world** (generation > 0) finds the newest copy among its hosts' folders (each holder's commit
  serial, gathered), broadcasts it from its holder, loads it on every rank and runs the reset callbacks: the
  training function starts again from the last commit, as after a ULFM reset.

Only the standard library and the runtime: this runs on every rank and must not import the submission side.
"""

from __future__ import annotations

import os
import pickle
import stat
import sys
from typing import Any

from .elastic_link import RESTART_VARIABLE
from .errors import HpcvodConfigError

GENERATION_VARIABLE = RESTART_VARIABLE
STATE_DIR_VARIABLE = "HPCVOD_ELASTIC_STATE_DIR"
EXIT_RESTART = 76          # every rank of a world that ends for a host change: the driver starts the next one
STATE_FILE = "state"
_FORMAT = 1


def generation() -> int | None:
    """The world's generation under a restarting driver (0: the first world); None in any other job."""
    text = os.environ.get(GENERATION_VARIABLE)
    if not text:
        return None
    if not text.isdigit():
        raise HpcvodConfigError(f"{GENERATION_VARIABLE}={text!r}: expected a generation number from 0 (set by the "
                                f"elastic driver, docs/elastic.md)")
    return int(text)


def _host_folder(host: str) -> str:
    """This host's folder in the state folder, made (0700) and checked to be this user's alone."""
    root = os.environ.get(STATE_DIR_VARIABLE)
    if not root:
        raise HpcvodConfigError(f"{GENERATION_VARIABLE} is set but {STATE_DIR_VARIABLE} is not: the elastic driver "
                                f"sets both (docs/elastic.md)")
    if host in (".", "..") or "/" in host or "\0" in host:
        raise HpcvodConfigError(f"elastic: host name {host!r} cannot name a folder of the state (a host name has no "
                                f"'/' and is not '.' or '..')")
    folder = os.path.join(root, host or "host")
    for path in (root, folder):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise HpcvodConfigError(f"{STATE_DIR_VARIABLE}: {path} is not a folder of this user's that only they "
                                    f"can read (owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)}); the "
                                    f"elastic state is not written where others could read it")
    return folder


class StateStore:
    """The node-local copy of one ``State``'s commits (one per process; writes from the host's local rank 0)."""

    def __init__(self, host: str, local_rank: int) -> None:
        self.folder = _host_folder(host)
        self.path = os.path.join(self.folder, STATE_FILE)
        self.writer = local_rank == 0
        self.serial = 0            # commits since the job started, carried across worlds

    def write(self, state: Any) -> None:
        """Count a commit and, on the host's writer, put ``state``'s committed copy on node-local storage."""
        self.serial += 1
        if not self.writer:
            return
        try:
            parts = _encode({"format": _FORMAT, "serial": self.serial, "state": state._snapshot()})
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise HpcvodConfigError(f"elastic: commit(): the state cannot be written for a restarted world: "
                                    f"{type(exc).__name__}: {exc} (keep picklable values in the state)") from None
        temporary = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for part in parts:
                view = memoryview(part).cast("B")
                while view:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(temporary, self.path)

    def read(self) -> tuple[int, bytes | None]:
        """(serial, bytes) of this host's copy; (-1, None) when there is none or it is not whole."""
        if not self.writer:
            return -1, None
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            serial = _decode(data)["serial"]
        except FileNotFoundError:
            return -1, None
        except Exception as exc:   # a copy that cannot be read is no copy: say so, another host may hold one
            print(f"hpcvod: elastic: {self.path}: unreadable committed state ({type(exc).__name__}); not used",
                  file=sys.stderr, flush=True)
            return -1, None
        return int(serial), data

    def remove(self) -> None:
        """The job's training finished: the copy is no longer needed on this host."""
        if self.writer:
            for remove, path in ((os.unlink, self.path), (os.rmdir, self.folder),
                                 (os.rmdir, os.path.dirname(self.folder))):
                try:
                    remove(path)
                except OSError:   # gone already, or another host's folder is still in it
                    pass


def _encode(record: dict) -> list[Any]:
    """The pieces of the state file: a length and the pickle (protocol 5), then each large array's bytes as they
    are in memory (pickle's out-of-band buffers: no copy of a model's arrays before the write)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(record, protocol=5, buffer_callback=buffers.append)
    sizes = [buffer.raw().nbytes for buffer in buffers]
    index = pickle.dumps((len(head), sizes), protocol=5)
    return [len(index).to_bytes(8, "little"), index, head, *(buffer.raw() for buffer in buffers)]


def _decode(data: bytes) -> dict:
    """A state file's record (what :func:`_encode` wrote); the arrays are views of ``data``."""
    view = memoryview(data)
    size = int.from_bytes(view[:8], "little")
    head_size, sizes = pickle.loads(view[8:8 + size])
    at = 8 + size + head_size
    buffers = []
    for nbytes in sizes:
        buffers.append(view[at:at + nbytes])
        at += nbytes
    if at != len(data):
        raise ValueError(f"{len(data) - at} bytes too many or few for the record's arrays")
    return pickle.loads(view[8 + size:8 + size + head_size], buffers=buffers)


def resume(state: Any, store: StateStore, rank: int) -> int:
    """Collective over the new world: load the newest committed state any host kept into ``state`` on every rank.
    Returns its serial (-1: no host kept one, ``state`` is as the program built it)."""
    from . import collectives   # here: importing it loads mpi4py.MPI, and importing elastic must not start MPI
    serial, data = store.read()
    held = collectives.allgather_object((serial, rank), name="hpcvod.elastic.restart.serials")
    best, holder = max(held, key=lambda item: (item[0], -item[1]))
    if best < 0:
        return -1
    data = collectives.broadcast_object(data if rank == holder else None, root_rank=holder,
                                        name="hpcvod.elastic.restart.state")
    saved = _decode(data)
    if saved.get("format") != _FORMAT:
        raise HpcvodConfigError(f"elastic: the committed state kept by rank {holder} has format "
                                f"{saved.get('format')!r}, expected {_FORMAT} (written by another hpcvod version)")
    state._load_snapshot(saved["state"])
    state.restore()
    store.serial = best
    return best
