"""Job folders and job ids that hpcvod did not write: corrupt files and ids shaped like options
(issue 10, items 3 and 4). Every case is one `hpcvod: error:` line and exit status 2, whatever the command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcvod.schedulers import scheduler_class
from hpcvod.schedulers.base import SchedulerError
from submission_helpers import one_error_line


@pytest.fixture
def fake_tools(tmp_path, monkeypatch) -> Path:
    """scancel, squeue, ... first on PATH, each writing its argv to calls.log: proof of what ran, or that nothing did."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("scancel", "squeue", "scontrol", "sacct", "qdel", "qstat", "qacct"):
        path = bin_dir / tool
        path.write_text(f'#!/bin/sh\nprintf "%s" "{tool}" >> "{log}"\nfor a in "$@"; do printf " [%s]" "$a" >> "{log}"; '
                        f'done\necho >> "{log}"\nexit 1\n')
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def _unused_pid() -> int:
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


def _job_folder(root: Path, record: dict | None = None, request: dict | None = None) -> Path:
    folder = root / "hpcvod-jobs" / "job-1"
    folder.mkdir(parents=True)
    pid = _unused_pid()
    base = {"job_id": f"local-{pid}", "scheduler": "local", "pid": pid, "pgid": pid, "start_time": 12345}
    (folder / "job.json").write_text(json.dumps(record if record is not None else base))
    (folder / "request.json").write_text(json.dumps(request if request is not None else
                                                    {"plan": {"site": "local", "scheduler": "local", "site_source": ""}}))
    (folder / "output.log").write_text("hello\n")
    return folder


# ---- item 3: ids shaped like options never reach the scheduler's commands --------------------------------


def test_option_shaped_job_id_in_a_folder_never_reaches_scancel(tmp_path, cli, fake_tools):
    folder = _job_folder(tmp_path, {"job_id": "--user=root", "scheduler": "slurm"},
                         {"plan": {"site": "slurm-ib-openmpi", "scheduler": "slurm"}})
    for command in ("cancel", "status", "logs"):
        code, _, err = cli(command, str(folder))
        one_error_line(code, err, str(folder / "job.json"), "job id '--user=root': expected a slurm job id")
    assert not fake_tools.exists(), fake_tools.read_text()  # scancel/squeue never ran
    assert not (folder / "cancelled").exists()  # and the refused cancel left no mark


@pytest.mark.parametrize("site,job", [("slurm-ib-openmpi", "-5"), ("slurm-ib-openmpi", "--user=root"),
                                      ("slurm-ib-openmpi", "12 34"), ("slurm-ib-openmpi", "123\n--me"),
                                      ("pbs-ib-openmpi", "-5"), ("pbs-ib-openmpi", "-Wforce"),
                                      ("sge-sandbox", "-u"), ("sge-sandbox", "1;2"), ("local", "local--1"),
                                      ("local", "local-0"), ("slurm-ib-openmpi", "\u0661\u0662")])
@pytest.mark.parametrize("command", ["status", "cancel"])
def test_option_shaped_job_id_on_the_command_line(cli, fake_tools, site, job, command):
    code, _, err = cli(command, "--site", site, "--", job)
    one_error_line(code, err, "JOB: job id", "expected a")
    assert not fake_tools.exists(), fake_tools.read_text()


def test_valid_ids_reach_scancel_after_a_double_dash(cli, fake_tools):
    code, _, err = cli("cancel", "--site", "slurm-ib-openmpi", "123_4")
    assert code == 1 and "scancel 123_4" in err  # the fake scancel fails: a scheduler failure, exit 1
    calls = fake_tools.read_text().splitlines()  # where the job stands is asked first (cancel of an ended job)
    assert calls[-1] == "scancel [--] [123_4]" and all(not c.startswith("scancel") for c in calls[:-1]), calls


