"""Logs a person can read and knowing where jobs stand, on the real `local` site: every line labelled with its rank
and stream, `logs --rank`, `logs -f`, `hpcvod jobs` (also when the scheduler's commands are gone), `--wait`'s
plain lines, its live line on a terminal (a pty), and Ctrl-C that stops the waiting, never the job."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcvod.launchers.label import LABELLED
from submission_helpers import clean_env, hpcvod, submit_local, wait_until_finished

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

TALKER = """
import sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.rank
for i in range(3):
    print(f"step {i} of rank {rank}", flush=True)
print(f"warning from rank {rank}", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and rank == 1 else 0)
"""

SLOW = """
import sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.rank
for i in range(int(sys.argv[1])):
    print(f"tick {i} of rank {rank}", flush=True)
    time.sleep(0.5)
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "talker.py").write_text(TALKER)
    (tmp_path / "slow.py").write_text(SLOW)
    return tmp_path


def test_every_line_of_the_kept_log_and_of_logs_carries_rank_and_stream(workdir):
    job, job_dir = submit_local(workdir, "talker.py")
    wait_until_finished(job, workdir, clean_env(workdir))
    kept = (job_dir / "output.log").read_text().splitlines()
    for rank in (0, 1):
        assert [f"[{rank}]<stdout>: step {i} of rank {rank}" for i in range(3)] == \
            [line for line in kept if line.startswith(f"[{rank}]<stdout>")], kept
        assert f"[{rank}]<stderr>: warning from rank {rank}" in kept, kept
    assert all(LABELLED.match(line) for line in kept), kept  # the local script itself prints nothing here

    logs = hpcvod("logs", job, cwd=workdir, env=clean_env(workdir))
    assert logs.returncode == 0 and logs.stdout.splitlines() == kept, logs.stderr
    one = hpcvod("logs", job_dir.name, "--rank", "1", cwd=workdir, env=clean_env(workdir))
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == [line for line in kept if line.startswith("[1]<")], one.stdout
    assert len(one.stdout.splitlines()) == 4
    nobody = hpcvod("logs", job, "--rank", "7", cwd=workdir, env=clean_env(workdir))  # a rank the job has not
    assert nobody.returncode == 2 and nobody.stdout == "" and "has ranks 0-1" in nobody.stderr, nobody.stderr
    bad = hpcvod("logs", job, "--rank", "-1", cwd=workdir, env=clean_env(workdir))
    assert bad.returncode == 2 and "--rank -1" in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_logs_follow_prints_a_running_job_to_its_end(workdir):
    job, _ = submit_local(workdir, "slow.py", "6")
    follow = hpcvod("logs", "-f", "--rank", "0", job, cwd=workdir, env=clean_env(workdir), timeout=120)
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout.splitlines() == [f"[0]<stdout>: tick {i} of rank 0" for i in range(6)], follow.stdout


def test_jobs_lists_folders_newest_first_with_state_and_exit(workdir):
    first, first_dir = submit_local(workdir, "talker.py")
    wait_until_finished(first, workdir, clean_env(workdir))
    time.sleep(1.1)  # folder names and request times are per second
    second, second_dir = submit_local(workdir, "talker.py", "3")
    wait_until_finished(second, workdir, clean_env(workdir))

    table = hpcvod("jobs", cwd=workdir, env=clean_env(workdir))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NAME", "ID", "SITE", "STATE", "SUBMITTED", "ELAPSED", "EXIT"], lines
    assert lines[1].split()[:4] == [second_dir.name, second, "local", "FAILED"] and lines[1].split()[-1] == "3"
    assert lines[2].split()[:4] == [first_dir.name, first, "local", "COMPLETED"] and lines[2].split()[-1] == "0"

    rows = json.loads(hpcvod("jobs", "--json", cwd=workdir, env=clean_env(workdir)).stdout)
    assert [(r["job_id"], r["state"], r["exit_code"]) for r in rows] == [(second, "FAILED", 3), (first, "COMPLETED", 0)]
    assert all(r["site"] == "local" and r["submitted"] and r["elapsed_seconds"] is not None for r in rows), rows


