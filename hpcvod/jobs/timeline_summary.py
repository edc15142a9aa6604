"""``hpcvod timeline summary FILE...``: what a timeline says about why a step is slow, without chrome://tracing.

Reads the Chrome-trace timeline the runtime writes (``HPCVOD_TIMELINE``, ``hpcvod run --timeline-filename``;
docs/runtime.md), and Horovod's. The file format is the contract: this module does not import ``hpcvod.runtime``.
Two layouts are read:

* Horovod's (hpcvod's since issue 29; its header, process 0, has ``start_time_since_epoch_in_micros`` and,
  written by hpcvod, the ``rank``): one process per tensor (``process_name`` metadata: ``allreduce.grad.w``) and
  ``B``/``E`` pairs, matched per process: NEGOTIATE_<OP>, then the operation (ALLREDUCE, ..., the outermost
  span) with its activities inside (QUEUE, MEMCPY_IN/OUT_FUSION_BUFFER, MPI_ALLREDUCE, ...). Horovod's zero-length
  complete events inside a negotiation (one per rank ready) are not phases.
* hpcvod's earlier one: ``thread_name`` metadata (a ``tid``'s tensor name) and complete events (``"ph": "X"``,
  ``pid`` = rank) named NEGOTIATE, QUEUE, MEMCPY_IN/OUT_FUSION_BUFFER or the operation itself (MPI_ALLREDUCE, ...).

``ts``/``dur`` are microseconds. Each rank's ``ts`` counts from that rank's own timeline start, so ranks are compared
by durations, never by the clock.

A timeline cut off mid-run (a job killed before ``shutdown()``) is read up to its last complete event. Anything
that is not a timeline (another file, a FIFO, a symlink, too large, nested beyond reason) is one line and exit 2.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from hpcvod.support.errors import UserError
from hpcvod.support.files import open_regular

NEGOTIATE, QUEUE, MEMCPY, TRANSFER = "negotiate", "queue", "memcpy", "transfer"
PHASES = (NEGOTIATE, QUEUE, MEMCPY, TRANSFER)
PHASE_OF = {"NEGOTIATE": NEGOTIATE, "QUEUE": QUEUE, "MEMCPY_IN_FUSION_BUFFER": MEMCPY,
            "MEMCPY_OUT_FUSION_BUFFER": MEMCPY}   # every other activity is the transfer itself
HEADER_KEY = "start_time_since_epoch_in_micros"   # in process 0's args: Horovod's layout
MAX_DEPTH = 64                   # open B spans per row: deeper is not a timeline either writer wrote
DEFAULT_MAX_MIB = 256
MAX_EVENT_CHARS = 1 << 20        # one event larger than this is not one the runtime wrote
CHUNK_BYTES = 1 << 20
MAX_RANKS = 1 << 16
MAX_NAME = 120                   # characters of a tensor name shown
MAX_INTERVALS = 1 << 20          # per rank and phase before they are merged in place (bounded memory)
MAX_DRAWN_RANKS = 32


@dataclass
class TensorTotals:
    """One tensor's time in each phase, summed over its calls and ranks (microseconds)."""

    name: str
    operations: set[str] = field(default_factory=set)
    calls: int = 0
    ranks: set[int] = field(default_factory=set)
    micros: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    longest_negotiation: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.micros.values())


@dataclass
class RankTotals:
    """One rank's events and, per phase, the intervals it spent there (overlaps merged when measured)."""

    rank: int
    events: int = 0
    first: float = math.inf
    last: float = -math.inf
    intervals: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: {p: [] for p in PHASES})

    def add(self, phase: str, start: float, end: float) -> None:
        self.events += 1
        self.first, self.last = min(self.first, start), max(self.last, end)
        spans = self.intervals[phase]
        spans.append((start, end))
        if len(spans) >= MAX_INTERVALS:
            spans[:] = merged(spans)

    def busy(self, phase: str | None = None) -> float:
        """Microseconds in ``phase`` (or in any phase) counted once: the tensors of one fused buffer share a span,
        and many tensors negotiate in the same cycle."""
        spans = self.intervals[phase] if phase else [s for p in PHASES for s in self.intervals[p]]
        return sum(end - start for start, end in merged(spans))