@pytest.mark.parametrize("name,good,bad", [
    ("slurm", ["123", "123_4", "123+1"], ["", "-5", "--user=root", "123_", "123_[1-3]", "12a", "123\n", " 123",
                                         "\u0661\u0662\u0663"]),
    ("pbs", ["123", "123.server", "123[].server", "123[4].pbs01.example.org"], ["-5", ".server", "123.-x", "123[",
                                                                              "123.ser ver", "123.server\n"]),
    ("sge", ["123", "123.4", "123.1-10:2"], ["-5", "123.", "123.a", "abc", "123\n"]),
    ("local", ["local-1234"], ["local-", "local-0", "local--5", "local-12345678", "1234", "local-12 "]),
])
def test_job_id_forms(name, good, bad):
    cls = scheduler_class(name)
    for job_id in good:
        assert cls.check_job_id(job_id) == job_id
    for job_id in bad:
        with pytest.raises(Exception, match="expected a .* job id like"):
            cls.check_job_id(job_id, "here")


def test_scheduler_output_parsing_uses_the_same_forms():
    assert scheduler_class("slurm").parse_job_id("42;cluster\n") == "42"
    assert scheduler_class("sge").parse_job_id("77.1-10:1\n") == "77"
    for name, text in (("slurm", "-5\n"), ("pbs", "--x.server\n"), ("sge", "-u\n")):
        with pytest.raises(SchedulerError):
            scheduler_class(name).parse_job_id(text)


# ---- item 4: corrupt job folders ---------------------------------------------------------------------------


def _write(name: str, data: bytes):
    return lambda folder: (folder / name).write_bytes(data)


def _record(**changes):
    def change(folder: Path) -> None:
        record = json.loads((folder / "job.json").read_text())
        record.update(changes)
        (folder / "job.json").write_text(json.dumps(record))
    return change


def _replace_with(kind: str, name: str):
    def replace(folder: Path) -> None:
        (folder / name).unlink(missing_ok=True)
        if kind == "folder":
            (folder / name).mkdir()
        else:
            os.mkfifo(folder / name)
    return replace


CORRUPT = [
    ("job.json empty", _write("job.json", b""), "job.json", "empty file"),
    ("job.json truncated", _write("job.json", b'{"job_id": "local-12'), "job.json", "not valid JSON"),
    ("job.json not UTF-8", _write("job.json", b'{"job_id": "\xff\xfe"}'), "job.json", "not UTF-8"),
    ("job.json a list", _write("job.json", b'["local-12"]'), "job.json", "expected a JSON object, got a JSON list"),
    ("job.json nested deep", _write("job.json", b"[" * 100_000), "job.json", "nested too deeply"),
    ("job.json a FIFO", _replace_with("fifo", "job.json"), "job.json", "it is a FIFO"),
    ("job.json huge", _write("job.json", b" " * (2 << 20)), "job.json", "larger than"),
    ("pid not an integer", _record(pid="12ab"), "job.json", "pid: expected the process id"),
    ("pid a float", _record(pid=12.5), "job.json", "pid: expected the process id"),
    ("pid 0", _record(pid=0), "job.json", "pid: expected the process id"),
    ("pgid missing", _record(pgid=None), "job.json", "pgid: expected the process id"),
    ("start_time text", _record(start_time="soon"), "job.json", "start_time: expected"),
    ("pid not the id's", _record(pid=4242), "job.json", "does not name the recorded pid 4242"),
    ("job_id a number", _record(job_id=12), "job.json", "job id 12: expected a local job id"),
    ("unknown scheduler", _record(scheduler="nosuch"), "job.json", "scheduler 'nosuch': expected one of"),
    ("scheduler a list", _record(scheduler=["local"]), "job.json", "scheduler ['local']: expected one of"),
    ("request.json a list", _write("request.json", b"[]"), "request.json", "expected a JSON object"),
    ("plan a string", _write("request.json", b'{"plan": "x"}'), "request.json", "plan: expected a JSON object"),
    ("site a number", _write("request.json", b'{"plan": {"site": 3}}'), "request.json", "site: expected a string"),
    ("output.log a folder", _replace_with("folder", "output.log"), "output.log", "it is a folder"),
    ("output.log a FIFO", _replace_with("fifo", "output.log"), "output.log", "it is a FIFO"),
    ("exitcode garbage", _write("exitcode", b"garbage\n"), "exitcode", "expected the exit status"),
    ("exitcode not UTF-8", _write("exitcode", b"\xff\xfe\n"), "exitcode", "not UTF-8"),
    ("exitcode out of range", _write("exitcode", b"300\n"), "exitcode", "a number 0-255"),
    ("exitcode negative", _write("exitcode", b"-1\n"), "exitcode", "a number 0-255"),
    ("exitcode Arabic digits", _write("exitcode", "\u0661\n".encode()), "exitcode", "a number 0-255"),
    ("exitcode a folder", _replace_with("folder", "exitcode"), "exitcode", "it is a folder"),
    ("cancelled a folder", _replace_with("folder", "cancelled"), "cancelled", "it is a folder"),
]


