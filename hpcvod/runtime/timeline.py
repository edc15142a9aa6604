"""Chrome-trace timeline (HPCVOD_TIMELINE=path, or hvd.start_timeline(path)).

One row per tensor (a Chrome "thread" named after the tensor) with a complete ("X") event per phase:
NEGOTIATE (submitted -> every rank agreed), QUEUE (agreed -> its operation starts), MEMCPY_IN_FUSION_BUFFER,
the MPI operation (MPI_ALLREDUCE, MPI_BCAST, ...), MEMCPY_OUT_FUSION_BUFFER. The file is a JSON array that
chrome://tracing and https://ui.perfetto.dev open; it is a complete JSON document once the timeline stops
(``stop_timeline()``, ``shutdown()`` or process exit).

Rank 0 writes the timeline, like Horovod; a path containing ``{rank}`` makes every rank write its own file.
The file is created private (0600) in a folder that must exist. A timeline that cannot be written (a full disk,
``/dev/full``) is reported in one line on stderr and stops; the job goes on: a trace is never worth a training run.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Optional

from .errors import HpcvodInputError

NEGOTIATE = "NEGOTIATE"
QUEUE = "QUEUE"
MEMCPY_IN = "MEMCPY_IN_FUSION_BUFFER"
MEMCPY_OUT = "MEMCPY_OUT_FUSION_BUFFER"

_FLUSH_EVERY = 4096


class Timeline:
    """Collects timeline events in memory and appends them to the trace file in batches."""

    def __init__(self, path: str, rank: int, mark_cycles: bool = False) -> None:
        self.path = path
        self.rank = rank
        self.mark_cycles = mark_cycles
        self._origin = time.perf_counter()
        self._rows: dict[str, int] = {}
        self._events: list[tuple] = []
        self._lock = threading.Lock()
        self._first = True
        self.write_error: Optional[str] = None   # why the timeline stopped being written, once it did
        # the folder must exist (a typo in it is an error, not a new tree of folders); OSError goes to the caller
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self._file: Any = os.fdopen(fd, "w", encoding="utf-8")
        self._file.write("[\n")
        self._emit({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})

    # Recording is a list append (atomic under the GIL), so the engine's hot path stays cheap.
    def span(self, tensor: str, phase: str, start: float, end: float, args: Optional[dict] = None) -> None:
        self._events.append((tensor, phase, start, end, args))
        if len(self._events) >= _FLUSH_EVERY:
            self.flush()

    def spans(self, tensors: list[str], phase: str, start: float, end: float,
              args: Optional[dict] = None) -> None:
        for tensor in tensors:
            self._events.append((tensor, phase, start, end, args))
        if len(self._events) >= _FLUSH_EVERY:
            self.flush()

    def cycle_mark(self, when: float) -> None:
        if self.mark_cycles:
            self._events.append((None, "CYCLE_START", when, when, None))

    def _row(self, tensor: str) -> int:
        row = self._rows.get(tensor)
        if row is None:
            row = self._rows[tensor] = len(self._rows) + 1
            self._emit({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": row,
                        "args": {"name": tensor}})
            self._emit({"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": row,
                        "args": {"sort_index": row}})
        return row

    def _emit(self, event: dict[str, Any]) -> None:
        if self._file is None:
            return
        try:
            self._file.write(("" if self._first else ",\n") + json.dumps(event, separators=(",", ":")))
        except OSError as err:
            self._stop_writing(err)
        self._first = False

    def _stop_writing(self, err: OSError) -> None:
        """The file cannot be written: say so once and write no more (the job goes on)."""
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass   # the same error again, from the buffered rest
        if self.write_error is None:
            self.write_error = err.strerror or str(err)
            print(f"hpcvod: rank {self.rank}: cannot write the timeline {self.path} ({self.write_error}); it stops "
                  f"here and the file is incomplete; the job goes on", file=sys.stderr, flush=True)

    def flush(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            if self._file is None:
                return
            origin = self._origin
            for tensor, phase, start, end, args in events:
                ts = round((start - origin) * 1e6, 3)
                if tensor is None:
                    self._emit({"name": phase, "ph": "i", "s": "p", "pid": self.rank, "ts": ts})
                    continue
                event: dict[str, Any] = {"name": phase, "ph": "X", "pid": self.rank, "tid": self._row(tensor),
                                         "ts": ts, "dur": round(max(end - start, 0.0) * 1e6, 3)}
                if args:
                    event["args"] = args
                self._emit(event)
            if self._file is not None:
                try:
                    self._file.flush()
                except OSError as err:
                    self._stop_writing(err)

    def close(self) -> None:
        """Complete the JSON document; never raises (a write error is reported, see _stop_writing)."""
        self.flush()
        with self._lock:
            if self._file is not None:
                try:
                    self._file.write("\n]\n")
                    self._file.close()
                except OSError as err:
                    self._stop_writing(err)
                self._file = None


def open_timeline(path: str, rank: int, mark_cycles: bool = False) -> Optional[Timeline]:
    """The Timeline this rank should write for ``path`` (None where another rank writes it); HpcvodInputError,
    one line, when the file cannot be created (its folder must exist: none is created)."""
    if "{rank}" in path:
        path = path.replace("{rank}", str(rank))
    elif rank != 0:
        return None
    try:
        return Timeline(path, rank, mark_cycles)
    except FileNotFoundError:
        folder = os.path.dirname(os.path.abspath(path))
        why = f"its folder {folder} does not exist (create it first)"
    except (OSError, ValueError) as err:   # ValueError: a NUL in the path
        why = getattr(err, "strerror", None) or str(err)
    raise HpcvodInputError(f"rank {rank}: cannot write the timeline {path}: {why}")
