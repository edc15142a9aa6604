"""Chrome-trace timeline (HPCVOD_TIMELINE=path, or hvd.start_timeline(path)), laid out as Horovod lays out its own.

Horovod's layout (its horovod/common/timeline.cc), which tools written for Horovod's timelines read:

* a JSON array of Chrome trace events; process 0 is the header (``args``: this ``rank`` and
  ``start_time_since_epoch_in_micros``, the wall-clock time of ``ts`` 0);
* one Chrome *process* per tensor, named ``<op>.<name>`` (``allreduce.grad.w``, ``broadcast.weights``) like
  Horovod's PyTorch binding names its tensors; a name that already starts with ``<op>.`` (the
  DistributedOptimizer's ``allreduce.<parameter>``) is kept as it is;
* per operation, ``B``/``E`` pairs: ``NEGOTIATE_ALLREDUCE`` (submitted -> every rank agreed), then ``ALLREDUCE``
  (agreed -> done; ``E`` carries dtype and shape) with its activities inside: ``QUEUE``,
  ``MEMCPY_IN_FUSION_BUFFER``, the MPI call (``MPI_ALLREDUCE``, ``MPI_BCAST``, ...), ``MEMCPY_OUT_FUSION_BUFFER``;
* with ``HPCVOD_TIMELINE_MARK_CYCLES=1`` (or Horovod's ``HOROVOD_TIMELINE_MARK_CYCLES``) a global instant
  ``CYCLE_START`` per engine cycle.

Written while the job runs: the engine's thread only appends a record to a deque (no lock, no I/O); a writer
thread turns what has come into JSON every ``WRITE_EVERY`` seconds and writes it where the closing ``]`` was, ending
with a new ``]``, so the file is a complete JSON document after every write and can be opened mid-run
(chrome://tracing, https://ui.perfetto.dev, ``json.load``). At most ``MAX_PENDING`` records wait for the writer:
beyond that records are dropped, counted and reported once when the timeline stops (memory stays bounded and the
engine never waits for a disk).

Rank 0 writes the timeline, like Horovod; a path containing ``{rank}`` makes every rank write its own file.
The file is created private (0600) in a folder that must exist, never through a symbolic link at the path; an
existing file of ours is truncated and made private; one of another user, with other hard links, or that is not
a regular file is refused (a character device such as /dev/null is written as a stream). A timeline that cannot
be written (a full disk, ``/dev/full``) is reported in one line on stderr and stops; the job goes on: a trace is
never worth a training run.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import stat
import sys
import threading
import time
from typing import Any

from .errors import HpcvodInputError
from .handles import KIND_NAMES

NEGOTIATE = "NEGOTIATE"          # a negotiation whose operation the caller did not say (span(); tests)
QUEUE = "QUEUE"
MEMCPY_IN = "MEMCPY_IN_FUSION_BUFFER"
MEMCPY_OUT = "MEMCPY_OUT_FUSION_BUFFER"
CYCLE_START = "CYCLE_START"

WRITE_EVERY = 0.02               # seconds between the writer's appends: a file opened 0.1 s later has the event
MAX_PENDING = 1 << 18            # records waiting for the writer (a few tens of MB at most)
_CLOSING = b"\n]\n"

# record tags (the first field of a queued tuple)
_NEGOTIATED, _SPANS, _EXECUTED, _CYCLE = 0, 1, 2, 3


class _Refused(Exception):
    """The path exists and is not a file this timeline may write (the message says why)."""


def _open_private(path: str) -> int:
    """A write descriptor of ``path``: created 0600 (O_EXCL: never through a symbolic link or a file planted at
    the path), or an existing regular file of ours, made 0600 and truncated. O_NOFOLLOW: a symbolic link at
    the path is refused, never followed. OSError for the caller to word (a missing folder: FileNotFoundError)."""
    flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(3):   # the file may vanish between the two opens: then create it again
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        try:
            # O_NONBLOCK: a FIFO with no reader fails here instead of hanging init()
            fd = os.open(path, flags | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise _Refused("it is a symbolic link (not followed: name the file itself)") from None
            if err.errno == errno.ENXIO:
                raise _Refused("it is a FIFO, expected a regular file") from None
            raise
        try:
            st = os.fstat(fd)
            if stat.S_ISCHR(st.st_mode):   # /dev/null, /dev/full: a sink, nothing in it to keep private
                os.set_blocking(fd, True)
                return fd
            if not stat.S_ISREG(st.st_mode):
                raise _Refused("it exists and is not a regular file")
            if st.st_uid != os.geteuid():
                raise _Refused("it exists and belongs to another user")
            if st.st_nlink != 1:
                raise _Refused("it exists with other hard links to it")
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, 0)
            os.set_blocking(fd, True)
            return fd
        except BaseException:
            os.close(fd)
            raise
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


def row_label(name: str, kind: int | None) -> str:
    """Horovod's name of a tensor's row: ``<op>.<name>``, unless the name already starts with ``<op>.``."""
    op = KIND_NAMES.get(kind) if kind is not None else None
    if op is None or name.startswith(op + "."):
        return name
    return f"{op}.{name}"


class Timeline:
    """Records timeline events from the engine (cheaply) and writes them, as they come, from its own thread."""

    def __init__(self, path: str, rank: int, mark_cycles: bool = False) -> None:
        self.path = path
        self.rank = rank
        self.mark_cycles = mark_cycles
        self.write_error: str | None = None   # why the timeline stopped being written, once it did
        self.dropped = 0                         # records lost because the writer fell MAX_PENDING behind
        self._origin = time.perf_counter()
        self._owner_pid = os.getpid()   # a forked child (a data loader's worker) inherits this: it writes nothing
        epoch_micros = round((time.time() - (time.perf_counter() - self._origin)) * 1e6)
        self._fd: int | None = _open_private(path)   # OSError / _Refused go to the caller (open_timeline)
        self._positional = stat.S_ISREG(os.fstat(self._fd).st_mode)   # else a stream (a device): no ']' kept
        self._end = 0              # where the next write goes: over the closing ']' of the last one
        self._started = False
        self._pending: collections.deque[tuple] = collections.deque()
        self._lock = threading.Lock()          # one writer at a time (the thread, flush(), close())
        self._rows: dict[str, int] = {}        # row label -> its Chrome pid (1, 2, ...)
        self._pid_of: dict[str, int] = {}      # tensor name -> the pid of the row it was last negotiated in
        self._open: dict[str, tuple[int, Any]] = {}   # tensor name -> (pid, handle) of its running operation
        self._quoted: dict[str, str] = {}      # phase name -> its JSON string
        self._args_json: dict[tuple, str] = {}  # an event's args (as items) -> its ',"args":{...}'
        self._end_args: dict[tuple, str] = {}   # (dtype, shape) -> the args of an operation's end
        self._stop = threading.Event()
        self._write([self._event("process_name", "M", 0, {
            "name": f"rank {rank}", "rank": rank, "start_time_since_epoch_in_micros": epoch_micros}),
            self._event("process_sort_index", "M", 0, {"sort_index": 0})])
        self._thread = threading.Thread(target=self._writer, name="hpcvod-timeline", daemon=True)
        self._thread.start()

    # ---- recording: the engine's threads; each is one deque append ----------------------------------------
    def _record(self, record: tuple) -> None:
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append(record)

    def negotiated(self, handles: list[Any], start: float, end: float) -> None:
        """``handles`` (engine Handles; joined ranks' stand-ins are skipped) were agreed by every rank at ``end``
        after negotiating from ``start``: NEGOTIATE_<OP> ends and <OP> begins."""
        self._record((_NEGOTIATED, handles, start, end))

    def executed(self, handles: list[Any], end: float) -> None:
        """The operations of ``handles`` ended at ``end``: their <OP> span ends."""
        self._record((_EXECUTED, handles, end))

    def span(self, tensor: str, phase: str, start: float, end: float, args: dict | None = None) -> None:
        """An activity of ``tensor``'s operation (QUEUE, MPI_ALLREDUCE, ...) from ``start`` to ``end``."""
        self._record((_SPANS, (tensor,), phase, start, end, args))

    def spans(self, tensors: list[str], phase: str, start: float, end: float,
              args: dict | None = None) -> None:
        """The same activity for several tensors (one fused buffer)."""
        self._record((_SPANS, tensors, phase, start, end, args))

    def cycle_mark(self, when: float) -> None:
        if self.mark_cycles:
            self._record((_CYCLE, when))

    # ---- writing: the writer thread (or flush/close) -----------------------------------------------------
    def _writer(self) -> None:
        while not self._stop.wait(WRITE_EVERY):
            self.flush()

    def flush(self) -> None:
        """Write every record that has come so far (the writer thread does this every WRITE_EVERY seconds)."""
        with self._lock:
            pending = self._pending
            if not pending or os.getpid() != self._owner_pid:
                return
            out: list[str] = []
            for _ in range(len(pending)):   # what has come so far: a busy engine cannot keep this loop going
                self._format(pending.popleft(), out)
            if out:
                self._write(out)

    def _event(self, name: str, ph: str, pid: int, args: dict[str, Any]) -> str:
        """A metadata event (process names): rare, so plain json.dumps."""
        return json.dumps({"name": name, "ph": ph, "pid": pid, "args": args}, separators=(",", ":"))

    def _quote(self, name: str) -> str:
        quoted = self._quoted.get(name)
        if quoted is None:
            quoted = self._quoted[name] = json.dumps(name)
        return quoted

    def _args(self, args: Any) -> str:
        """``,"args":{...}`` for an event, cached: the same few dicts ({"bytes": n}, dtype and shape) recur."""
        try:
            key = tuple(args.items())
            text = self._args_json.get(key)
        except TypeError:   # an unhashable value: not cached
            key, text = None, None
        if text is None:
            text = ',"args":' + json.dumps(args, separators=(",", ":"), default=str)
            if key is not None:
                if len(self._args_json) >= 4096:
                    self._args_json.clear()
                self._args_json[key] = text
        return text

    def _row(self, label: str, out: list[str]) -> int:
        pid = self._rows.get(label)
        if pid is None:
            pid = self._rows[label] = len(self._rows) + 1
            out.append(self._event("process_name", "M", pid, {"name": label}))
            out.append(self._event("process_sort_index", "M", pid, {"sort_index": pid}))
        return pid

    def _format(self, record: tuple, out: list[str]) -> None:
        tag, origin, add = record[0], self._origin, out.append
        if tag == _SPANS:
            _, tensors, phase, start, end, args = record
            ts, te = round((start - origin) * 1e6, 3), round((max(end, start) - origin) * 1e6, 3)
            begin = '{"name":' + self._quote(phase) + f',"ph":"B","ts":{ts},"pid":'
            extra = (self._args(args) if args else "") + "}"
            for tensor in tensors:
                pid = self._pid_of.get(tensor)
                if pid is None:
                    pid = self._pid_of[tensor] = self._row(tensor, out)
                add(f"{begin}{pid}{extra}")
                add(f'{{"ph":"E","ts":{te},"pid":{pid}}}')
        elif tag == _NEGOTIATED:
            _, handles, start, end = record
            ts, te = round((start - origin) * 1e6, 3), round((max(end, start) - origin) * 1e6, 3)
            for h in handles:
                if h.dummy:
                    continue
                op = KIND_NAMES.get(h.kind, "collective").upper()
                pid = self._pid_of[h.name] = self._row(row_label(h.name, h.kind), out)
                if self._open.pop(h.name, None) is not None:   # the last one never ended (it failed): end it
                    add(f'{{"ph":"E","ts":{ts},"pid":{pid}}}')
                add(f'{{"name":"NEGOTIATE_{op}","ph":"B","ts":{ts},"pid":{pid}}}')
                add(f'{{"ph":"E","ts":{te},"pid":{pid}}}')
                add(f'{{"name":"{op}","ph":"B","ts":{te},"pid":{pid}}}')
                self._open[h.name] = (pid, h)
        elif tag == _EXECUTED:
            _, handles, end = record
            te = round((end - origin) * 1e6, 3)
            for h in handles:
                running = self._open.pop(h.name, None) if not h.dummy else None
                if running is None:
                    continue
                tensor = h.tensor
                extra = ""
                if tensor is not None and hasattr(tensor, "dtype"):   # Horovod's: the dtype, the shape as text
                    key = (tensor.dtype, tensor.shape)
                    extra = self._end_args.get(key)
                    if extra is None:
                        if len(self._end_args) >= 4096:
                            self._end_args.clear()
                        extra = self._end_args[key] = self._args({"dtype": str(key[0]), "shape": str(list(key[1]))})
                add(f'{{"ph":"E","ts":{te},"pid":{running[0]}{extra}}}')
        elif tag == _CYCLE:
            add(f'{{"name":"{CYCLE_START}","ph":"i","ts":{round((record[1] - origin) * 1e6, 3)},"pid":0,"s":"g"}}')

    def _write(self, events: list[str]) -> None:
        """Append ``events``; a regular file ends with ']' after every write (complete JSON at any moment)."""
        if self._fd is None:
            return
        body = ("[\n" if not self._started else ",\n") + ",\n".join(events)
        data = body.encode("utf-8", "backslashreplace")
        try:
            if self._positional:
                data += _CLOSING
                done = 0
                while done < len(data):
                    done += os.pwrite(self._fd, memoryview(data)[done:], self._end + done)
                self._end += len(data) - len(_CLOSING)
            else:
                done = 0
                while done < len(data):
                    done += os.write(self._fd, memoryview(data)[done:])
        except OSError as err:
            self._stop_writing(err)
        self._started = True

    def _stop_writing(self, err: OSError) -> None:
        """The file cannot be written: say so once and write no more (the job goes on)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        if self.write_error is None:
            self.write_error = err.strerror or str(err)
            print(f"hpcvod: rank {self.rank}: cannot write the timeline {self.path} ({self.write_error}); it stops "
                  f"here and the file is incomplete; the job goes on", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Write what is left and close the file (a complete JSON document); never raises (a write error is
        reported, see _stop_writing). Operations still running stay open (Chrome shows them unfinished)."""
        if os.getpid() != self._owner_pid:   # a forked child: the file and its offsets are the parent's
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self.flush()
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is None:
                return
            try:
                if not self._positional:
                    os.write(fd, _CLOSING)
                os.close(fd)
            except OSError as err:
                self._fd = fd
                self._stop_writing(err)
            if self.dropped:
                print(f"hpcvod: rank {self.rank}: the timeline {self.path} lacks {self.dropped} event(s): its "
                      f"writer fell more than {MAX_PENDING} behind", file=sys.stderr, flush=True)
                self.dropped = 0


def open_timeline(path: str, rank: int, mark_cycles: bool = False) -> Timeline | None:
    """The Timeline this rank should write for ``path`` (None where another rank writes it); HpcvodInputError,
    one line, when the file cannot be created (its folder must exist: none is created; a symbolic link, another
    user's file or a FIFO at the path is refused)."""
    if "{rank}" in path:
        path = path.replace("{rank}", str(rank))
    elif rank != 0:
        return None
    try:
        return Timeline(path, rank, mark_cycles)
    except FileNotFoundError:
        folder = os.path.dirname(os.path.abspath(path))
        why = f"its folder {folder} does not exist (create it first)"
    except _Refused as err:
        why = str(err)
    except (OSError, ValueError) as err:   # ValueError: a NUL in the path
        why = getattr(err, "strerror", None) or str(err)
    raise HpcvodInputError(f"rank {rank}: cannot write the timeline {path}: {why}")