@pytest.mark.parametrize("command", ["status", "logs", "cancel"])
@pytest.mark.parametrize("label,corrupt,file,problem", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_corrupt_job_folder_is_one_line(tmp_path, cli, command, label, corrupt, file, problem):
    folder = _job_folder(tmp_path)
    corrupt(folder)
    before = sorted(p.name for p in folder.iterdir())
    code, out, err = cli(command, str(folder))
    one_error_line(code, err, str(folder / file), problem)
    assert out == ""
    assert sorted(p.name for p in folder.iterdir()) == before  # no cancel mark, nothing else


@pytest.mark.parametrize("command", ["status", "logs", "cancel"])
def test_the_same_folder_uncorrupted_works(tmp_path, cli, command):
    folder = _job_folder(tmp_path)
    code, out, err = cli(command, str(folder))
    assert code == 0, err
    if command == "status":
        assert "FAILED" in out  # its pid is not running and it recorded no exit status
    if command == "logs":
        assert out == "hello\n"


def test_an_empty_exitcode_is_being_written_not_garbage(tmp_path, cli):
    """The script's `echo $? > exitcode` truncates before it writes: an empty file is no exit status yet."""
    folder = _job_folder(tmp_path)
    (folder / "exitcode").write_text("")
    code, out, err = cli("status", str(folder))
    assert code == 0 and "FAILED" in out and "exit=" not in out, err
    (folder / "exitcode").write_text("3\n")
    code, out, _ = cli("status", str(folder))
    assert code == 0 and "exit=3" in out


def test_a_broken_folder_does_not_stop_the_search_by_id(tmp_path, cli):
    broken = tmp_path / "hpcvod-jobs" / "broken"
    broken.mkdir(parents=True)
    (broken / "job.json").write_bytes(b"\xff[")
    good = tmp_path / "hpcvod-jobs" / "zz-good"
    good.mkdir()
    pid = _unused_pid()
    (good / "job.json").write_text(json.dumps({"job_id": f"local-{pid}", "scheduler": "local", "pid": pid,
                                               "pgid": pid, "start_time": 1}))
    code, out, err = cli("status", f"local-{pid}")
    assert code == 0 and str(good) in out, err


def test_logs_decode_characters_split_across_reads(tmp_path, monkeypatch):
    """follow_output reads in pieces: a UTF-8 character cut in two by a read still comes out whole."""
    import io

    from hpcvod.jobs.jobdir import ref_from_dir
    from hpcvod.jobs.watch import follow_output

    folder = _job_folder(tmp_path)
    (folder / "output.log").write_text("é" * 10 + "\n", encoding="utf-8")
    ref = ref_from_dir(folder)
    out = io.StringIO()
    real_open = os.fdopen

    class Tiny(io.RawIOBase):  # one byte per read
        def __init__(self, f):
            self.f = f

        def readable(self):
            return True

        def readinto(self, b):
            data = self.f.read(1)
            b[:len(data)] = data
            return len(data)

        def seek(self, *a):
            return self.f.seek(*a)

        def close(self):
            self.f.close()
            super().close()

    monkeypatch.setattr("hpcvod.jobs.watch.open_job_file",
                        lambda path, what: Tiny(real_open(os.open(path, os.O_RDONLY), "rb")))
    follow_output(ref, out, follow=False)
    assert out.getvalue() == "é" * 10 + "\n"