@dataclass
class Stall:
    rank: int
    tensor: str
    start: float
    micros: float


@dataclass
class Summary:
    files: list[str]
    stall_micros: float
    tensors: dict[str, TensorTotals] = field(default_factory=dict)
    ranks: dict[int, RankTotals] = field(default_factory=dict)
    stalls: list[Stall] = field(default_factory=list)
    ignored: int = 0             # JSON values that are not events this summary reads
    notes: list[str] = field(default_factory=list)   # a file cut off mid-run, ...


def merged(spans: list[tuple[float, float]], gap: float = 0.0) -> list[tuple[float, float]]:
    """The union of intervals, sorted; intervals closer than ``gap`` are joined."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1] + gap:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


# ---- reading -----------------------------------------------------------------------------------------------


def _open(path: str) -> Any:
    """The file opened for reading if it is a regular file (not a link, FIFO or device)."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):  # open_regular refuses it too (O_NOFOLLOW): this names why
            raise UserError(f"{path}: is a symbolic link: expected the timeline file itself (links are not followed)")
        return open_regular(Path(path), "a timeline", nofollow=True)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file: expected a timeline (HPCVOD_TIMELINE's file)") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read a timeline ({err.strerror or err})") from None


def read_events(path: str, max_bytes: int, notes: list[str]) -> Iterator[Any]:
    """The JSON values of ``path``'s top-level array, one at a time, read in chunks: memory stays at one chunk
    plus one event. An array with no end (a timeline cut off mid-run) ends at its last complete value, with a
    note saying so."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise UserError(f"{path}: {size / 2**20:.0f} MiB is more than the {max_bytes / 2**20:g} MiB limit "
                            f"(--max-mib raises it)")
        decoder = json.JSONDecoder()
        text = codecs.getincrementaldecoder("utf-8")()
        buf, pos, seen, started, eof, count = "", 0, 0, False, False, 0
        while True:
            if not eof and len(buf) - pos < MAX_EVENT_CHARS:
                try:
                    chunk = f.read(CHUNK_BYTES)
                except OSError as err:
                    raise UserError(f"{path}: cannot read a timeline ({err.strerror or err})") from None
                seen += len(chunk)
                if seen > max_bytes:   # grown since the check above
                    raise UserError(f"{path}: more than the {max_bytes / 2**20:g} MiB limit (--max-mib raises it)")
                eof = not chunk
                try:
                    buf = buf[pos:] + text.decode(chunk, final=eof)
                except UnicodeDecodeError:
                    raise UserError(f"{path}: not a timeline: not UTF-8 text (near byte {seen - len(chunk)})") \
                        from None
                pos = 0
            while pos < len(buf) and (buf[pos].isspace() or (started and buf[pos] == ",")):
                pos += 1
            if pos >= len(buf):
                if eof:
                    break
                continue
            if not started:
                if buf[pos] != "[":
                    what = "a JSON object" if buf[pos] == "{" else repr(buf[pos:pos + 20])
                    raise UserError(f"{path}: not a timeline: it starts with {what}, expected the JSON array of "
                                    f"Chrome trace events that HPCVOD_TIMELINE writes")
                started, pos = True, pos + 1
                continue
            if buf[pos] == "]":
                return
            try:
                value, pos = decoder.raw_decode(buf, pos)
            except RecursionError:
                raise UserError(f"{path}: not a timeline: value {count + 1} is nested too deep") from None
            except ValueError as err:
                if not eof and len(buf) - pos < MAX_EVENT_CHARS:
                    continue              # the value goes on in the next chunk
                if not eof:
                    raise UserError(f"{path}: not a timeline: value {count + 1} is not JSON or is larger than "
                                    f"{MAX_EVENT_CHARS >> 20} MiB ({err.msg})") from None
                if count == 0:
                    raise UserError(f"{path}: not a timeline: its first value is not JSON ({err.msg})") from None
                notes.append(f"{path}: ends inside value {count + 1} (a timeline cut off mid-run?): summarised the "
                             f"{count} complete values before it")
                return
            count += 1
            yield value
        if started and count:
            notes.append(f"{path}: the event array has no end (the timeline was not stopped: cut off mid-run?): "
                         f"summarised its {count} events")
        elif not started:
            raise UserError(f"{path}: not a timeline: the file is empty")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


@dataclass
class Span:
    """One phase of one tensor's operation on one rank (microseconds on that rank's clock)."""

    rank: int
    tensor: str
    name: str                    # NEGOTIATE_ALLREDUCE, QUEUE, MPI_ALLREDUCE, ALLREDUCE, ...
    start: float
    end: float
    args: dict[str, Any]
    operation: bool = False      # the outermost span of an operation (Horovod's layout): it holds the phases
    horovod: bool = False        # from a file in Horovod's layout: its calls are its operation spans


@dataclass
class Tally:
    """What a file's values came to besides its spans."""

    events: int = 0              # metadata and spans read
    ignored: int = 0             # values that are not events this summary reads


