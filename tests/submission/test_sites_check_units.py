"""`hpcvod sites check` pieces that need no cluster: the PNG reader the plot tests share, the
checks' judgement of rank records, report rendering, the comparison with a previous report, interconnect.link_gbps.
The acceptance job itself runs in tests/cluster/test_sites_check.py and in the local test at the end."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import pytest

from hpcvod.jobs import plots, scaling, sitecheck, sitecheck_interconnect, sitecheck_model, sitecheck_report
from hpcvod.schedulers import profile_options
from hpcvod.sites import UserError, load_site
from hpcvod.sites.profile import Interconnect
from hpcvod.sites.spec import field_docs, from_data, json_schema
from sitecheck_helpers import record, statuses
from submission_helpers import clean_env, hpcvod as hpcvod_cli


def decode_png(data: bytes) -> tuple[int, int, list[list[tuple[int, ...]]]]:
    """An 8-bit RGB or RGBA PNG read back: every chunk's CRC checked, IDAT inflated, each row's filter (none, sub,
    up, average, Paeth) undone into pixels. Written from the PNG specification, not from the writer."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "PNG signature"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, f"CRC of {kind!r}"
        chunks.append((kind, body))
        pos += 12 + length
    assert [k for k, _ in chunks][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert depth == 8 and colour_type in (2, 6) and interlace == 0
    channels = 3 if colour_type == 2 else 4
    stride = channels * width
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    assert len(raw) == height * (1 + stride)
    rows, above = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (1 + stride)], bytearray(raw[y * (1 + stride) + 1:(y + 1) * (1 + stride)])
        assert kind <= 4, f"filter type {kind}"
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b, c = above[x], above[x - channels] if x >= channels else 0
            if kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                predictor = a if pa <= pb and pa <= pc else b if pb <= pc else c
            else:
                predictor = (0, a, b, (a + b) // 2, 0)[kind]
            line[x] = (line[x] + predictor) & 0xFF
        rows.append([tuple(line[x:x + channels]) for x in range(0, stride, channels)])
        above = line
    return width, height, rows


def test_png_decoder_reads_every_filter_and_catches_damage() -> None:
    """The decoder against PNGs built here byte by byte: one row per filter type of known pixels."""
    pixels = [[(10 * x + y, 200 - x, 7 * y, 255) for x in range(5)] for y in range(5)]
    raw = bytearray()
    above = bytearray(20)
    for kind, row in enumerate(pixels):
        line = bytearray(v for px in row for v in px)
        filtered = bytearray()
        for x in range(20):
            a, b = line[x - 4] if x >= 4 else 0, above[x]
            c = above[x - 4] if x >= 4 else 0
            p = a + b - c
            paeth = a if abs(p - a) <= abs(p - b) and abs(p - a) <= abs(p - c) else b if abs(p - b) <= abs(p - c) else c
            filtered.append((line[x] - (0, a, b, (a + b) // 2, paeth)[kind]) & 0xFF)
        raw += bytes([kind]) + filtered
        above = line

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 5, 5, 8, 6, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(bytes(raw))) + chunk(b"IEND", b""))
    assert decode_png(png) == (5, 5, pixels)
    damaged = bytearray(png)
    damaged[40] ^= 0xFF
    with pytest.raises(AssertionError, match="CRC"):
        decode_png(bytes(damaged))


def test_one_world_passes_and_one_rank_worlds_fail_with_the_reason(sandbox) -> None:
    request = sitecheck_model.Request(nodes=2, tasks_per_node=2)
    good = [record(r, "n1" if r < 2 else "n2") for r in range(4)]
    assert set(statuses(sitecheck._world_checks(sandbox, request, good)).values()) == {"pass"}
    singles = [record(r, "n1" if r < 2 else "n2", size=1, rank=0, local_rank=0, local_size=1, cross_rank=0,
                      cross_size=1) for r in range(4)]
    checks = sitecheck._world_checks(sandbox, request, singles)
    assert statuses(checks)["world.size"] == "fail"
    assert "4 one-rank worlds" in checks[0].evidence and "mpi_plugin 'pmi2'" in checks[0].evidence
    moved = [record(r, "n1" if r < 2 else "n2", cross_rank=1 - r // 2) for r in range(4)]
    assert statuses(sitecheck._world_checks(sandbox, request, moved))["world.layout"] == "fail"


def test_flavour_and_thread_level_and_environment_judged(sandbox) -> None:
    request = sitecheck_model.Request(nodes=2, tasks_per_node=2, frameworks=("nosuch",))
    other = [record(r, "n1" if r < 2 else "n2", mpi_flavour="openmpi", thread_level="serialized") for r in range(4)]
    got = statuses(sitecheck._world_checks(sandbox, request, other))
    assert got["world.mpi_flavour"] == "fail" and got["world.thread_level"] == "warn"
    ranks = [record(r, "n1", env={"NCCL_IB_DISABLE": "0"},
                    frameworks={"nosuch": {"ok": "no", "error": "ModuleNotFoundError: nosuch"}}) for r in range(4)]
    checks = sitecheck._environment_checks(sandbox, request, ranks, "COMPLETED", "")
    got = statuses(checks)
    assert got["env.profile_env"] == "fail" and got["env.framework.nosuch"] == "fail" and got["env.setup"] == "pass"
    nothing = sitecheck._environment_checks(sandbox, request, [None] * 4, "FAILED", "line 28: /x: No such file")
    assert nothing[0].status == "fail" and "No such file" in nothing[0].evidence


LINKS = {"world_size": 4, "nodes": 2, "buffers": "host",
         "intra_node": {"peer": 1, "latency_us": 10.0, "points": [{"bytes": 65536, "seconds": 1e-4, "gbps": 5.0}]},
         "inter_node": {"peer": 2, "latency_us": 50.0, "points": [{"bytes": 65536, "seconds": 1e-3, "gbps": 2.0}]},
         "allreduce": [{"bytes": 4096, "seconds": 1e-3, "bus_gbps": 0.1},
                       {"bytes": 65536, "seconds": 2e-3, "bus_gbps": 1.0}]}


def test_comparison_with_the_previous_report_warns_on_a_link_20_percent_slower() -> None:
    figures = sitecheck.link_figures(LINKS)
    assert figures == {"intra_node.latency_us": 10.0, "intra_node.gbps": 5.0, "inter_node.latency_us": 50.0,
                       "inter_node.gbps": 2.0, "allreduce.bus_gbps": 1.0}
    assert sitecheck_report.compare(figures, None)[0].status == "skip"
    same = sitecheck_report.compare(figures, {"figures": dict(figures)})[0]
    assert same.status == "pass"
    slower = {**figures, "inter_node.gbps": 2.6, "intra_node.latency_us": 8.0}   # now 23% / 25% worse
    check = sitecheck_report.compare(figures, {"figures": slower, "finished": "yesterday"})[0]
    assert check.status == "warn"
    assert "inter_node.gbps 2.60 -> 2.00" in check.evidence and "intra_node.latency_us" in check.evidence
    assert sitecheck_report.compare(figures, {"figures": {**figures, "inter_node.gbps": 2.4}})[0].status == "pass"  # 17%


def test_previous_report_is_the_newest_of_the_same_site(tmp_path: Path) -> None:
    for name, site, finished in (("a", "s", "2026-01-01"), ("b", "s", "2026-02-01"), ("c", "t", "2026-03-01"),
                                 ("d", "s", "2026-04-01")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps({"site": site, "finished": finished,
                                                                  "figures": {"x": 1}}))
    assert sitecheck_report.previous_report(tmp_path, "s", exclude=tmp_path / "d")["finished"] == "2026-02-01"
    assert sitecheck_report.previous_report(tmp_path, "u", exclude=tmp_path / "d") is None


def test_declared_link_speed_is_compared(sandbox) -> None:
    import dataclasses

    slow = dataclasses.replace(sandbox, profile=dataclasses.replace(
        sandbox.profile, interconnect=dataclasses.replace(sandbox.profile.interconnect, link_gbps=100.0)))
    checks = statuses(sitecheck._link_checks(slow, LINKS, None))
    assert checks["links.inter_node"] == "warn" and checks["links.intra_node"] == "pass"
    fine = dataclasses.replace(slow, profile=dataclasses.replace(
        slow.profile, interconnect=dataclasses.replace(slow.profile.interconnect, link_gbps=3.0)))
    assert statuses(sitecheck._link_checks(fine, LINKS, None))["links.inter_node"] == "pass"


def test_report_renders_as_table_and_markdown() -> None:
    checks = [sitecheck_model.Check("world.size", "pass", "one world of 4"),
              sitecheck_model.Check("env.setup", "fail", "no rank started\nline 28: x | y")]
    table = sitecheck_report.render_table(checks).splitlines()
    assert table[0].split() == ["CHECK", "STATUS", "EVIDENCE"]
    assert table[2].split()[:3] == ["env.setup", "FAIL", "no"] and table[3].strip() == "line 28: x | y"
    assert sitecheck_report.exit_status(checks) == 1 and sitecheck_report.exit_status(checks[:1]) == 0
    report = {"site": "s", "job_id": "7", "state": "COMPLETED", "finished": "now", "exit_status": 1,
              "request": {"nodes": 2, "tasks_per_node": 2}, "checks": [c.__dict__ for c in checks],
              "links": LINKS, "plots": ["bandwidth.png", "latency.png"]}
    md = sitecheck_report.render_markdown(report)
    assert "| env.setup | FAIL | no rank started line 28: x / y |" in md
    assert "| 64 KiB | 1.000 |" in md and "**FAIL**" in md
    assert "![bandwidth against message size](bandwidth.png)" in md
    assert "![time per operation against message size](latency.png)" in md and "No plots" not in md


@pytest.mark.parametrize("value, message", [
    (0, "interconnect.link_gbps: expected a number > 0, got 0"),
    (-5, "interconnect.link_gbps: expected a number > 0, got -5"),
    ("200G", "interconnect.link_gbps: expected a number > 0, got '200G' (str)"),
    (float("inf"), "interconnect.link_gbps: expected a number > 0, got inf (float)"),
])
def test_link_gbps_bad_values_say_what_was_expected(value, message) -> None:
    from hpcvod.support.errors import ProfileError

    with pytest.raises(ProfileError) as err:
        from_data(Interconnect, {"link_gbps": value}, ("interconnect",))
    assert str(err.value) == message


def test_link_gbps_in_schema_and_reference() -> None:
    assert from_data(Interconnect, {"link_gbps": 200}).link_gbps == 200.0
    assert from_data(Interconnect, {"link_gbps": 12.5}).link_gbps == 12.5
    schema = json_schema(Interconnect)["properties"]["link_gbps"]
    assert {"type": "number", "exclusiveMinimum": 0} in schema["anyOf"]
    rows = {key: expected for key, expected, _ in field_docs(Interconnect)}
    assert rows["link_gbps"] == "a number > 0 or nothing (null)"


def test_bad_framework_and_partition_are_usage_errors(sandbox) -> None:
    with pytest.raises(UserError, match="--framework 'pytorch': expected one of torch"):
        sitecheck.default_request(sandbox, None, None, None, True, ("pytorch",))
    with pytest.raises(UserError, match="--partition 'gpu': site slurm-sandbox has debug, urgent"):
        sitecheck.default_request(sandbox, None, None, "gpu", True, ())


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_local_site_check_passes_and_keeps_its_report(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    done = hpcvod_cli("sites", "check", "local", "--quick", "--json", "--output-dir", str(tmp_path / "jobs"),
                      cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    got = {c["name"]: c["status"] for c in report["checks"]}
    assert got["world.size"] == got["world.mpi_flavour"] == got["links.allreduce"] == "pass", got
    assert got["links.inter_node"] == "skip"  # one node
    job_dir = Path(report["job_dir"])
    assert {"report.json", "report.md", "report.html", "links.json"} <= set(os.listdir(job_dir))
    if plots.matplotlib_missing():   # the tables stay; the report says why there is no picture
        assert report["plots"] == [] and "No plots: matplotlib is not installed" in (job_dir / "report.md").read_text()
    else:
        assert report["plots"] == ["bandwidth.png", "latency.png"]   # one node: no projection
        for name in report["plots"]:
            decode_png((job_dir / name).read_bytes())
            assert f"({name})" in (job_dir / "report.md").read_text()
        assert (job_dir / "report.html").read_text().count('src="data:image/png;base64,') == 2
    assert [p["bytes"] for p in report["links"]["allreduce"]] == [4096 * 4 ** i for i in range(6)]  # to 4 MiB


def test_container_check(sandbox) -> None:
    import dataclasses

    assert sitecheck._container_check(sandbox, [record(0, "n1")]).status == "skip"

    def with_container(runtime):
        return dataclasses.replace(sandbox, profile=dataclasses.replace(sandbox.profile, container=dataclasses.replace(
            sandbox.profile.container, runtime=runtime, image="/images/train.sif")))
    site = with_container("apptainer")
    inside = [record(r, "n1", container={"APPTAINER_CONTAINER": "/images/train.sif", "os": "Ubuntu 22.04"})
              for r in range(2)]
    check = sitecheck._container_check(site, inside)
    assert check.status == "pass" and "/images/train.sif (Ubuntu 22.04)" in check.evidence
    outside = [record(1, "n2", container={"/.dockerenv": "exists", "os": "Debian"})]
    check = sitecheck._container_check(site, inside + outside)
    assert check.status == "fail" and "n2 rank 1" in check.evidence
    assert sitecheck._container_check(with_container("pyxis"), inside).status == "warn"


def test_alpha_beta_projection() -> None:
    link = scaling.Link(alpha=1e-5, beta=1e9)   # 10 us, 1 GB/s
    # ring of 4: 6 latencies + 1.5 x the data over the link
    assert scaling.ring_seconds(1e9, 4, link) == pytest.approx(6e-5 + 1.5)
    assert scaling.ring_seconds(1e9, 1, link) == 0.0
    figures = {"intra_node.latency_us": 1.0, "intra_node.gbps": 80.0, "inter_node.latency_us": 10.0,
               "inter_node.gbps": 8.0}
    rows = scaling.projection(figures, [100.0], per_node=4, max_nodes=8, step_ms=100.0)
    assert [r["nodes"] for r in rows] == [1, 2, 4, 8] and [r["ranks"] for r in rows] == [4, 8, 16, 32]
    one, two = rows[0], rows[1]
    # one node: both algorithms are the intra-node ring; 100 MiB x 1.5 / 10 GB/s
    assert one["ring_ms"] == pytest.approx(one["hierarchical_ms"])
    assert one["ring_ms"] == pytest.approx((6e-6 + 1.5 * 100 * 2**20 / 1e10) * 1e3)
    # across nodes the hierarchical algorithm sends the buffer over the slow link once per node, not per rank
    assert two["hierarchical_ms"] < two["ring_ms"]
    assert two["ring_efficiency"] == pytest.approx(100 / (100 + two["ring_ms"]))
    assert all(a["ring_ms"] <= b["ring_ms"] for a, b in zip(rows, rows[1:]))
    assert scaling.projection({"intra_node.latency_us": 1.0, "intra_node.gbps": 1.0}, [1.0], 2, 4, 1.0) == []
    assert "| 2 | 8 | 100 |" in scaling.render_projection(rows, 100.0)


@pytest.mark.parametrize("text", ["", "0", "-1,5", "1,,2", "big", "inf"])
def test_model_mib_bad_values(text) -> None:
    with pytest.raises(UserError, match=r"--model-mib .*: expected sizes in MiB separated by commas"):
        scaling.parse_model_mib(text)
    assert scaling.parse_model_mib("100,500") == (100.0, 500.0)


def test_model_is_checked_against_the_jobs_own_allreduce() -> None:
    check = scaling.model_check(sitecheck.link_figures(LINKS), LINKS["allreduce"], nodes=2, per_node=2)
    # 64 KiB over 4 ranks: ring paced by the inter-node link (50 us, 2 Gbit/s); hierarchical adds the intra ring
    inter, intra = scaling.Link(50e-6, 2e9 / 8), scaling.Link(10e-6, 5e9 / 8)
    assert check["ring_ms"] == pytest.approx(scaling.ring_seconds(65536, 4, inter) * 1e3)
    assert check["hierarchical_ms"] == pytest.approx(
        (scaling.ring_seconds(65536, 2, intra) + scaling.ring_seconds(65536, 2, inter)) * 1e3)
    assert check["measured_ms"] == pytest.approx(2.0)
    assert check["ring_error"] == pytest.approx(check["ring_ms"] / 2.0 - 1)
    assert "measured 2.0 ms; ring model" in scaling.render_model_check(check)
    # every measured size, not only the largest
    assert [p["bytes"] for p in check["points"]] == [4096, 65536]
    assert check["points"][0]["measured_ms"] == pytest.approx(1.0)
    assert check["points"][0]["ring_ms"] == pytest.approx(scaling.ring_seconds(4096, 4, inter) * 1e3)


# Horovod's published scaling (docs/benchmarks.rst): 128 servers x 4 P100, 25 Gbit/s RoCE, tf_cnn_benchmarks,
# synthetic data, batch 64 a GPU. Its gradient sizes in fp32 (parameters x 4 bytes) and the one-GPU step times
# from TensorFlow's May 2017 benchmarks page (DGX-1 P100, synthetic, batch 64: Inception V3 142 images/s, VGG16
# 154; ResNet-101 is not listed: 129 images/s interpolated by FLOPs between ResNet-50's 219 and ResNet-152's 91.8).
HOROVOD_LINKS = {"intra_node.latency_us": 5.0, "intra_node.gbps": 80.0,      # PCIe 3 x16 inside a server (assumed)
                 "inter_node.latency_us": 10.0, "inter_node.gbps": 25.0}     # the 25 Gbit/s RoCE link
RESNET101_IMAGES_S = 1 / (1 / 219 + (7.6 - 3.8) / (11.3 - 3.8) * (1 / 91.8 - 1 / 219))
HOROVOD_PUBLISHED = [("ResNet-101", 44.5e6, 64 / RESNET101_IMAGES_S, 0.90), ("Inception V3", 23.8e6, 64 / 142, 0.90),
                     ("VGG-16", 138e6, 64 / 154, 0.68)]


@pytest.mark.parametrize("name, parameters, step_s, published", HOROVOD_PUBLISHED, ids=[m[0] for m in HOROVOD_PUBLISHED])
def test_projection_against_horovods_published_scaling(name, parameters, step_s, published) -> None:
    mib = parameters * 4 / 2**20
    def at_512_gpus(overlap):
        row = scaling.projection(HOROVOD_LINKS, [mib], per_node=4, max_nodes=128, step_ms=step_s * 1e3,
                                   overlap=overlap)[-1]
        assert (row["nodes"], row["ranks"]) == (128, 512)
        return row["ring_efficiency"]
    # nothing hidden behind the backward pass: a lower bound, 4 to 15 points under what Horovod measured
    assert published - 0.16 < at_512_gpus(0.0) < published - 0.03
    # half of the allreduce hidden (Horovod starts reducing while backpropagation goes on): within 3 points
    assert at_512_gpus(0.5) == pytest.approx(published, abs=0.03)


def test_overlap_hides_part_of_the_allreduce() -> None:
    assert scaling.efficiency(100.0, 100.0) == pytest.approx(0.5)
    assert scaling.efficiency(100.0, 100.0, overlap=0.5) == pytest.approx(100 / 150)
    rows = scaling.projection(HOROVOD_LINKS, [100.0], 4, 2, 100.0, overlap=0.5)
    assert "50% of the allreduce hidden behind it" in scaling.render_projection(rows, 100.0, 0.5)


def test_model_file_gives_the_gradient_size(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(1000, 100), torch.nn.Linear(100, 10).half())
    parameters = 1000 * 100 + 100 + 100 * 10 + 10
    nbytes = (1000 * 100 + 100) * 4 + (100 * 10 + 10) * 2      # the fp16 layer counts 2 bytes a value
    torch.save(model.state_dict(), tmp_path / "state.pt")
    torch.save({"epoch": 3, "model_state_dict": model.state_dict(), "optimizer": {}}, tmp_path / "checkpoint.pt")
    torch.jit.save(torch.jit.script(model), tmp_path / "scripted.pt")
    for name in ("state.pt", "checkpoint.pt", "scripted.pt"):
        assert scaling.model_gradient_mib(str(tmp_path / name)) == (pytest.approx(nbytes / 2**20), parameters)
    torch.save(model, tmp_path / "pickled.pt")
    with pytest.raises(UserError, match=r"pickled.pt: a pickled torch.nn.modules.container.Sequential, which this check does not unpickle"):
        scaling.model_gradient_mib(str(tmp_path / "pickled.pt"))
    torch.save({"epoch": 3}, tmp_path / "empty.pt")
    with pytest.raises(UserError, match=r"empty.pt: no state_dict in it \(found epoch; expected"):
        scaling.model_gradient_mib(str(tmp_path / "empty.pt"))
    (tmp_path / "text.pt").write_text("not a model")
    with pytest.raises(UserError, match=r"text.pt: not a torch file"):
        scaling.model_gradient_mib(str(tmp_path / "text.pt"))
    with pytest.raises(UserError, match=r"--model .*nosuch.pt: no such file"):
        scaling.model_gradient_mib(str(tmp_path / "nosuch.pt"))


def test_model_file_without_torch_is_one_clear_line(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "m.pt").write_bytes(b"x")
    monkeypatch.setitem(__import__("sys").modules, "torch", None)   # `import torch` raises ImportError
    with pytest.raises(UserError) as err:
        scaling.model_gradient_mib(str(tmp_path / "m.pt"))
    assert str(err.value) == (f"--model {tmp_path / 'm.pt'}: reading a torch model needs torch in this Python; "
                              f"give its size with --model-mib instead")


@pytest.mark.parametrize("args, said", [
    (["--overlap", "1"], "hpcvod: error: --overlap 1: expected a fraction from 0 to below 1"),
    (["--model", "nosuch.pt"], "hpcvod: error: --model nosuch.pt: no such file"),
])
def test_projection_options_refused_in_one_line_before_any_job(tmp_path: Path, args, said) -> None:
    done = hpcvod_cli("sites", "check", "local", "--output-dir", str(tmp_path / "jobs"), *args, cwd=tmp_path,
                      env=clean_env(tmp_path))
    assert done.returncode == 2 and done.stderr.strip() == said, done.stderr
    assert not (tmp_path / "jobs").exists()


CAPTURE = """
import ctypes, sys
from pathlib import Path
from hpcvod.runtime.sitecheck import CapturedOutput
libc = ctypes.CDLL(None)
with CapturedOutput(Path(sys.argv[1])) as first:
    libc.printf(b"libfabric provider: verbs;ofi_rxm\\n")     # C stdio, buffered: never seen by sys.stdout
    print("from python", file=sys.stderr)
print("after:", repr(first.text))
try:
    with CapturedOutput(None):
        libc.printf(b"the MPI said why\\n")
        raise RuntimeError("init failed")
except RuntimeError:
    pass
"""


def test_captured_output_takes_what_c_printed_and_gives_it_back_on_an_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CAPTURE, str(tmp_path / "0.mpi.log")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # the first block's C printf and Python's stderr went to the file, and only there
    assert done.stdout == "after: 'libfabric provider: verbs;ofi_rxm\\nfrom python\\n'\n"
    assert (tmp_path / "0.mpi.log").read_text() == "libfabric provider: verbs;ofi_rxm\nfrom python\n"
    # the second block failed: what it captured is written back to stderr for the job's output
    assert done.stderr == "the MPI said why\n"


def test_a_rank_that_ended_inside_the_mpi_is_told_by_its_early_record_and_its_log(tmp_path: Path) -> None:
    from hpcvod.runtime.sitecheck import ENDED_IN_MPI

    (tmp_path / "sitecheck").mkdir()
    (tmp_path / "sitecheck" / "0.json").write_text(json.dumps({**record(0, "n1"), ENDED_IN_MPI: True}))
    (tmp_path / "sitecheck" / "0.mpi.log").write_text("summary\nAbort(1): Fatal error\nOFI call ep_enable failed\n\n")
    (tmp_path / "sitecheck" / "1.json").write_text(json.dumps(record(1, "n1")))
    records, _ = sitecheck.read_records(tmp_path, 3, tmp_path / "output.log")
    assert records[0]["init_error"] == ("rank 0 on n1 ended inside the MPI without a Python error; 0.mpi.log ends: "
                                        "Abort(1): Fatal error / OFI call ep_enable failed")
    assert ENDED_IN_MPI not in records[0] and "init_error" not in records[1] and records[2] is None


def test_the_rank_whose_mpi_said_why_is_the_evidence_not_one_killed_silently(tmp_path: Path, sandbox) -> None:
    # rank 0 was killed by the launcher before its MPI printed anything; rank 1's MPI said why it aborted
    from hpcvod.runtime.sitecheck import ENDED_IN_MPI

    (tmp_path / "sitecheck").mkdir()
    for rank in (0, 1):
        (tmp_path / "sitecheck" / f"{rank}.json").write_text(json.dumps({**record(rank, "n1"), ENDED_IN_MPI: True}))
    (tmp_path / "sitecheck" / "0.mpi.log").write_text("")
    (tmp_path / "sitecheck" / "1.mpi.log").write_text("Abort(1): Fatal error\nOFI call ep_enable failed\n")
    request = sitecheck_model.Request(nodes=2, tasks_per_node=2)
    records, _ = sitecheck.read_records(tmp_path, 4, tmp_path / "output.log")
    checks = sitecheck._world_checks(sandbox, request, records)
    assert checks[0].evidence == ("hvd.init() failed: rank 1 on n1 ended inside the MPI without a Python error; "
                                  "1.mpi.log ends: Abort(1): Fatal error / OFI call ep_enable failed")
    # rank 2's hvd.init() raised and its exit made srun end the others inside the MPI: its own error is the evidence
    alone = "hpcvod.init(): this process is alone in an MPI world of size 1 but the launcher promised 4"
    (tmp_path / "sitecheck" / "2.json").write_text(json.dumps({**record(2, "n2"), "init_error": alone}))
    records, _ = sitecheck.read_records(tmp_path, 4, tmp_path / "output.log")
    assert sitecheck._world_checks(sandbox, request, records)[0].evidence == f"hvd.init() failed: {alone}"


def test_device_allreduce_is_a_check_a_table_and_a_line_of_the_plot() -> None:
    points = [{"bytes": 4096 * 4 ** i, "seconds": 1e-4 * (i + 1), "bus_gbps": 10.0 * (i + 1)} for i in range(3)]
    links = {"world_size": 4, "nodes": 2, "buffers": "host and device", "intra_node": None, "inter_node": None,
             "allreduce": points, "allreduce_device": [dict(p, bus_gbps=p["bus_gbps"] * 9) for p in points]}
    figures = sitecheck.link_figures(links)
    assert figures["allreduce_device.bus_gbps"] == 270.0
    checks = {c.name: c for c in sitecheck._link_checks(load_site("slurm-sandbox", schedulers=profile_options()),
                                                        links, None)}
    assert checks["links.allreduce_device"].status == "pass" and "270.00 Gbit/s" in checks["links.allreduce_device"].evidence
    assert "device buffers:" in sitecheck_report.render_links(links)
    assert [line.label for line in plots.link_lines({"links": links})] == ["allreduce, host buffers, 4 ranks",
                                                                           "allreduce, device buffers, 4 ranks"]


PROBE_ON_STAND_IN = """
import json, sys
from hpcvod.runtime.sitecheck import probe
record = probe({"gpus_per_node": 1, "max_bytes": 64 * 1024})
from hpcvod.runtime.world import launcher_rank
open(f"{sys.argv[1]}/{launcher_rank() or 0}.json", "w").write(json.dumps(record))
"""


@pytest.mark.mpi
def test_device_buffers_measured_through_the_device_path_on_the_cpu_stand_in(tmp_path: Path, sandbox) -> None:
    """The rank side with GPUs asked for, on 2 ranks with the CPU stand-in for CuPy and NCCL
    (tests/runtime/cpu_cupy): device buffers go through runtime/nccl.py and are measured, and the judgement reads
    the records. The stand-in prints no NCCL lines, so on two "nodes" the network is unknown: a warn."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**clean_env(tmp_path), "PYTHONPATH": f"{root / 'tests' / 'runtime' / 'cpu_cupy'}{os.pathsep}{root}"}
    done = subprocess.run([str(Path(sys.executable).parent / "mpiexec"), "-n", "2", sys.executable, "-c",
                           PROBE_ON_STAND_IN, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    records = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert records[0]["gpu"]["device_buffers"] and records[0]["gpu"]["backend"] == "nccl", records[0]["gpu"]
    assert records[0]["gpu"]["nccl_reported"] == []
    links = records[0]["links"]
    assert [p["bytes"] for p in links["allreduce_device"]] == [4096, 16384, 65536]
    assert all(p["bus_gbps"] > 0 for p in links["allreduce_device"])
    checks = {c.name: c for c in sitecheck._link_checks(sandbox, links, None)}
    assert checks["links.allreduce_device"].status == "pass"
    request = sitecheck_model.Request(nodes=2, tasks_per_node=1, gpus_per_node=1)
    nccl = next(c for c in sitecheck_interconnect.interconnect_checks(sandbox, request, records) if c.name == "interconnect.nccl")
    assert nccl.status == "warn" and "printed no 'Using network' line" in nccl.evidence
