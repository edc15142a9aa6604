"""The pictures of `hpcvod sites check` and its HTML report (hpcvod/jobs/plots.py): each figure's axes, title
and legend read back from the matplotlib Figure, the PNG read back by an independent decoder, the HTML page
self-contained with every value from the job escaped, and the reports without matplotlib (tables kept, one
line saying why there is no picture)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from hpcvod.jobs import plots, scaling, sitecheck, sitecheck_model, sitecheck_report
from submission_helpers import clean_env, hpcvod
from test_sites_check_units import decode_png


def need_matplotlib() -> None:
    """matplotlib is the `plots` extra (setup-venvs.sh installs it in .venv): skipped without it, except in CI
    (CI set), where a missing one fails: a skipped test must not pass CI."""
    if plots.matplotlib_missing():
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail("CI: matplotlib (the plots extra) is missing", pytrace=False)
        pytest.skip("matplotlib (the plots extra) is not installed")


def points(gbps: list[float], start: int = 4096, factor: float = 1.0) -> list[dict]:
    return [{"bytes": start * 4 ** i, "seconds": start * 4 ** i * 8 * factor / (g * 1e9), "gbps": g, "bus_gbps": g}
            for i, g in enumerate(gbps)]


LINKS = {"world_size": 4, "nodes": 2, "buffers": "host and device",
         "intra_node": {"peer": 1, "latency_us": 40.0, "points": points([6.0, 11.0, 15.0], start=65536)},
         "inter_node": {"peer": 2, "latency_us": 370.0, "points": points([1.2, 3.1, 5.3], start=65536)},
         "allreduce": points([0.05, 0.17, 0.45, 0.9, 1.4], factor=1.5),
         "allreduce_device": points([0.5, 1.7, 4.5, 9.0, 14.0], factor=1.5)}


def two_node_report(site: str = "sandbox") -> dict:
    figures = sitecheck.link_figures(LINKS)
    checks = [sitecheck_model.Check("world.size", "pass", "one world of 4 ranks"),
              sitecheck_model.Check("links.inter_node", "warn", "latency 370 us")]
    return {"site": site, "job_id": "17", "state": "COMPLETED", "finished": "2026-11-25T10:00:00+0000",
            "exit_status": 0, "request": {"nodes": 2, "tasks_per_node": 2, "step_ms": 100.0, "overlap": 0.0},
            "checks": [c.__dict__ for c in checks], "figures": figures, "links": LINKS,
            "projection": scaling.projection(figures, [100.0, 500.0], 2, 8, 100.0),
            "model_check": scaling.model_check(figures, LINKS["allreduce"], 2, 2)}


def legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_bandwidth_and_time_plots_have_log_axes_units_title_and_a_labelled_line_per_path() -> None:
    need_matplotlib()
    figures = plots.site_figures(two_node_report())
    assert list(figures) == ["bandwidth.png", "latency.png", "projection.png"]
    lines = ["allreduce, host buffers, 4 ranks", "allreduce, device buffers, 4 ranks",
             "point-to-point inside a node, one way (rank 0 <-> 1)",
             "point-to-point between nodes, one way (rank 0 <-> 2)",
             "model: ring allreduce, 4 ranks (alpha-beta from the measured links)",
             "model: hierarchical allreduce, 4 ranks (alpha-beta from the measured links)"]
    for name, ylabel in (("bandwidth.png", "bandwidth (Gbit/s, log scale"),
                         ("latency.png", "time per operation (microseconds, log scale)")):
        (ax,) = figures[name].axes
        assert ax.get_xscale() == ax.get_yscale() == "log"
        assert ax.get_xlabel() == "message size (bytes, log scale)" and ax.get_ylabel().startswith(ylabel)
        assert ax.get_title().startswith(f"sites check sandbox: {plots.TITLES[name]}\njob 17, 2 node(s) x 2 rank(s)")
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert "4 KiB" in ticks and "1 MiB" in ticks, ticks
        if name == "latency.png":   # the 8-byte latency probe is a marker on the time plot only
            want = [line + ("; square: 8 B, the latency probe" if "point" in line else "") for line in lines]
        else:
            want = lines
        assert legend_texts(ax) == want
        # the models are dashed, the measurements solid
        styles = {line.get_label(): line.get_linestyle() for line in ax.get_lines()}
        assert styles[want[4]] == styles[want[5]] == "--" and styles[want[0]] == "-"
    (ax,) = figures["projection.png"].axes
    assert ax.get_xlabel() == "nodes (2 rank(s) each, log scale)"
    assert ax.get_ylabel() == "scaling efficiency (%): compute / (compute + allreduce)"
    assert ax.get_title().startswith("sites check sandbox: projected scaling efficiency (alpha-beta model, 100 ms")
    assert legend_texts(ax) == ["ring, 100 MiB of gradients", "hierarchical, 100 MiB of gradients",
                                "ring, 500 MiB of gradients", "hierarchical, 500 MiB of gradients"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]


def test_one_node_has_no_hierarchical_model_and_no_links_no_figures() -> None:
    need_matplotlib()
    report = two_node_report()
    one = {**LINKS, "inter_node": None, "allreduce_device": None}
    report.update(links=one, request={"nodes": 1, "tasks_per_node": 2}, projection=[],
                  model_check=scaling.model_check(sitecheck.link_figures(one), one["allreduce"], 1, 2))
    figures = plots.site_figures(report)
    assert list(figures) == ["bandwidth.png", "latency.png"]
    assert [t for t in legend_texts(figures["bandwidth.png"].axes[0]) if t.startswith("model")] == [
        "model: ring allreduce, 2 ranks (alpha-beta from the measured links)"]
    assert plots.site_figures({**report, "links": None}) == {}


def test_reports_in_the_job_folder_html_self_contained_and_escaped(tmp_path: Path) -> None:
    need_matplotlib()
    hostile = '<script>alert("x")</script>'
    report = two_node_report(site=hostile)
    report["checks"][0]["evidence"] = 'rank 0 said <img src=x onerror="alert(1)"> & left'
    sitecheck_report.write_reports(tmp_path, report)
    assert report["plots"] == ["bandwidth.png", "latency.png", "projection.png"] and "plots_note" not in report
    for name in report["plots"]:
        width, height, _ = decode_png((tmp_path / name).read_bytes())
        assert (width, height) == (900, 550)
    page = (tmp_path / "report.html").read_text()
    assert "<script>" not in page and "<img src=x" not in page and "onerror=\"" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page          # the title, escaped
    assert 'rank 0 said &lt;img src=x onerror=&quot;alert(1)&quot;&gt; &amp; left' in page
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == 3 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r"(href|src)=\"(?!data:)", page)   # nothing outside the page
    for caption in ("bandwidth against message size", "time per operation against message size",
                    "projected scaling efficiency"):
        assert f"<figcaption>{caption}</figcaption>" in page
    assert '<td class="PASS">PASS</td>' in page and '<td class="WARN">WARN</td>' in page
    assert '<td class="num">1024 KiB</td>' in page                              # the links tables
    assert "<th>hierarchical eff.</th>" in page                                 # the projection table
    md = (tmp_path / "report.md").read_text()
    assert "![projected scaling efficiency](projection.png)" in md
    assert json.loads((tmp_path / "report.json").read_text())["plots"] == report["plots"]


def test_without_matplotlib_the_reports_keep_their_tables_and_say_why(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # `import matplotlib` raises ImportError
    assert plots.matplotlib_missing() == plots.MISSING
    report = two_node_report()
    sitecheck_report.write_reports(tmp_path, report)
    assert report["plots"] == [] and report["plots_note"] == plots.MISSING
    assert sorted(os.listdir(tmp_path)) == ["report.html", "report.json", "report.md"]
    md = (tmp_path / "report.md").read_text()
    line = ("No plots: matplotlib is not installed in this Python (pip install 'hpcvod[plots]'); the tables carry "
            "the same figures.")
    assert md.count("No plots") == 1 and line in md.splitlines()
    assert "| 256 KiB | 0.900 | 3.495 |" in md and "| nodes | ranks |" in md
    page = (tmp_path / "report.html").read_text()
    assert "<img" not in page and "No plots: matplotlib is not installed" in page and "<table>" in page


def test_timeline_picture_without_matplotlib_is_refused_before_any_work(tmp_path: Path) -> None:
    """The real command with matplotlib hidden (a sitecustomize on PYTHONPATH): one line, exit 2, no table
    printed and no file written."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    (tmp_path / "tl.json").write_text('[\n{"name":"NEGOTIATE","ph":"X","pid":0,"tid":1,"ts":1,"dur":2}\n]\n')
    env = clean_env(tmp_path, PYTHONPATH=str(hide))
    done = hpcvod("timeline", "summary", "tl.json", "-o", "tl.png", cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and not (tmp_path / "tl.png").exists()
    assert done.stderr == ("hpcvod: error: timeline summary: -o tl.png: matplotlib is not installed in this Python "
                           "(pip install 'hpcvod[plots]')\n")
    # without -o the tables need no matplotlib
    done = hpcvod("timeline", "summary", "tl.json", cwd=tmp_path, env=env)
    assert done.returncode == 0 and "per rank" in done.stdout, done.stderr
