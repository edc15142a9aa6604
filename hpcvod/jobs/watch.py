"""Watching jobs: the live status line of ``--wait``, ``hpcvod logs`` (one rank, following across requeues) and
``hpcvod jobs`` (every job folder, newest first, also after the scheduler has forgotten a job)."""

from __future__ import annotations

import codecs
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable

from hpcvod.jobs.jobdir import RECORD_FILE, REQUEST_FILE, JobRef, default_roots, read_json, ref_from_dir
from hpcvod.launchers.label import LABELLED
from hpcvod.schedulers.base import EXIT_FILE, PENDING, RUNNING, JobStatus
from hpcvod.schedulers.jobfiles import open_job_file
from hpcvod.support.errors import UserError, one_line

_NO_REASON = ("", "None", "(null)")
_TASK_LOG = re.compile(r"output\.(\d+)\.log")  # an array task's log (schedulers.base.task_output_file)
READ_CHUNK = 1 << 20  # bytes per read of a log


def clock(seconds: float) -> str:
    """1:02:03 or 2:03 (minutes:seconds)."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def describe(ref: JobRef, status: JobStatus) -> str:
    """The state line without times: ``job 42: PENDING (Priority)``, ``job 42: FAILED (exit 3)``."""
    text = f"job {ref.job_id}: {status.state}"
    if status.exit_code is not None and status.finished:
        text += f" (exit {status.exit_code})"
    elif status.reason not in _NO_REASON and not status.finished:
        text += f" ({status.reason})"
    return one_line(text)


def timing(status: JobStatus, running_since: float | None, now: float) -> str:
    """What the live line adds: the expected start of a pending job (where the scheduler knows it), the time a
    running one has run (from the scheduler's start time, else since this wait first saw it running)."""
    if status.state == PENDING and status.start_time:
        return f"expected start {when(status.start_time)}"
    if status.state == RUNNING:
        since = status.start_time or running_since
        if since:
            return f"running {clock(now - since)}"
    return ""


def wait_for(ref: JobRef, stream: IO[str], poll_seconds: float | None = None,
             sleep: Callable[[float], None] = time.sleep, live: bool | None = None) -> JobStatus:
    """Poll until the job ends. On a terminal (``live``) one line rewritten in place: state, the scheduler's
    reason while pending, the expected start, time running, time waited. Otherwise a plain line per change."""
    from hpcvod.jobs.submission import scheduler_of

    scheduler = scheduler_of(ref)
    poll = poll_seconds if poll_seconds is not None else scheduler.poll_seconds
    live = (hasattr(stream, "isatty") and stream.isatty()) if live is None else live
    start = time.monotonic()
    last = None
    running_since: float | None = None
    while True:
        status = scheduler.status(ref.job_id, ref.job_dir)
        now = time.time()
        if status.state == RUNNING and running_since is None:
            running_since = now
        text = describe(ref, status)
        extra = timing(status, running_since, now)
        if live:
            shown = "  ".join(p for p in (text, extra, f"waited {clock(time.monotonic() - start)}") if p)
            stream.write(f"\r\x1b[K{shown}")
        elif text != last:
            stream.write(f"{text}{'  ' + extra if extra and status.state == PENDING else ''}\n")
        stream.flush()
        last = text
        if status.finished:
            if live:
                stream.write("\n")
                stream.flush()
            return status
        sleep(poll)


class _RankFilter:
    """Whole lines of one rank out of decoded text that may cut lines anywhere, in time linear in the text: a
    line is kept or dropped as soon as its label is known (the first characters of the line), so a long line
    without a newline is never held whole, nor copied again at every read."""

    def __init__(self, rank: int) -> None:
        self.rank = str(rank)
        self.label_length = len(f"[{rank}]<stdout>:")  # what decides whether a line is rank's
        self.head = ""  # the start of the current line while that is not decided
        self.keep: bool | None = None  # whether the current line is rank's (None: not known yet)

    def _decide(self) -> bool:
        return bool((m := LABELLED.match(self.head)) and m.group(1) == self.rank)

    def __call__(self, text: str, final: bool = False) -> str:
        kept: list[str] = []
        start = 0
        while start < len(text):
            end = text.find("\n", start)
            piece = text[start:] if end < 0 else text[start:end + 1]
            start += len(piece)
            if self.keep is None:
                self.head += piece  # at most a label's length plus one read: decided below
                if end < 0 and len(self.head) < self.label_length:
                    continue
                self.keep = self._decide()
                piece, self.head = self.head, ""
            if self.keep:
                kept.append(piece)
            if end >= 0:
                self.keep = None  # a new line starts
        if final:
            if self.keep is None and self.head:
                self.keep = self._decide()
                if self.keep:
                    kept.append(self.head)
            if self.keep:
                kept.append("\n")  # the last line, without a newline in the log: whole in the output
            self.head, self.keep = "", None
        return "".join(kept)


def log_files(ref: JobRef) -> list[tuple[int | None, Path]]:
    """The job's logs: its output.log, or, for an array job that has none, each task's output.<index>.log
    (index order; those that exist so far)."""
    if ref.job_dir is None:
        return []
    if ref.output is not None and ref.output.exists():
        return [(None, ref.output)]
    tasks = [(int(m.group(1)), path) for path in ref.job_dir.glob("output.*.log")
             if (m := _TASK_LOG.fullmatch(path.name))]
    return sorted(tasks) or [(None, ref.output)]  # type: ignore[list-item]


def follow_output(ref: JobRef, out: IO[str], poll_seconds: float | None = None, follow: bool = True,
                  sleep: Callable[[float], None] = time.sleep, rank: int | None = None,
                  path: Path | None = None) -> None:
    """Copy the job's output.log (or ``path``, an array task's log) to ``out`` (only rank ``rank``'s lines when
    given); with ``follow``, until the job has ended. A requeued Slurm job appends to the same log and is followed
    on through PENDING; a log that was replaced or cut shorter is read again from its start."""
    path = path or ref.output
    if path is None:
        return
    from hpcvod.jobs.submission import scheduler_of

    scheduler = scheduler_of(ref)
    poll = poll_seconds if poll_seconds is not None else min(scheduler.poll_seconds, 1.0)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two reads
    keep: Callable[..., str] = _RankFilter(rank) if rank is not None else (lambda text, final=False: text)
    position = 0
    while True:
        finished = not follow or scheduler.status(ref.job_id, ref.job_dir).finished
        try:
            with open_job_file(path, "job output") as f:  # a FIFO, folder or link there: one line
                if f.seek(0, 2) < position:
                    position = 0
                    decoder.reset()
                f.seek(position)
                while chunk := f.read(READ_CHUNK):
                    position += len(chunk)
                    out.write(keep(decoder.decode(chunk)))
        except FileNotFoundError:
            pass
        out.flush()
        if finished:
            out.write(keep(decoder.decode(b"", final=True), final=True))
            out.flush()
            return
        sleep(poll)


# ---- hpcvod jobs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    """One job folder as `hpcvod jobs` shows it."""

    name: str
    job_id: str
    site: str
    scheduler: str
    state: str
    submitted: str
    elapsed_seconds: int | None
    exit_code: int | None
    folder: str
    note: str = ""  # why the state is UNKNOWN / the folder unreadable

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "job_id": self.job_id, "site": self.site, "scheduler": self.scheduler,
                "state": self.state, "submitted": self.submitted, "elapsed_seconds": self.elapsed_seconds,
                "exit_code": self.exit_code, "folder": self.folder, "note": self.note}


