"""Pictures and the HTML page of hpcvod's reports: ``sites check``'s bandwidth, latency and scaling projection,
``timeline summary``'s figure (hpcvod/jobs/timeline_summary.py draws it with ``new_figure``).

matplotlib is the optional ``plots`` extra (``pip install 'hpcvod[plots]'``), imported only when a picture is drawn
and always through the Agg canvas (no display, no pyplot state). Without it ``matplotlib_missing()`` says so in
one line and the reports keep their tables.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import os
import re
import stat
from pathlib import Path
from typing import Any

from hpcvod.support.errors import UserError

MISSING = "matplotlib is not installed in this Python (pip install 'hpcvod[plots]')"
PHASE_COLOURS = {"negotiate": "tab:red", "queue": "tab:orange", "memcpy": "tab:green", "transfer": "tab:blue"}
BANDWIDTH, LATENCY, PROJECTION = "bandwidth.png", "latency.png", "projection.png"
TITLES = {BANDWIDTH: "bandwidth against message size", LATENCY: "time per operation against message size",
          PROJECTION: "projected scaling efficiency"}


def matplotlib_missing() -> str | None:
    """None where matplotlib can be imported, else the one line that says why there is no picture."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return MISSING
    return None


def new_figure(size: tuple[float, float]) -> Any:
    """An empty matplotlib Figure on the Agg canvas (constrained layout: labels are never cut off)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Any) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def save_png(fig: Any, path: Path) -> None:
    """``fig`` as a PNG at ``path``: a regular file, never written through a symlink or into a FIFO."""
    data = png_bytes(fig)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as err:
        raise UserError(f"{path}: cannot write the picture ({err.strerror or err}; a symbolic link is not "
                        f"written through)") from None
    with os.fdopen(fd, "wb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"{path}: cannot write the picture: not a regular file")
        f.truncate(0)
        f.write(data)


# ---- sites check -------------------------------------------------------------------------------------------


def _size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def _size_axis(ax: Any, sizes: list[float]) -> None:
    """Message size on a log axis, ticks at powers of 4 named in B / KiB / MiB."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    low, high = min(sizes) / 1.5, max(sizes) * 1.5   # room for the end markers
    ticks, tick = [], 1
    while tick <= high:
        if tick >= low:
            ticks.append(tick)
        tick *= 4
    ax.set_xlim(low, high)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: _size_label(value)))
    ax.set_xlabel("message size (bytes, log scale)")
    ax.grid(True, which="both", alpha=0.3)


@dataclasses.dataclass
class Line:
    """One line of the bandwidth and time plots: (bytes, seconds, Gbit/s) per message size."""

    label: str
    points: list[tuple[float, float, float]]
    model: bool = False
    probe: tuple[float, float, float] | None = None   # the latency probe's tiny message: a marker on the time plot


def link_lines(report: dict[str, Any]) -> list[Line]:
    """A line per path the job measured, and the alpha-beta model's ring and hierarchical allreduce for the same
    sizes (allreduce bandwidth as bus bandwidth, as nccl-tests define it)."""
    links = report.get("links") or {}
    lines: list[Line] = []
    for key, label in (("allreduce", "allreduce, host buffers"), ("allreduce_device", "allreduce, device buffers")):
        if links.get(key):
            lines.append(Line(f"{label}, {links.get('world_size', '?')} ranks",
                              [(p["bytes"], p["seconds"], p["bus_gbps"]) for p in links[key]]))
    for key, label in (("intra_node", "point-to-point inside a node"), ("inter_node", "point-to-point between nodes")):
        path = links.get(key)
        if path:
            from hpcvod.runtime.sitecheck import LATENCY_BYTES

            latency = path["latency_us"] * 1e-6
            lines.append(Line(f"{label}, one way (rank 0 <-> {path['peer']})",
                              [(p["bytes"], p["seconds"], p["gbps"]) for p in path["points"]],
                              probe=(LATENCY_BYTES, latency, LATENCY_BYTES * 8 / latency / 1e9) if latency > 0
                              else None))
    check = report.get("model_check") or {}
    ranks = check.get("ranks", 0)
    if check.get("points") and ranks > 1:
        share = 2 * (ranks - 1) / ranks
        algorithms = [("ring_ms", "ring")]
        if report.get("request", {}).get("nodes", 1) > 1:   # on one node the two algorithms are the same ring
            algorithms.append(("hierarchical_ms", "hierarchical"))
        for key, name in algorithms:
            points = [(p["bytes"], p[key] / 1e3, p["bytes"] * share * 8 / (p[key] / 1e3) / 1e9)
                      for p in check["points"] if p[key] > 0]
            lines.append(Line(f"model: {name} allreduce, {ranks} ranks (alpha-beta from the measured links)", points,
                              model=True))
    return lines


def _subtitle(report: dict[str, Any]) -> str:
    request = report.get("request") or {}
    return (f"job {report.get('job_id')}, {request.get('nodes', '?')} node(s) x {request.get('tasks_per_node', '?')} "
            f"rank(s), {report.get('finished', '?')}")