def spans_of(path: str, values: Iterable[Any], tally: Tally) -> Iterator[Span]:
    """The spans of one timeline file, in either layout (the module docstring); B/E pairs matched per row."""
    horovod = False
    rank = 0                                   # Horovod's layout: the file's rank (its header says; Horovod: 0)
    names: dict[tuple[int, int], str] = {}     # earlier layout: (pid, tid) -> tensor; Horovod's: (pid, 0)
    open_spans: dict[int, list[tuple[str, float, dict[str, Any]]]] = {}
    for index, event in enumerate(values):
        if not (isinstance(event, dict) and isinstance(event.get("ph"), str)):
            if index == 0:
                raise UserError(f"{path}: not a timeline: its first value is not a Chrome trace event "
                                f"(an object with \"ph\")")
            tally.ignored += 1
            continue
        ph, pid, tid = event["ph"], event.get("pid"), event.get("tid")
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if ph == "M":
            tally.events += 1
            label = args.get("name")
            if event.get("name") == "process_name" and pid == 0 and HEADER_KEY in args:
                horovod = True
                rank = args["rank"] if _is_id(args.get("rank")) else 0
            elif event.get("name") == "process_name" and horovod and _is_id(pid) and isinstance(label, str):
                names[(pid, 0)] = label
            elif event.get("name") == "thread_name" and isinstance(label, str) and _is_id(pid) and _is_id(tid):
                names[(pid, tid)] = label
            continue
        start, name = _number(event.get("ts")), event.get("name")
        if ph == "B" and _is_id(pid) and start is not None and isinstance(name, str):
            stack = open_spans.setdefault(pid, [])
            if len(stack) >= MAX_DEPTH:
                raise UserError(f"{path}: not a timeline: more than {MAX_DEPTH} spans open in row {pid}")
            stack.append((name, start, args))
            continue
        if ph == "E" and _is_id(pid) and start is not None and open_spans.get(pid):
            name, begun, begun_args = open_spans[pid].pop()
            if start < begun:
                tally.ignored += 1
                continue
            tally.events += 1
            tensor = names.get((pid, 0), f"(process {pid})")
            yield Span(rank, tensor, name, begun, start, {**begun_args, **args},
                       operation=not open_spans[pid] and not name.startswith("NEGOTIATE"), horovod=horovod)
            continue
        dur = _number(event.get("dur"))
        if ph == "X" and horovod and dur == 0:   # Horovod: a rank became ready during a negotiation
            tally.events += 1
            continue
        if ph != "X" or not _is_id(pid) or start is None or dur is None or dur < 0 or not isinstance(name, str):
            tally.ignored += int(ph not in ("i", "I"))   # instants: cycle marks, nothing to add
            continue
        tally.events += 1
        tensor = names.get((pid, tid), f"(row {tid})") if _is_id(tid) else "(no row)"
        yield Span(pid, tensor, name, start, start + dur, args)