def job_folders(roots: Iterable[Path] | None = None) -> list[Path]:
    """Every job folder under the roots (those holding a request.json), newest first."""
    found: dict[Path, float] = {}
    for root in (list(roots) if roots is not None else default_roots()):
        try:
            for request in root.glob(f"*/{REQUEST_FILE}"):
                folder = request.parent.resolve()
                found.setdefault(folder, request.stat().st_mtime)
        except OSError:
            continue
    return sorted(found, key=lambda folder: (found[folder], folder.name), reverse=True)


def _epoch(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return time.mktime(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def job_row(folder: Path, now: float | None = None) -> JobRow:
    """A folder's row: the scheduler asked where the job stands (the exit status file answers once it has
    forgotten it); a folder hpcvod cannot read is a row saying why, never the end of the list."""
    from hpcvod.jobs.submission import job_status

    now = time.time() if now is None else now
    try:
        ref = ref_from_dir(folder)
    except UserError as err:
        return JobRow(folder.name, "", "", "", "BROKEN", "", None, None, str(folder), note=str(err))
    record = read_json(folder / RECORD_FILE)
    submitted = record.get("submitted") if isinstance(record.get("submitted"), str) else ""
    note = ""
    try:
        status = job_status(ref)
    except Exception as err:  # the scheduler's commands are missing here, or failed: the folder still knows
        from hpcvod.schedulers.base import status_from_exit_file

        status = status_from_exit_file(folder) or JobStatus("UNKNOWN")
        note = " ".join(str(err).split())[:120]
    if status.state == "UNKNOWN" and status.reason:
        note = note or status.reason
    begin = status.start_time or _epoch(submitted)
    end = status.end_time if status.finished else None
    if status.finished and end is None:
        try:
            end = (folder / EXIT_FILE).stat().st_mtime
        except OSError:
            end = None
    elapsed = None
    if begin and status.state != PENDING and (end or not status.finished):
        elapsed = int(max(0, (end or now) - begin))
    return JobRow(name=folder.name, job_id=ref.job_id, site=ref.site, scheduler=ref.scheduler, state=status.state,
                  submitted=submitted, elapsed_seconds=elapsed, exit_code=status.exit_code, folder=str(folder),
                  note=note)


def format_rows(rows: list[JobRow]) -> list[str]:
    """A table: NAME ID SITE STATE SUBMITTED ELAPSED EXIT, one job per line, newest first."""
    table = [("NAME", "ID", "SITE", "STATE", "SUBMITTED", "ELAPSED", "EXIT")]
    for row in rows:  # what a job folder says is shown escaped: no terminal escape, no row split in two
        table.append(tuple(one_line(cell) for cell in (
            row.name, row.job_id or "-", row.site or "-", row.state, row.submitted.replace("T", " ")[:16] or "-",
            clock(row.elapsed_seconds) if row.elapsed_seconds is not None else "-",
            str(row.exit_code) if row.exit_code is not None else "-")))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    lines += [one_line(f"{row.name}: {row.note}") for row in rows if row.note]
    return lines
