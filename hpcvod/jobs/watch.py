"""Watching jobs: the live status line of ``--wait``, ``hpcvod logs`` (one rank, following across requeues) and
``hpcvod jobs`` (every job folder, newest first, also after the scheduler has forgotten a job)."""

from __future__ import annotations

import codecs
import contextlib
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

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


def timing(status: JobStatus, running_since: float | None, now: float, time_limit: float | None = None) -> str:
    """What the live line adds: the expected start of a pending job (where the scheduler knows it), the time a
    running one has run (from the scheduler's start time, else since this wait first saw it running) and, given
    the job's walltime (``time_limit`` seconds, its --time), the time it has left."""
    if status.state == PENDING and status.start_time:
        return f"expected start {when(status.start_time)}"
    if status.state == RUNNING:
        since = status.start_time or running_since
        if since:
            text = f"running {clock(now - since)}"
            if time_limit:
                text += f", {clock(time_limit - (now - since))} left of {clock(time_limit)}"
            return text
    return ""


class Backoff:
    """How long to wait before the next question to the scheduler: ``first`` at the start and after a change,
    then half as long again each time nothing changed, up to ``most`` (a long job is asked rarely)."""

    def __init__(self, first: float, most: float) -> None:
        self.first = first
        self.most = max(most, first)
        self.delay: float | None = None

    def next(self, changed: bool) -> float:
        self.delay = self.first if changed or self.delay is None else min(self.most, self.delay * 1.5)
        return self.delay


def polling(ref: JobRef, scheduler: Any, poll_seconds: float | None = None) -> Backoff:
    """The job's Backoff: ``poll_seconds`` or the site's jobs.poll_interval or the scheduler's own to start with,
    up to the site's jobs.poll_max."""
    from hpcvod.jobs.submission import site_of
    from hpcvod.sites.profile import Jobs

    site = site_of(ref)
    jobs = site.profile.jobs if site is not None else Jobs()
    first = poll_seconds if poll_seconds is not None else jobs.poll_interval or scheduler.poll_seconds
    return Backoff(first, jobs.poll_max)


TICK_SECONDS = 1.0  # how often a live line is redrawn and a followed log read, between questions to the scheduler


def wait_for(ref: JobRef, stream: IO[str], poll_seconds: float | None = None,
             sleep: Callable[[float], None] = time.sleep, live: bool | None = None,
             follow: IO[str] | None = None, time_limit: float | None = None) -> JobStatus:
    """Poll until the job ends, less often while nothing changes (``polling``). On a terminal (``live``) one line
    rewritten in place every second: state, the scheduler's reason while pending, the expected start, time
    running (and left of ``time_limit``), time waited. Otherwise a plain line per change. With ``follow``, rank
    0's output is copied there as it comes, the live line drawn again below it (`submit --wait --follow`)."""
    from hpcvod.jobs.submission import scheduler_of

    scheduler = scheduler_of(ref)
    backoff = polling(ref, scheduler, poll_seconds)
    live = (hasattr(stream, "isatty") and stream.isatty()) if live is None else live
    tail = LogTail(ref.output, rank=0) if follow is not None and ref.output is not None else None
    start = time.monotonic()
    last = None
    running_since: float | None = None

    def copy_output(final: bool = False) -> bool:
        text = (tail.read() + (tail.rest() if final else "")) if tail is not None and follow is not None else ""
        if text and follow is not None:
            if live:
                stream.write("\r\x1b[K")  # the live line makes way for the output, then comes back below it
                stream.flush()
            follow.write(text)
            follow.flush()
        return bool(text)

    def draw(status: JobStatus) -> None:
        extra = timing(status, running_since, time.time(), time_limit)
        shown = "  ".join(p for p in (describe(ref, status), extra, f"waited {clock(time.monotonic() - start)}") if p)
        stream.write(f"\r\x1b[K{shown}")
        stream.flush()

    while True:
        status = scheduler.status(ref.job_id, ref.job_dir)
        if follow is not None or status.finished:  # kubernetes: the launcher pod's log into output.log
            scheduler.refresh_output(ref.job_id, ref.job_dir)
        if status.state == RUNNING and running_since is None:
            running_since = time.time()
        copy_output(final=status.finished)
        text = describe(ref, status)
        changed = text != last
        if live:
            draw(status)
        elif text != last:
            extra = timing(status, running_since, time.time(), time_limit)
            stream.write(f"{text}{'  ' + extra if extra and status.state == PENDING else ''}\n")
            stream.flush()
        last = text
        if status.finished:
            if live:
                stream.write("\n")
                stream.flush()
            return status
        delay = backoff.next(changed)
        if not live and tail is None:
            sleep(delay)
            continue
        waited = 0.0
        while waited < delay:  # between questions: the output as it comes, the live line's clocks
            step = min(TICK_SECONDS, delay - waited)
            sleep(step)
            waited += step
            copy_output()
            if live:
                draw(status)


