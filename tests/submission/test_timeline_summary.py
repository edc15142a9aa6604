"""`hpcvod timeline summary`: a real timeline of 2 ranks under mpiexec summarised (tables, the picture with its
labels read back), a timeline cut off mid-run read up to its last complete event, and hostile files (not a
timeline, nested, huge, a FIFO, a symlink, a device) refused in one line with exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvod.jobs import timeline_summary
from submission_helpers import clean_env, hpcvod
from test_plots import need_matplotlib
from test_sites_check_units import decode_png

REPO = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"   # the MPICH wheel's, beside the venv's Python

# A short training-like loop: allreduces, a grouped (fused) one, a broadcast, an allgather; rank 1 comes 1.2 s
# late to the "loss" allreduce of step 3, so rank 0 waits in NEGOTIATE (a stall) and rank 1 does not.
WORKER = """
import time
import numpy as np
import hpcvod.runtime as hvd

hvd.init()
rank = hvd.rank()
grads = [np.ones(n, dtype=np.float32) for n in (1 << 10, 1 << 14, 1 << 18)]
for step in range(5):
    for i, g in enumerate(grads):
        hvd.allreduce(g, name=f"grad.{i}")
    hvd.grouped_allreduce([np.ones(256, dtype=np.float32) for _ in range(4)], name="bias")
    if step == 3 and rank == 1:
        time.sleep(1.2)
    hvd.allreduce(np.ones(1, dtype=np.float32), name="loss")
hvd.broadcast(np.ones(1000, dtype=np.float32), root_rank=0, name="weights")
hvd.allgather(np.ones((2, 3), dtype=np.float32), name="metrics")
hvd.shutdown()
"""


@pytest.fixture(scope="module")
def timelines(tmp_path_factory) -> list[Path]:
    """Two ranks' timelines (HPCVOD_TIMELINE with {rank}: each rank writes its own)."""
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec beside {sys.executable}")
    folder = tmp_path_factory.mktemp("timeline")
    (folder / "train.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCVOD_", "HOROVOD_", "PMI_", "SLURM_"))}
    env.update(PYTHONPATH=str(REPO), HPCVOD_TIMELINE=str(folder / "tl.{rank}.json"))
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "train.py"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return [folder / "tl.0.json", folder / "tl.1.json"]


