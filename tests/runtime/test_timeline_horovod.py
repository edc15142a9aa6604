"""The timeline as Horovod writes it (issue 29 item 7): Horovod's test/parallel/test_timeline.py ported (its
environment names, its row and phase names, the file opened while the job runs), the layout of Horovod's
horovod/common/timeline.cc (one process per tensor, B/E spans, NEGOTIATE_<OP> then <OP> holding its activities),
complete JSON after every write, bounded memory, and a file created private that never follows a link planted at
its path.

Horovod's test reads the file 0.1 s after the collective and asserts; the worker does the same and then keeps
looking (for 30 s at most): these tests assert that the events arrived while the job ran, never how fast (the
first look is in the failure message)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from hpcvod.runtime import handles as K
from hpcvod.runtime import timeline as timeline_module
from hpcvod.runtime.errors import HpcvodInputError
from hpcvod.runtime.handles import Handle, Signature
from hpcvod.runtime.timeline import Timeline, open_timeline

from conftest import MpiFlavour

ROOT = Path(__file__).resolve().parents[2]


def looks(stdout: str) -> list[dict]:
    return [json.loads(line[5:]) for line in stdout.splitlines() if line.startswith("LOOK ")]


def phases(row: list[list]) -> list[str]:
    return [name for name, _start, _end, _operation in row]


def check_operation(row: list[list], op: str, activities: list[str]) -> None:
    """NEGOTIATE_<OP> first, then <OP> from the agreement to the end, holding ``activities`` in order."""
    negotiate, *inside, operation = row
    assert negotiate[0] == f"NEGOTIATE_{op}" and not negotiate[3], row
    assert operation[0] == op and operation[3], row
    assert operation[1] == negotiate[2], row                       # the operation begins when the ranks agreed
    assert [span[0] for span in inside] == activities, row
    assert all(operation[1] <= s[1] <= s[2] <= operation[2] for s in inside), row


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_horovods_test_timeline(mpi: MpiFlavour, tmp_path: Path) -> None:
    path = tmp_path / "timeline.json"
    ranks = mpi.run(2, "w_timeline_horovod.py", str(path), timeout=120,
                    env={"HOROVOD_TIMELINE": str(path), "HOROVOD_TIMELINE_MARK_CYCLES": "1", "EXPECT_CYCLES": "1"})
    assert ranks.returncode == 0, ranks.explain()
    first, second = looks(ranks.stdout)
    # Horovod's four assertions, on the file as rank 0 found it while the job ran
    wanted = ["allreduce.test_allreduce", "NEGOTIATE_ALLREDUCE", '"ALLREDUCE"', "MPI_ALLREDUCE", "CYCLE_START"]
    assert first["has"] == wanted, (first, ranks.explain())
    assert first["complete_json"] and first["mode"] == 0o600, first
    assert first["cycle_marks"] >= 1, first
    check_operation(first["rows"]["allreduce.test_allreduce"], "ALLREDUCE", ["QUEUE", "MPI_ALLREDUCE"])

    assert second["complete_json"] and len(second["has"]) == 7, (second, ranks.explain())
    rows = second["rows"]
    for i in range(3):   # grouped: fused into one buffer
        check_operation(rows[f"allreduce.bias.{i}"], "ALLREDUCE",
                        ["QUEUE", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"])
    check_operation(rows["broadcast.weights"], "BROADCAST", ["QUEUE", "MPI_BCAST"])
    check_operation(rows["allgather.metrics"], "ALLGATHER", ["QUEUE", "MPI_ALLGATHERV"])

    events = json.loads(path.read_text())   # after the job: complete, private, Horovod's header
    assert events[0]["name"] == "process_name" and events[0]["pid"] == 0
    assert "start_time_since_epoch_in_micros" in events[0]["args"] and events[0]["args"]["rank"] == 0
    labels = [e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"]]
    assert len(labels) == len(set(labels)) and "allreduce.test_allreduce" in labels
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_hpcvod_spelling_and_no_cycle_marks_unless_asked(mpich: MpiFlavour, tmp_path: Path) -> None:
    path = tmp_path / "tl.json"
    path.write_text("an old timeline, world-readable\n")
    path.chmod(0o644)
    ranks = mpich.run(2, "w_timeline_horovod.py", str(path), timeout=120, env={"HPCVOD_TIMELINE": str(path)})
    assert ranks.returncode == 0, ranks.explain()
    first, second = looks(ranks.stdout)
    assert len(first["has"]) == 4 and first["cycle_marks"] == 0, first
    assert second["cycle_marks"] == 0 and "broadcast.weights" in second["rows"], second
    assert first["mode"] == 0o600 and stat.S_IMODE(path.stat().st_mode) == 0o600   # made private, rewritten
    assert json.loads(path.read_text())[0]["name"] == "process_name"


# ---- the writer, without MPI -------------------------------------------------------------------------------


def handle(name: str, kind: int = K.ALLREDUCE) -> Handle:
    return Handle(name, kind, Signature(kind), np.zeros(4, np.float32))


def test_events_reach_the_file_while_the_timeline_runs(tmp_path: Path) -> None:
    """Nothing calls flush() or close(): the writer thread writes, and every write leaves complete JSON."""
    path = tmp_path / "tl.json"
    tl = Timeline(str(path), 0)
    try:
        h = handle("grad")
        tl.negotiated([h], 1.0, 2.0)
        tl.span("grad", "MPI_ALLREDUCE", 2.0, 3.0)
        tl.executed([h], 3.0)
        seen = threading.Event()
        for _ in range(3000):   # polled, 30 s at most: the test asserts that it comes, not when
            if path.read_text().count('"ph":"E"') == 3:
                seen.set()
                break
            seen.wait(0.01)
        assert seen.is_set(), path.read_text()
        events = json.loads(path.read_text())
        assert [e.get("name") for e in events if e["ph"] in "BE"] == ["NEGOTIATE_ALLREDUCE", None, "ALLREDUCE",
                                                                       "MPI_ALLREDUCE", None, None]
    finally:
        tl.close()


def test_a_job_killed_mid_run_leaves_complete_json(tmp_path: Path) -> None:
    path = tmp_path / "tl.json"
    code = ("import os, sys\n"
            "from hpcvod.runtime.timeline import Timeline\n"
            "tl = Timeline(sys.argv[1], 0, mark_cycles=True)\n"
            "for i in range(100):\n"
            "    tl.span(f't{i}', 'MPI_ALLREDUCE', i, i + 0.5)\n"
            "    tl.cycle_mark(i)\n"
            "tl.flush()\n"
            "os._exit(9)   # killed: no close(), no atexit\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 9, done.stderr
    events = json.loads(path.read_text())
    assert sum(1 for e in events if e.get("name") == "CYCLE_START") == 100
    assert sum(1 for e in events if e["ph"] == "B") == 100


def test_a_forked_child_does_not_write_into_the_parents_timeline(tmp_path: Path) -> None:
    """A data loader's worker forked with records pending, exiting through close() after the parent wrote on,
    must not write them (over the parent's later events) at the offsets it inherited."""
    path = tmp_path / "tl.json"
    tl = Timeline(str(path), 0)
    go_read, go_write = os.pipe()
    with tl._lock:   # records pending at the fork
        tl.span("before.fork", "MPI_ALLREDUCE", 0.0, 1.0)
        child = os.fork()
        if child == 0:
            tl._lock.release()
            os.read(go_read, 1)        # the parent has written on
            tl.flush()
            tl.close()
            os._exit(0)
    for i in range(50):
        tl.span(f"after.fork.{i}", "MPI_ALLREDUCE", 1.0, 2.0)
    tl.flush()
    os.write(go_write, b"x")
    assert os.waitpid(child, 0)[1] == 0
    tl.close()
    events = json.loads(path.read_text())
    labels = [e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"]]
    assert labels == ["before.fork"] + [f"after.fork.{i}" for i in range(50)]


def test_memory_is_bounded_and_lost_events_are_reported(tmp_path: Path, capsys,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline_module, "MAX_PENDING", 10)
    tl = Timeline(str(tmp_path / "tl.json"), 0)
    with tl._lock:   # the writer is held up (a slow disk): records pile up to the bound, then are dropped
        for i in range(25):
            tl.span(f"t{i}", "MPI_ALLREDUCE", 0.0, 1.0)
        assert len(tl._pending) == 10 and tl.dropped == 15
    tl.close()
    assert capsys.readouterr().err == (f"hpcvod: rank 0: the timeline {tmp_path / 'tl.json'} lacks 15 event(s): its "
                                       f"writer fell more than 10 behind\n")
    events = json.loads((tmp_path / "tl.json").read_text())
    assert sum(1 for e in events if e["ph"] == "B") == 10


# ---- the file: private, never through a link ----------------------------------------------------------------


def test_a_symlink_planted_at_the_path_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    link = tmp_path / "tl.json"
    os.symlink(victim, link)
    with pytest.raises(HpcvodInputError) as err:
        open_timeline(str(link), 0)
    assert str(err.value) == (f"rank 0: cannot write the timeline {link}: it is a symbolic link (not followed: name "
                              f"the file itself)")
    assert victim.read_text() == "keep me\n"
    dangling = tmp_path / "dangling.json"
    os.symlink(tmp_path / "created-through-the-link.json", dangling)
    with pytest.raises(HpcvodInputError):
        open_timeline(str(dangling), 0)
    assert not (tmp_path / "created-through-the-link.json").exists()


def test_an_existing_file_of_ours_is_made_private_and_truncated(tmp_path: Path) -> None:
    path = tmp_path / "tl.json"
    path.write_text("x" * 10000)
    path.chmod(0o644)
    Timeline(str(path), 0).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())[0]["pid"] == 0


def test_hard_links_fifos_and_other_users_files_are_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine.txt"
    mine.write_text("keep me\n")
    os.link(mine, tmp_path / "linked.json")
    os.mkfifo(tmp_path / "fifo.json")         # nobody reads it: a plain open would hang
    cases = {"linked.json": "it exists with other hard links to it",
             "fifo.json": "it is a FIFO, expected a regular file"}
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs.json"
        theirs.write_text("theirs\n")
        os.chown(theirs, 65534, 65534)
        cases["theirs.json"] = "it exists and belongs to another user"
    for name, why in cases.items():
        with pytest.raises(HpcvodInputError) as err:
            open_timeline(str(tmp_path / name), 0)
        assert str(err.value) == f"rank 0: cannot write the timeline {tmp_path / name}: {why}"
    assert mine.read_text() == "keep me\n"
    if os.geteuid() == 0:
        assert (tmp_path / "theirs.json").read_text() == "theirs\n"


def test_a_device_is_written_as_a_stream(capsys) -> None:
    tl = open_timeline("/dev/null", 0)
    tl.negotiated([handle("x")], 0.0, 1.0)
    tl.close()
    assert tl.write_error is None and capsys.readouterr().err == ""