@contextlib.contextmanager
def progress(stream: IO[str], text: str, tick: float = TICK_SECONDS,
             on_draw: Callable[[], None] | None = None) -> Iterator[None]:
    """A local step that may take a while (the job Python's MPI probe, the submit command): on a terminal, a line
    ``text... Ns`` redrawn every ``tick`` until the step is done, then wiped; elsewhere nothing (logs stay clean)."""
    if not (hasattr(stream, "isatty") and stream.isatty()):
        yield
        return
    done = threading.Event()
    start = time.monotonic()

    def draw() -> None:
        while True:
            stream.write("\r\x1b[K" + one_line(f"{text}... {clock(time.monotonic() - start)}"))
            stream.flush()
            if on_draw is not None:
                on_draw()
            if done.wait(tick):
                return

    drawer = threading.Thread(target=draw, name="hpcvod-progress", daemon=True)
    drawer.start()
    try:
        yield
    finally:
        done.set()
        drawer.join()
        stream.write("\r\x1b[K")
        stream.flush()


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


class LogTail:
    """The text a job's log gained since the last read (only rank ``rank``'s lines when given), decoded across
    reads; a log that was replaced or cut shorter is read again from its start, one not there yet reads empty."""

    def __init__(self, path: Path, rank: int | None = None) -> None:
        self.path = path
        self.position = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two reads
        self.keep: Callable[..., str] = _RankFilter(rank) if rank is not None else (lambda text, final=False: text)

    def read(self) -> str:
        return "".join(self.pieces())

    def pieces(self) -> Iterator[str]:
        """The new text one read at a time (a long log is never held whole)."""
        try:
            with open_job_file(self.path, "job output") as f:  # a FIFO, folder or link there: one line
                if f.seek(0, 2) < self.position:
                    self.position = 0
                    self.decoder.reset()
                f.seek(self.position)
                while chunk := f.read(READ_CHUNK):
                    self.position += len(chunk)
                    yield self.keep(self.decoder.decode(chunk))
        except FileNotFoundError:
            pass

    def rest(self) -> str:
        """What is left once the log is complete: a last line without its newline, whole."""
        return self.keep(self.decoder.decode(b"", final=True), final=True)


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

    tail = LogTail(path, rank)

    def copy() -> None:
        for piece in tail.pieces():
            out.write(piece)
        out.flush()

    if not follow:
        copy()
        out.write(tail.rest())
        out.flush()
        return
    scheduler = scheduler_of(ref)
    backoff = polling(ref, scheduler, poll_seconds)
    while True:
        finished = scheduler.status(ref.job_id, ref.job_dir).finished
        scheduler.refresh_output(ref.job_id, ref.job_dir)  # kubernetes: the launcher pod's log, fetched again
        copy()
        if finished:
            out.write(tail.rest())
            out.flush()
            return
        delay, waited = backoff.next(False), 0.0
        while waited < delay:  # the log is read every tick, the scheduler asked on the backoff's clock
            step = min(TICK_SECONDS, delay - waited)
            sleep(step)
            waited += step
            copy()


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


def job_rows(folders: Iterable[Path], now: float | None = None) -> list[JobRow]:
    """Each folder's row, in order. Each scheduler is asked once for all of its jobs (``Scheduler.statuses``:
    on Slurm one squeue and at most one sacct per listing, a finished job read from its folder's exit file); a
    folder hpcvod cannot read is a row saying why, never the end of the list."""
    from hpcvod.jobs.submission import job_status, scheduler_of

    now = time.time() if now is None else now
    refs: dict[Path, JobRef | UserError] = {}
    groups: dict[tuple[str, str | None], list[JobRef]] = {}  # the jobs of one scheduler with one site's options
    for folder in folders:
        try:
            ref = refs[folder] = ref_from_dir(folder)
            groups.setdefault((ref.scheduler, ref.site_source), []).append(ref)
        except UserError as err:
            refs[folder] = err
    found: dict[Path, JobStatus] = {}
    notes: dict[Path, str] = {}
    for group in groups.values():
        answers: dict[str, JobStatus] = {}
        failure: Exception | None = None
        try:
            answers = scheduler_of(group[0]).statuses([(ref.job_id, ref.job_dir) for ref in group])
        except Exception as err:  # the scheduler's commands are missing here, or failed: the folders still know
            failure = err
        for ref in group:
            folder = ref.job_dir  # type: ignore[assignment]
            try:
                if failure is not None:
                    raise failure
                found[folder] = job_status(ref, answers[ref.job_id])
            except Exception as err:
                from hpcvod.schedulers.base import status_from_exit_file

                found[folder] = status_from_exit_file(folder) or JobStatus("UNKNOWN")
                notes[folder] = " ".join(str(err).split())[:120]
    rows = []
    for folder, ref in refs.items():
        if isinstance(ref, UserError):
            rows.append(JobRow(folder.name, "", "", "", "BROKEN", "", None, None, str(folder), note=str(ref)))
        else:
            rows.append(_row(folder, ref, found[ref.job_dir], notes.get(ref.job_dir, ""), now))  # type: ignore[index]
    return rows


def job_row(folder: Path, now: float | None = None) -> JobRow:
    """One folder's row (job_rows of that folder alone)."""
    return job_rows([folder], now)[0]


def _row(folder: Path, ref: JobRef, status: JobStatus, note: str, now: float) -> JobRow:
    record = read_json(folder / RECORD_FILE)
    submitted = record.get("submitted") if isinstance(record.get("submitted"), str) else ""
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