def _phase(name: str) -> str:
    return NEGOTIATE if name.startswith("NEGOTIATE") else PHASE_OF.get(name, TRANSFER)


def summarise(paths: list[str], stall_micros: float, max_bytes: int) -> Summary:
    """Every file's spans added up by tensor and by rank; negotiations of ``stall_micros`` or more are stalls.
    An operation's calls are its outermost spans where the file has them (Horovod's layout), else its
    transfers."""
    summary = Summary(files=paths, stall_micros=stall_micros)
    for path in paths:
        tally = Tally()
        for span in spans_of(path, read_events(path, max_bytes, summary.notes), tally):
            rank = summary.ranks.get(span.rank)
            if rank is None:
                if len(summary.ranks) >= MAX_RANKS:
                    raise UserError(f"{path}: not a timeline: more than {MAX_RANKS} ranks (pid values)")
                rank = summary.ranks[span.rank] = RankTotals(span.rank)
            tensor = summary.tensors.get(span.tensor)
            if tensor is None:
                tensor = summary.tensors[span.tensor] = TensorTotals(span.tensor)
            tensor.ranks.add(span.rank)
            dur = span.end - span.start
            if span.operation:   # it holds the phases: counted as a call, its time is theirs
                rank.events += 1
                tensor.calls += 1
                continue
            phase = _phase(span.name)
            rank.add(phase, span.start, span.end)
            tensor.micros[phase] += dur
            if phase == TRANSFER:
                tensor.calls += not span.horovod
                tensor.operations.add(span.name[:40])
            if phase == NEGOTIATE:
                tensor.longest_negotiation = max(tensor.longest_negotiation, dur)
                if dur >= stall_micros:
                    summary.stalls.append(Stall(span.rank, span.tensor, span.start, dur))
        summary.ignored += tally.ignored
        if not tally.events:
            raise UserError(f"{path}: not a timeline: no Chrome trace events in it")
    return summary


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


# ---- text --------------------------------------------------------------------------------------------------


