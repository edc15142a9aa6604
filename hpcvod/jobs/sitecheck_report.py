"""``hpcvod sites check``'s reports: the links against the previous report of the site, and report.json,
report.md and report.html (with the plots of hpcvod/jobs/plots.py) in the job folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcvod.jobs.plots import BANDWIDTH, LATENCY, PROJECTION, TITLES, draw_site_plots, report_html
from hpcvod.jobs.scaling import render_model_check, render_projection
from hpcvod.jobs.sitecheck_model import FAIL, PASS, SKIP, WARN, Check, Request

REPORT_JSON, REPORT_MD, REPORT_HTML = "report.json", "report.md", "report.html"
SLOWER_WARN = 0.20           # a link more than 20% slower than last time is a warn


def compare(figures: dict[str, float], previous: dict[str, Any] | None) -> list[Check]:
    """Each link figure against the previous report of the same site: more than 20% worse is a warn."""
    if not previous:
        return [Check("links.vs_previous", SKIP, "no earlier report of this site")]
    before = previous.get("figures", {})
    worse = []
    for key, now in figures.items():
        old = before.get(key)
        if not old:
            continue
        # latency: higher is worse; bandwidth: lower is worse
        change = (now - old) / old if key.endswith("latency_us") else (old - now) / old
        if change > SLOWER_WARN:
            worse.append(f"{key} {old:.2f} -> {now:.2f} ({change:.0%} worse)")
    where = f"report of {previous.get('finished', '?')} in {previous.get('job_dir', '?')}"
    return [Check("links.vs_previous", WARN if worse else PASS,
                  ("; ".join(worse) if worse else "no link more than 20% slower") + f" (against the {where})")]


def previous_report(root: Path, site_name: str, exclude: Path) -> dict[str, Any] | None:
    """The newest report.json of the same site under the jobs root, other than the current job's."""
    found = []
    for path in root.glob(f"*/{REPORT_JSON}"):
        if path.parent == exclude:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("site") == site_name and data.get("figures"):
            found.append((data.get("finished", ""), data))
    return max(found, key=lambda f: f[0])[1] if found else None


def exit_status(checks: list[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def render_table(checks: list[Check]) -> str:
    """CHECK  STATUS  EVIDENCE, evidence lines after the first indented under their column."""
    width = max([len(c.name) for c in checks] + [5])
    lines = [f"{'CHECK':<{width}}  STATUS  EVIDENCE"]
    for c in checks:
        first, *rest = c.evidence.splitlines() or [""]
        lines.append(f"{c.name:<{width}}  {c.status.upper():<6}  {first}")
        lines.extend(f"{'':<{width}}          {line}" for line in rest)
    return "\n".join(lines)


def render_links(links: dict[str, Any] | None) -> str:
    if not links:
        return ""
    def allreduce_table(points: list[dict]) -> list[str]:
        return ["| size | allreduce bus Gbit/s | allreduce ms |", "|---:|---:|---:|",
                *(f"| {p['bytes'] // 1024} KiB | {p['bus_gbps']:.3f} | {p['seconds'] * 1e3:.3f} |" for p in points)]
    rows = allreduce_table(links["allreduce"])
    if links.get("allreduce_device"):
        rows += ["", "device buffers:", "", *allreduce_table(links["allreduce_device"])]
    for path in ("intra_node", "inter_node"):
        if links.get(path):
            rows += ["", f"{path.replace('_', '-')} point-to-point (rank 0 <-> {links[path]['peer']}): latency "
                     f"{links[path]['latency_us']:.1f} us", "", "| size | Gbit/s |", "|---:|---:|"]
            rows += [f"| {p['bytes'] // 1024} KiB | {p['gbps']:.3f} |" for p in links[path]["points"]]
    return "\n".join(rows)


def render_markdown(report: dict[str, Any]) -> str:
    checks = [Check(**c) for c in report["checks"]]
    rows = ["| check | status | evidence |", "|---|---|---|"]
    rows += [f"| {c.name} | {c.status.upper()} | {' '.join(c.evidence.split()).replace('|', '/')} |" for c in checks]
    plots = report.get("plots") or []

    def pictures(*names: str) -> str:
        return "".join(f"\n\n![{TITLES[name]}]({name})" for name in names if name in plots)
    missing = (f"\n\nNo plots: {report['plots_note']}; the tables carry the same figures."
               if report.get("plots_note") else "")
    return (f"# sites check: {report['site']}\n\nJob {report['job_id']} ({report['state']}), "
            f"{report['request']['nodes']} node(s) x {report['request']['tasks_per_node']} rank(s), finished "
            f"{report['finished']}: **{'FAIL' if report['exit_status'] else 'PASS'}**\n\n" + "\n".join(rows)
            + "\n\n" + render_links(report.get("links")) + pictures(BANDWIDTH, LATENCY) + missing + "\n\n"
            + render_projection(report.get("projection") or [], report["request"].get("step_ms", Request.step_ms),
                                report["request"].get("overlap", 0.0)) + pictures(PROJECTION)
            + "\n\n" + render_model_check(report.get("model_check")) + "\n")


def write_reports(job_dir: Path, report: dict[str, Any]) -> None:
    """report.json, report.md and report.html (the plots inside it) into the job folder, with the plots as PNG
    files where there are links to plot and matplotlib to draw them (else report["plots_note"] says why not)."""
    images: dict[str, bytes] = {}
    if report.get("links"):
        drawn = draw_site_plots(report)
        if isinstance(drawn, str):
            report["plots_note"] = drawn
        else:
            images = drawn
    for name, data in images.items():
        (job_dir / name).write_bytes(data)
    report["plots"] = list(images)
    (job_dir / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n")
    markdown = render_markdown(report)
    (job_dir / REPORT_MD).write_text(markdown)
    (job_dir / REPORT_HTML).write_text(report_html(markdown, images))