def site_figures(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of a ``sites check`` report by file name: bandwidth and time per operation against message
    size (log axes, one line per path, the model dashed) and the scaling projection; {} without measured links."""
    lines = link_lines(report)
    if not report.get("links") or not lines:
        return {}
    figures = {}
    for name, column, scale, ylabel in (
            (BANDWIDTH, 2, 1, "bandwidth (Gbit/s, log scale; allreduce: bus bandwidth, 2(n-1)/n x size / time)"),
            (LATENCY, 1, 1e6, "time per operation (microseconds, log scale)")):
        fig = new_figure((9, 5.5))
        ax = fig.add_subplot()
        sizes = []
        for colour, line in enumerate(lines):
            shown = [(p[0], p[column] * scale) for p in line.points if p[column] > 0]
            probe = line.probe if name == LATENCY and line.probe else None   # 8 bytes say nothing of bandwidth
            label = line.label + (f"; square: {probe[0]:g} B, the latency probe" if probe else "")
            if shown:
                ax.plot(*zip(*shown), linestyle="--" if line.model else "-", marker=None if line.model else "o",
                        markersize=4, label=label, color=f"C{colour}")
            if probe:
                ax.plot([probe[0]], [probe[1] * scale], marker="s", linestyle="none", color=f"C{colour}",
                        label=None if shown else label)
            sizes += [p for p, _ in shown] + ([probe[0]] if probe else [])
        _size_axis(ax, sizes)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(f"sites check {report.get('site')}: {TITLES[name]}\n{_subtitle(report)}", fontsize="medium")
        ax.legend(fontsize="small")
        figures[name] = fig
    if report.get("projection"):
        figures[PROJECTION] = projection_figure(report)
    return figures


def projection_figure(report: dict[str, Any]) -> Any:
    """Scaling efficiency against node count, per algorithm and gradient size (report["projection"] rows)."""
    rows = report["projection"]
    request = report.get("request") or {}
    fig = new_figure((9, 5.5))
    ax = fig.add_subplot()
    for colour, mib in enumerate(dict.fromkeys(r["model_mib"] for r in rows)):
        for key, name, style in (("ring_efficiency", "ring", "-"), ("hierarchical_efficiency", "hierarchical", "--")):
            points = [(r["nodes"], r[key] * 100) for r in rows if r["model_mib"] == mib]
            ax.plot(*zip(*points), linestyle=style, marker="o", markersize=4, color=f"C{colour}",
                    label=f"{name}, {mib:g} MiB of gradients")
    ax.set_xscale("log", base=2)
    nodes = sorted({r["nodes"] for r in rows})
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.set_xlabel(f"nodes ({request.get('tasks_per_node', '?')} rank(s) each, log scale)")
    ax.set_ylabel("scaling efficiency (%): compute / (compute + allreduce)")
    ax.set_ylim(0, 105)
    ax.grid(True, alpha=0.3)
    overlap = request.get("overlap", 0.0)
    ax.set_title(f"sites check {report.get('site')}: {TITLES[PROJECTION]} (alpha-beta model, "
                 f"{request.get('step_ms', '?'):g} ms compute per step, "
                 f"{f'{overlap:.0%} overlap' if overlap else 'no overlap'})\n{_subtitle(report)}", fontsize="medium")
    ax.legend(fontsize="small")
    return fig


def draw_site_plots(report: dict[str, Any]) -> dict[str, bytes] | str:
    """PNG bytes by file name, or the line that says why nothing was drawn."""
    missing = matplotlib_missing()
    if missing:
        return missing
    return {name: png_bytes(fig) for name, fig in site_figures(report).items()}


# ---- HTML --------------------------------------------------------------------------------------------------

_STYLE = """body{font-family:sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.25rem .5rem;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.PASS{background:#dff3df}td.FAIL{background:#f8d7d7}td.WARN{background:#fff1c9}td.SKIP{color:#777}
img{max-width:100%;border:1px solid #ddd}figure{margin:1rem 0}figcaption{color:#555}"""
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def _inline(text: str) -> str:
    """Escaped text with the report's only markup, **bold**, kept."""
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(text))


def report_html(markdown: str, images: dict[str, bytes]) -> str:
    """A self-contained page of a report in the small Markdown subset the reports write (a # title, paragraphs,
    pipe tables, ![caption](file.png) lines): every value escaped, each picture inside as a data: URI (a
    picture not in ``images`` becomes its caption)."""
    title = "report"
    body: list[str] = []
    for block in re.split(r"\n\s*\n", markdown.strip()):
        lines = block.splitlines()
        if lines[0].startswith("# "):
            title = lines[0][2:]
            body.append(f"<h1>{html.escape(title)}</h1>")
            lines = lines[1:]
        if lines and all(line.startswith("|") for line in lines) and len(lines) >= 2:
            body.append(_table(lines))
        elif lines and _IMAGE.fullmatch(lines[0].strip()):
            caption, name = _IMAGE.fullmatch(lines[0].strip()).groups()
            if name in images:
                data = base64.b64encode(images[name]).decode("ascii")
                body.append(f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
                            f"<figcaption>{html.escape(caption)}</figcaption></figure>")
            else:
                body.append(f"<p>{html.escape(caption)} (no picture)</p>")
        elif lines:
            body.append("<p>" + "<br>\n".join(_inline(line) for line in lines) + "</p>")
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _table(lines: list[str]) -> str:
    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    head, rule, *rows = lines
    right = [c.endswith(":") for c in cells(rule)]
    out = ["<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in cells(head)) + "</tr>"]
    for row in rows:
        tds = []
        for i, cell in enumerate(cells(row)):
            kind = "num" if i < len(right) and right[i] else cell if cell in ("PASS", "FAIL", "WARN", "SKIP") else ""
            tds.append(f'<td class="{kind}">{_inline(cell)}</td>' if kind else f"<td>{_inline(cell)}</td>")
        out.append("<tr>" + "".join(tds) + "</tr>")
    return "\n".join(out) + "</table>"