def test_jobs_keeps_working_when_the_scheduler_has_forgotten_the_job(workdir, tmp_path):
    """A Slurm job folder read where squeue, scontrol and sacct are gone (or no longer know the id): its row
    comes from the exit status the script recorded, and a broken folder is a row, not the end of the list."""
    job, job_dir = submit_local(workdir, "talker.py")
    wait_until_finished(job, workdir, clean_env(workdir))
    forgotten = job_dir.parent / "train-20200101-000000"
    shutil.copytree(job_dir, forgotten)
    record = json.loads((forgotten / "job.json").read_text())
    (forgotten / "job.json").write_text(json.dumps({**record, "job_id": "4242", "scheduler": "slurm"}))
    broken = job_dir.parent / "broken-20200101-000000"
    broken.mkdir()
    (broken / "request.json").write_text("{not json")
    os.utime(forgotten / "request.json", (1, 1))
    os.utime(broken / "request.json", (0, 0))
    for path, gone in ((os.environ["PATH"], False), (str(Path(sys.executable).parent), True)):
        env = clean_env(workdir, PATH=path)  # Slurm's commands where this machine has them, then none at all
        rows = json.loads(hpcvod("jobs", "--json", cwd=workdir, env=env).stdout)
        assert [r["name"] for r in rows] == [job_dir.name, forgotten.name, broken.name], rows
        assert rows[1]["job_id"] == "4242" and rows[1]["state"] == "COMPLETED" and rows[1]["exit_code"] == 0, rows
        assert ("squeue: command not found" in rows[1]["note"]) == gone, rows[1]
        assert rows[2]["state"] == "BROKEN" and "request.json" in rows[2]["note"], rows[2]
        table = hpcvod("jobs", cwd=workdir, env=env).stdout.splitlines()
        assert table[2].split()[:4] == [forgotten.name, "4242", "local", "COMPLETED"], table


def test_wait_without_a_terminal_prints_plain_lines(workdir):
    done = hpcvod("submit", "--site", "local", "--tasks-per-node", "2", "--wait", "talker.py", "4", cwd=workdir,
                  env=clean_env(workdir))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert "\r" not in done.stderr and "\x1b" not in done.stderr
    assert re.fullmatch(r"job local-\d+: FAILED \(exit 4\)", lines[-1]), lines


def _pty_run(argv: list[str], cwd: Path, env: dict[str, str], until: str, timeout: float = 60
             ) -> tuple[subprocess.Popen, str]:
    """Start argv with a pty as stdout/stderr; read until ``until`` appears (or the time is up)."""
    main_fd, sub_fd = pty.openpty()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=sub_fd, stderr=sub_fd,
                            # Ctrl-C reaches it even when the tests run as a background job (SIGINT ignored there)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(sub_fd)
    text, deadline = "", time.monotonic() + timeout
    while until not in text and time.monotonic() < deadline:
        ready, _, _ = select.select([main_fd], [], [], 0.5)
        if ready:
            try:
                text += os.read(main_fd, 65536).decode(errors="replace")
            except OSError:
                break
    proc._hpcvod_pty = main_fd  # type: ignore[attr-defined]
    return proc, text


def _pty_rest(proc: subprocess.Popen, timeout: float = 60) -> str:
    text, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc._hpcvod_pty], [], [], 0.5)  # type: ignore[attr-defined]
        if ready:
            try:
                chunk = os.read(proc._hpcvod_pty, 65536)  # type: ignore[attr-defined]
            except OSError:
                break
            if not chunk:
                break
            text += chunk.decode(errors="replace")
        elif proc.poll() is not None:
            break
    proc.wait(timeout=timeout)
    os.close(proc._hpcvod_pty)  # type: ignore[attr-defined]
    return text


def test_status_wait_on_a_terminal_is_one_live_line_and_ctrl_c_leaves_the_job_running(workdir):
    job, job_dir = submit_local(workdir, "slow.py", "600")
    env = clean_env(workdir)
    argv = [sys.executable, "-m", "hpcvod.cli", "status", "--wait", job]
    proc, seen = _pty_run(argv, workdir, env, until="running 0:0")
    assert "\r\x1b[K" in seen and f"job {job}: RUNNING" in seen and "waited 0:0" in seen, seen
    assert "\n" not in seen.strip("\r\n"), seen  # rewritten in place, not a line per poll
    proc.send_signal(signal.SIGINT)
    rest = _pty_rest(proc)
    assert proc.returncode == 130, rest
    assert f"job {job} goes on" in rest and f"hpcvod cancel {job_dir}" in rest, rest
    status = json.loads(hpcvod("status", "--json", job, cwd=workdir, env=env).stdout)
    assert status["state"] == "RUNNING", status
    assert hpcvod("cancel", job, cwd=workdir, env=env).returncode == 0
    assert wait_until_finished(job, workdir, env)["state"] == "CANCELLED"
