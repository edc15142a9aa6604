"""`hpcvod cancel` on the local scheduler signals only the job script that hpcvod started (issue 10, item 1).

A job.json naming another process (a pid the OS reused, an edited file) or a bare local-PID of a process that is
no hpcvod job is refused with one line, and that process lives on; status does not call it RUNNING."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from submission_helpers import clean_env, hpcvod, one_error_line


def _start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


@pytest.fixture
def sleepers():
    """`sleep` processes of this test, each in a session of its own (a wrongly sent killpg hits only it)."""
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _folder(tmp_path: Path, **record) -> Path:
    folder = tmp_path / "hpcvod-jobs" / f"job-{len(list(tmp_path.glob('hpcvod-jobs/*')))}"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"scheduler": "local", **record}))
    (folder / "request.json").write_text(json.dumps({"plan": {"site": "local", "scheduler": "local"}}))
    return folder


def _refused(code: int, err: str, *pieces: str) -> None:
    one_error_line(code, err, "not signalling pid", "nothing was killed", *pieces)


def test_job_json_naming_another_process_is_refused(tmp_path, cli, sleepers):
    sleep = sleepers()
    pid = sleep.pid
    other = sleepers()
    cases = {  # what job.json says -> what the refusal says
        "right start time, but not the job script": ({"start_time": _start_time(pid)}, "runs 'sleep 300', not the job script"),
        "wrong start time (a reused pid)": ({"start_time": _start_time(pid) - 1}, "the pid was reused"),
        "no start time": ({"start_time": None}, "no start time"),
        "another process group": ({"start_time": _start_time(pid), "pgid": other.pid}, f"not in {other.pid}"),
    }
    for label, (changes, reason) in cases.items():
        folder = _folder(tmp_path, **{"job_id": f"local-{pid}", "pid": pid, "pgid": pid, **changes})
        code, _, err = cli("cancel", str(folder))
        _refused(code, err, str(folder / "job.json"), reason)
        time.sleep(0.1)
        assert _alive(sleep) and _alive(other), label
        assert not (folder / "cancelled").exists(), label  # nothing half-done
        code, out, err = cli("status", "--json", str(folder))
        assert code == 0, err
        assert json.loads(out)["state"] != "RUNNING", label


def test_bare_local_pid_of_another_process_is_refused(tmp_path, cli, sleepers):
    sleep = sleepers()
    code, _, err = cli("cancel", f"local-{sleep.pid}")
    _refused(code, err, "is not a job script that hpcvod started")
    time.sleep(0.1)
    assert _alive(sleep)
    code, out, err = cli("status", "--json", f"local-{sleep.pid}")
    assert code == 0, err
    assert json.loads(out)["state"] == "UNKNOWN"


def test_bare_local_pid_that_does_not_run(cli):
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    code, _, err = cli("cancel", f"local-{pid}")
    assert code == 0, err  # nothing to signal


@pytest.mark.mpi
def test_a_real_local_job_is_still_found_and_cancelled_by_bare_id(tmp_path):
    """The job folder is elsewhere (not under ./hpcvod-jobs): the bare local-PID is traced to it through the
    process's own output.log, checked against its job.json, and cancelled."""
    (tmp_path / "sleeper.sh").write_text("#!/bin/sh\nsleep 300\n")
    (tmp_path / "sleeper.sh").chmod(0o755)
    env = clean_env(tmp_path)
    done = hpcvod("submit", "--json", "--site", "local", "--tasks-per-node", "1", "--output-dir",
                  str(tmp_path / "elsewhere"), "./sleeper.sh", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    other_cwd = tmp_path / "other"
    other_cwd.mkdir()
    try:
        status = json.loads(hpcvod("status", "--json", job["job_id"], cwd=other_cwd, env=env).stdout)
        assert status["state"] == "RUNNING" and status["job_dir"] is None
        done = hpcvod("cancel", job["job_id"], cwd=other_cwd, env=env)
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = json.loads(hpcvod("status", "--json", job["job_dir"], cwd=tmp_path, env=env).stdout)
            if status["state"] != "RUNNING":
                break
            time.sleep(0.2)
        assert status["state"] in ("FAILED", "CANCELLED") and status["exit_code"] == 143, status
    finally:
        hpcvod("cancel", job["job_dir"], cwd=tmp_path, env=env)