def summary_of(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return hpcvod("timeline", "summary", *args, cwd=tmp_path, env=clean_env(tmp_path))


def table(stdout: str, header: str) -> list[list[str]]:
    """The rows (split on whitespace) of the table whose header line starts with ``header``."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


@pytest.mark.mpi
def test_summary_of_a_real_two_rank_timeline(timelines: list[Path], tmp_path: Path) -> None:
    done = summary_of(tmp_path, *map(str, timelines))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("timeline of 2 rank(s) from 2 file(s): ")
    top = table(done.stdout, "TENSOR")
    assert top[0][:4] == ["allreduce.loss", "MPI_ALLREDUCE", "10", "2"], top   # 5 calls on each of 2 ranks
    names = [row[0] for row in top]   # Horovod's row names: <op>.<name>
    assert {"allreduce.grad.0", "allreduce.grad.1", "allreduce.grad.2", "allreduce.bias.0", "allreduce.bias.3",
            "broadcast.weights", "allgather.metrics"} <= set(names), names
    operations = {row[0]: row[1] for row in top}
    assert operations["broadcast.weights"] == "MPI_BCAST" and operations["allgather.metrics"] == "MPI_ALLGATHERV"
    ranks = {row[0]: row for row in table(done.stdout, "RANK  EVENTS")}
    assert set(ranks) == {"0", "1"}
    assert ranks["0"][-1] == "1" and ranks["1"][-1] == "0"                  # the stall is rank 0's
    assert float(ranks["0"][3]) > float(ranks["1"][3])                      # it negotiated longer
    stalls = table(done.stdout, "RANK  TENSOR")
    assert [s[:2] for s in stalls] == [["0", "allreduce.loss"]], stalls

    summary = timeline_summary.summarise(list(map(str, timelines)), 100e3, 1 << 30)
    fused = summary.tensors["allreduce.bias.0"]
    assert fused.micros["memcpy"] > 0 and fused.calls == 10               # fused with bias.1-3: memcpy in and out
    assert summary.ignored == 0 and summary.notes == []


@pytest.mark.mpi
def test_picture_has_axes_title_and_legend(timelines: list[Path], tmp_path: Path) -> None:
    need_matplotlib()
    summary = timeline_summary.summarise(list(map(str, timelines)), 100e3, 1 << 30)
    fig = timeline_summary.summary_figure(summary, 10)
    top, ranks, line = fig.axes
    assert fig.get_suptitle() == "hpcvod timeline summary: tl.0.json, tl.1.json"
    assert top.get_title() == "top 10 of 10 collectives by time" and top.get_ylabel() == "tensor"
    assert top.get_xlabel() == "time (s), summed over calls and ranks"
    assert [t.get_text() for t in top.get_yticklabels()][-1] == "allreduce.loss"   # the longest at the top
    assert ranks.get_xlabel() == "time (s), overlapping spans counted once" and ranks.get_ylabel() == "rank"
    assert [t.get_text() for t in ranks.get_yticklabels()] == ["rank 0", "rank 1"]
    assert line.get_xlabel() == "time (s) since the rank's timeline started (each rank has its own clock)"
    assert [t.get_text() for t in line.texts] == [f"stall: allreduce.loss, {summary.stalls[0].micros / 1e3:.0f} ms"]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["negotiate", "queue", "memcpy", "transfer",
                                                          "stall (a negotiation of 100 ms or more)"]
    done = summary_of(tmp_path, *map(str, timelines), "-o", "summary.png")
    assert done.returncode == 0 and done.stderr == "picture: summary.png\n", done.stderr
    width, height, _ = decode_png((tmp_path / "summary.png").read_bytes())
    assert width == 1100 and height > 500


@pytest.mark.mpi
def test_a_timeline_cut_off_mid_run_is_read_to_its_last_complete_event(timelines: list[Path],
                                                                      tmp_path: Path) -> None:
    text = timelines[0].read_text()
    whole = timeline_summary.summarise([str(timelines[0])], 100e3, 1 << 30)
    cut = text.index('"name":"MPI_BCAST"')           # inside the broadcast's event: the allgather's never came
    (tmp_path / "cut.json").write_text(text[:cut])
    done = summary_of(tmp_path, "cut.json")
    assert done.returncode == 0, done.stderr
    events = text[:cut].count("\n{")                     # values begun before the cut, the half one included
    assert done.stderr == (f"hpcvod: note: cut.json: ends inside value {events} (a timeline cut off mid-run?): "
                           f"summarised the {events - 1} complete values before it\n")
    assert "MPI_BCAST" not in done.stdout and "metrics" not in done.stdout and "allreduce.loss" in done.stdout
    # cut between two events (the runtime flushed, then the job was killed): no "]"
    at_boundary = text[:text.rindex(",\n{")]
    (tmp_path / "open.json").write_text(at_boundary)
    done = summary_of(tmp_path, "open.json")
    assert done.returncode == 0 and "has no end (the timeline was not stopped" in done.stderr, done.stderr
    partial = timeline_summary.summarise([str(tmp_path / "open.json")], 100e3, 1 << 30)
    assert partial.ranks[0].events == whole.ranks[0].events - 1


NESTED = 200_000


@pytest.mark.parametrize("content, message", [
    (b"", "not a timeline: the file is empty"),
    (b"hello", "not a timeline: it starts with 'hello', expected the JSON array of Chrome trace events"),
    (b'{"traceEvents": []}', "not a timeline: it starts with a JSON object, expected the JSON array"),
    (b"[1, 2, 3]", "not a timeline: its first value is not a Chrome trace event"),
    (b"[]", "not a timeline: no Chrome trace events in it"),
    (b'[{"ph": "X", "name": "MPI_ALLREDUCE", "pid": 0, "tid": 1, "ts": NaN, "dur": 1}]',
     "not a timeline: no Chrome trace events in it"),
    (b"[\n{nope", "not a timeline: its first value is not JSON"),
    (b"\x89PNG\r\n\x1a\n\x00\xff", "not a timeline: not UTF-8 text"),
    (b"[" * NESTED, "not a timeline: value 1 is nested too deep"),
    (b'[{"a":' * NESTED, "not a timeline: value 1 is nested too deep"),
    (b'[{"ph": "M", "name": "x", "args": "' + b"y" * (3 << 20) + b'"}]',
     "not a timeline: value 1 is not JSON or is larger than 1 MiB"),
], ids=["empty", "text", "object", "numbers", "no-events", "nan", "broken", "binary", "nested-arrays",
        "nested-objects", "huge-event"])
def test_a_file_that_is_not_a_timeline_is_one_line_and_exit_2(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "f.json").write_bytes(content)
    done = summary_of(tmp_path, "f.json")
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.startswith(f"hpcvod: error: f.json: {message}"), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_files_that_are_not_regular_or_too_large_are_refused(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text('[{"name":"NEGOTIATE","ph":"X","pid":0,"tid":1,"ts":1,"dur":2}]')
    os.symlink("real.json", tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo.json")                      # nobody writes to it: a plain open would block
    os.mkdir(tmp_path / "folder.json")
    with open(tmp_path / "big.json", "wb") as f:
        f.truncate(3 << 20)
    cases = [(["link.json"], "link.json: is a symbolic link: expected the timeline file itself"),
             (["fifo.json"], "fifo.json: cannot read a timeline: it is a FIFO, expected a regular file"),
             (["folder.json"], "folder.json: cannot read a timeline: it is a folder, expected a regular file"),
             (["/dev/zero"], "/dev/zero: cannot read a timeline: it is a character device, expected a regular file"),
             (["missing.json"], "missing.json: no such file: expected a timeline"),
             (["big.json", "--max-mib", "2"], "big.json: 3 MiB is more than the 2 MiB limit (--max-mib raises it)"),
             (["real.json", "--top", "0"], "timeline summary: --top 0: expected a number of rows from 1 to 1000"),
             (["real.json", "--stall-ms", "nan"], "timeline summary: --stall-ms nan: expected milliseconds > 0"),
             (["real.json", "--max-mib", "-1"], "timeline summary: --max-mib -1: expected MiB > 0"),
             (["real.json", "-o", "nowhere/x.png"], "timeline summary: -o nowhere/x.png: no folder nowhere"),
             (["real.json", "-o", "fifo.json"], "timeline summary: -o fifo.json: exists and is not a regular file"),
             (["real.json", "-o", "link.json"], "timeline summary: -o link.json: exists and is not a regular file")]
    for args, message in cases:
        done = summary_of(tmp_path, *args)
        assert done.returncode == 2 and done.stdout == "", (args, done.stdout + done.stderr)
        assert done.stderr.startswith(f"hpcvod: error: {message}") and done.stderr.count("\n") == 1, (args, done.stderr)
    assert (tmp_path / "real.json").read_text().startswith("[")   # -o link.json did not write through the link


def test_names_from_the_file_reach_the_terminal_without_control_characters(tmp_path: Path) -> None:
    (tmp_path / "tl.json").write_text(
        '[{"name":"thread_name","ph":"M","pid":0,"tid":1,"args":{"name":"grad\\u001b[31m.red"}},\n'
        '{"name":"MPI_ALLREDUCE","ph":"X","pid":0,"tid":1,"ts":1,"dur":2},\n'
        '{"name":"MPI_ALLREDUCE","ph":"X","pid":true,"tid":1,"ts":1,"dur":2},\n'
        '{"name":"CYCLE_START","ph":"i","s":"p","pid":0,"ts":3},\n'
        '"stray"]\n')
    done = summary_of(tmp_path, "tl.json")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "grad?[31m.red" in done.stdout
    assert "2 value(s) ignored" in done.stdout       # the bool pid and the stray string; the cycle mark is not


def test_timelines_in_the_earlier_layout_and_horovods_own_are_summarised(tmp_path: Path) -> None:
    """Files written before issue 29 (thread rows, complete events, pid = rank) still summarise; so does one that
    Horovod wrote (no rank in its header: rank 0; its per-rank ready marks inside a negotiation are not phases)."""
    (tmp_path / "old.json").write_text(
        '[\n{"name":"process_name","ph":"M","pid":1,"args":{"name":"rank 1"}},\n'
        '{"name":"thread_name","ph":"M","pid":1,"tid":1,"args":{"name":"grad.w"}},\n'
        '{"name":"NEGOTIATE","ph":"X","pid":1,"tid":1,"ts":0,"dur":150000},\n'
        '{"name":"QUEUE","ph":"X","pid":1,"tid":1,"ts":150000,"dur":1000},\n'
        '{"name":"MPI_ALLREDUCE","ph":"X","pid":1,"tid":1,"ts":151000,"dur":2000},\n'
        '{"name":"CYCLE_START","ph":"i","s":"p","pid":1,"ts":3}\n]\n')
    (tmp_path / "horovod.json").write_text(
        '[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros":1}},\n'
        '{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},\n'
        '{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.grad.w"}},\n'
        '{"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": 1}},\n'
        '{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 10, "pid": 1},\n'
        '{"ph": "X", "name": "0", "ts": 11, "pid": 1, "dur": 0},\n'
        '{"ph": "X", "name": "1", "ts": 500, "pid": 1, "dur": 0},\n'
        '{"ph": "E", "ts": 510, "pid": 1},\n'
        '{"ph": "B", "name": "ALLREDUCE", "ts": 510, "pid": 1},\n'
        '{"ph": "B", "name": "QUEUE", "ts": 510, "pid": 1},\n{"ph": "E", "ts": 600, "pid": 1},\n'
        '{"ph": "B", "name": "MPI_ALLREDUCE", "ts": 600, "pid": 1},\n{"ph": "E", "ts": 1600, "pid": 1},\n'
        '{"ph": "E", "ts": 1610, "pid": 1, "args": {"dtype": "float32", "shape": "[3]"}},\n'
        '{"ph": "i", "name": "CYCLE_START", "ts": 5, "s": "g"}]')
    old = timeline_summary.summarise([str(tmp_path / "old.json")], 100e3, 1 << 20)
    tensor = old.tensors["grad.w"]
    assert (tensor.calls, tensor.ranks, tensor.operations) == (1, {1}, {"MPI_ALLREDUCE"})
    assert tensor.micros == {"negotiate": 150000, "queue": 1000, "memcpy": 0, "transfer": 2000}
    assert [(s.rank, s.tensor) for s in old.stalls] == [(1, "grad.w")] and old.ignored == 0

    theirs = timeline_summary.summarise([str(tmp_path / "horovod.json")], 100e3, 1 << 20)
    tensor = theirs.tensors["allreduce.grad.w"]
    assert (tensor.calls, tensor.ranks, tensor.operations) == (1, {0}, {"MPI_ALLREDUCE"})
    assert tensor.micros == {"negotiate": 500, "queue": 90, "memcpy": 0, "transfer": 1000}
    assert set(theirs.tensors) == {"allreduce.grad.w"} and theirs.ignored == 0 and theirs.ranks[0].events == 4
    done = summary_of(tmp_path, "old.json", "horovod.json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert [row[:4] for row in table(done.stdout, "TENSOR")] == [["grad.w", "MPI_ALLREDUCE", "1", "1"],
                                                                  ["allreduce.grad.w", "MPI_ALLREDUCE", "1", "1"]]