def _columns(rows: list[tuple[str, ...]], right: int = 1) -> list[str]:
    """Aligned columns; every column from ``right`` on is right-aligned (numbers)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i >= right else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths)))
            .rstrip() for r in rows]


def _short(name: str) -> str:
    name = "".join(c if c.isprintable() else "?" for c in name)  # a name from the file: no terminal escapes
    return name if len(name) <= MAX_NAME else name[:MAX_NAME - 3] + "..."


def _ms(micros: float) -> str:
    return f"{micros / 1e3:.1f}"


def top_tensors(summary: Summary, top: int) -> list[TensorTotals]:
    return sorted(summary.tensors.values(), key=lambda t: (-t.total, t.name))[:top]


def render_text(summary: Summary, top: int, stall_micros: float) -> str:
    """The three tables: top collectives by time, time per rank (negotiation against transfer), stalls."""
    ranks = sorted(summary.ranks.values(), key=lambda r: r.rank)
    out = [f"timeline of {len(ranks)} rank(s) from {len(summary.files)} file(s): "
           + ", ".join(_short(f) for f in summary.files), ""]
    tensors = top_tensors(summary, top)
    out.append(f"top {len(tensors)} of {len(summary.tensors)} collectives by time (ms, summed over calls and ranks; "
               f"the tensors of a fused buffer each count its whole transfer)")
    out += _columns([("TENSOR", "OPERATION", "CALLS", "RANKS", "NEGOTIATE", "QUEUE", "MEMCPY", "TRANSFER", "TOTAL",
                      "LONGEST WAIT")]
                    + [(_short(t.name), ",".join(sorted(t.operations)) or "-", str(t.calls), str(len(t.ranks)),
                        *(_ms(t.micros[p]) for p in PHASES), _ms(t.total), _ms(t.longest_negotiation))
                       for t in tensors], right=2)
    out += ["", "per rank (ms; overlapping spans counted once; SPAN: first event to last on the rank's own clock)"]
    rows = [("RANK", "EVENTS", "SPAN", "NEGOTIATE", "QUEUE", "MEMCPY", "TRANSFER", "NEGOTIATE %", "STALLS")]
    for rank in ranks:
        busy = {p: rank.busy(p) for p in PHASES}
        talk = busy[NEGOTIATE] + busy[TRANSFER]
        rows.append((str(rank.rank), str(rank.events), _ms(rank.last - rank.first), *(_ms(busy[p]) for p in PHASES),
                     f"{busy[NEGOTIATE] / talk:.0%}" if talk else "-",
                     str(sum(1 for s in summary.stalls if s.rank == rank.rank))))
    out += _columns(rows)
    stalls = sorted(summary.stalls, key=lambda s: -s.micros)
    out += ["", f"stalls: {len(stalls)} negotiation(s) of {stall_micros / 1e3:g} ms or more (the rank waited for "
                f"another rank to submit the same tensor)" + (f"; the {min(top, len(stalls))} longest:" if stalls else "")]
    if stalls:
        out += _columns([("RANK", "TENSOR", "AT (s)", "WAITED (ms)")]
                        + [(str(s.rank), _short(s.tensor), f"{s.start / 1e6:.3f}", _ms(s.micros))
                           for s in stalls[:top]], right=2)
    if summary.ignored:
        out += ["", f"{summary.ignored} value(s) ignored: not complete events or metadata of a timeline"]
    return "\n".join(out)


# ---- picture -----------------------------------------------------------------------------------------------


def summary_figure(summary: Summary, top: int) -> Any:
    """A matplotlib Figure: the top collectives' time by phase, each rank's time by phase, and each rank's
    timeline (phases merged to what the eye can tell apart, the longest stalls marked and named)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from hpcvod.jobs.plots import PHASE_COLOURS, new_figure

    ranks = sorted(summary.ranks.values(), key=lambda r: r.rank)[:MAX_DRAWN_RANKS]
    tensors = top_tensors(summary, min(top, 15))[::-1]
    heights = [0.35 * max(len(tensors), 3), max(1.4, 0.35 * len(ranks)), max(1.4, 0.35 * len(ranks))]
    fig = new_figure((11, 2.5 + sum(heights)))
    grid = fig.add_gridspec(3, 1, height_ratios=heights)
    top_ax, rank_ax, line_ax = (fig.add_subplot(grid[i]) for i in range(3))

    def stacked(ax: Any, labels: list[str], seconds: list[dict[str, float]]) -> None:
        left = [0.0] * len(labels)
        for phase in PHASES:
            widths = [s[phase] for s in seconds]
            ax.barh(labels, widths, left=left, color=PHASE_COLOURS[phase])
            left = [a + b for a, b in zip(left, widths)]

    stacked(top_ax, [_short(t.name)[:40] for t in tensors], [{p: t.micros[p] / 1e6 for p in PHASES} for t in tensors])
    top_ax.set_xlabel("time (s), summed over calls and ranks")
    top_ax.set_ylabel("tensor")
    top_ax.set_title(f"top {len(tensors)} of {len(summary.tensors)} collectives by time")

    labels = [f"rank {r.rank}" for r in ranks]
    stacked(rank_ax, labels, [{p: r.busy(p) / 1e6 for p in PHASES} for r in ranks])
    rank_ax.set_xlabel("time (s), overlapping spans counted once")
    rank_ax.set_ylabel("rank")
    rank_ax.set_title("time per rank: negotiation (waiting for the other ranks) against transfer")

    rows = {r.rank: i for i, r in enumerate(ranks)}
    for rank in ranks:
        gap = (rank.last - rank.first) / 2000   # joins what would be under a pixel
        for phase in PHASES:
            spans = merged(rank.intervals[phase], gap)
            line_ax.broken_barh([(s / 1e6, (e - s) / 1e6) for s, e in spans], (rows[rank.rank] - 0.35, 0.7),
                                color=PHASE_COLOURS[phase])
    for stall in sorted(summary.stalls, key=lambda s: -s.micros)[:5]:
        if stall.rank in rows:
            line_ax.plot([stall.start / 1e6], [rows[stall.rank] + 0.45], marker="v", color="black")
            line_ax.annotate(f"stall: {_short(stall.tensor)[:30]}, {stall.micros / 1e3:.0f} ms",
                             (stall.start / 1e6, rows[stall.rank] + 0.45), xytext=(6, 2), textcoords="offset points",
                             fontsize="small")
    line_ax.set_yticks(range(len(ranks)), labels)
    line_ax.set_ylim(-0.6, len(ranks) - 0.4 + 0.5)
    line_ax.set_xlabel("time (s) since the rank's timeline started (each rank has its own clock)")
    line_ax.set_ylabel("rank")
    line_ax.set_title("timeline per rank")
    handles = [Patch(color=PHASE_COLOURS[p], label=p) for p in PHASES]
    handles.append(Line2D([], [], marker="v", color="black", linestyle="none",
                          label=f"stall (a negotiation of {summary.stall_micros / 1e3:g} ms or more)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), title="phase")
    shown = f" (first {len(ranks)} of {len(summary.ranks)} ranks)" if len(summary.ranks) > len(ranks) else ""
    fig.suptitle(f"hpcvod timeline summary: {', '.join(Path(f).name for f in summary.files)[:100]}{shown}")
    return fig


# ---- the command -------------------------------------------------------------------------------------------


def summary_command(args: Any) -> int:
    """``hpcvod timeline summary``: the tables on stdout, notes on stderr, the picture with -o. Exit 0, or 2 for
    a file that is not a timeline (raised as UserError: one line)."""
    from hpcvod.jobs.plots import matplotlib_missing, save_png

    if not 1 <= args.top <= 1000:
        raise UserError(f"timeline summary: --top {args.top}: expected a number of rows from 1 to 1000")
    if not (math.isfinite(args.stall_ms) and args.stall_ms > 0):
        raise UserError(f"timeline summary: --stall-ms {args.stall_ms:g}: expected milliseconds > 0")
    if not (math.isfinite(args.max_mib) and args.max_mib > 0):
        raise UserError(f"timeline summary: --max-mib {args.max_mib:g}: expected MiB > 0")
    if args.output:   # before the work: nothing half-done
        missing = matplotlib_missing()
        if missing:
            raise UserError(f"timeline summary: -o {args.output}: {missing}")
        folder = Path(args.output).parent
        if not folder.is_dir():
            raise UserError(f"timeline summary: -o {args.output}: no folder {folder} to write it in")
        if os.path.lexists(args.output) and not stat.S_ISREG(os.lstat(args.output).st_mode):
            raise UserError(f"timeline summary: -o {args.output}: exists and is not a regular file (a link, FIFO or "
                            f"folder is not written through)")
    summary = summarise(args.files, args.stall_ms * 1e3, int(args.max_mib * 2**20))
    for note in summary.notes:
        print(f"hpcvod: note: {note}", file=sys.stderr)
    print(render_text(summary, args.top, args.stall_ms * 1e3))
    if args.output:
        save_png(summary_figure(summary, args.top), Path(args.output))
        print(f"picture: {args.output}", file=sys.stderr)
    return 0
