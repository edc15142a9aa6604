"""Waiting for a job on the real `local` site (issue 25 items 7, 8 and small ones): `submit --follow` streams rank
0's output while the job runs, the live line shows the time left of --time, polling backs off while nothing
changes (jobs.poll_interval / jobs.poll_max), `--wait` beside `--dry-run` is refused, and `cancel` of a job
that has ended says so and leaves its end as it was."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hpcvod.jobs.jobdir import ref_from_dir
from hpcvod.jobs.watch import Backoff, progress, timing, wait_for
from hpcvod.schedulers.base import RUNNING, JobStatus
from submission_helpers import clean_env, hpcvod, one_error_line, submit_local, wait_until_finished

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

# rank 0 and 1 each say a line, then wait for the test's go (a file) before the last line: the job is surely still
# running when the first line reaches the test
GATED = """
import os, sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.rank
print(f"first line of rank {rank}", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print(f"last line of rank {rank}", flush=True)
"""


def test_submit_follow_streams_rank_0_while_the_job_runs(tmp_path: Path) -> None:
    (tmp_path / "gated.py").write_text(GATED)
    go = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-m", "hpcvod.cli", "submit", "--site", "local", "--tasks-per-node",
                             "2", "--follow", "gated.py", str(go)], cwd=tmp_path, env=clean_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        submitted = proc.stdout.readline()
        assert submitted.startswith("submitted job local-"), submitted
        first = proc.stdout.readline()  # arrives while the job waits for `go`: streamed, not printed at the end
        assert first == "[0]<stdout>: first line of rank 0\n", first
        job_dir = Path(submitted.rsplit("folder: ", 1)[1].strip())
        running = hpcvod("status", "--json", str(job_dir), cwd=tmp_path, env=clean_env(tmp_path))
        assert json.loads(running.stdout)["state"] == RUNNING
        go.write_text("")
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert rest == "[0]<stdout>: last line of rank 0\n"  # rank 1's lines stay in the log (hpcvod logs)
    assert "rank 1" not in first + rest
    assert "COMPLETED" in err and "Traceback" not in err


def test_the_live_line_says_the_time_left_of_the_walltime() -> None:
    status = JobStatus(RUNNING, start_time=1000.0)
    assert timing(status, None, 1070.0, 3600) == "running 1:10, 58:50 left of 1:00:00"
    assert timing(status, None, 1070.0) == "running 1:10"
    assert timing(status, None, 4700.0, 3600) == "running 1:01:40, 0:00 left of 1:00:00"  # past it: 0, never -


@pytest.mark.parametrize("flag", ["--wait", "--follow", "--show-output"])
def test_waiting_beside_dry_run_is_refused(tmp_path: Path, flag: str) -> None:
    (tmp_path / "train.py").write_text("")
    done = hpcvod("submit", "--site", "local", "--dry-run", flag, "train.py", cwd=tmp_path)
    one_error_line(done.returncode, done.stderr, f"{flag} waits for a job, and --dry-run submits none")
    assert done.stdout == "" and not (tmp_path / "hpcvod-jobs").exists()


def test_follow_and_show_output_together_are_refused(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    done = hpcvod("submit", "--site", "local", "--follow", "--show-output", "train.py", cwd=tmp_path)
    one_error_line(done.returncode, done.stderr, "--follow", "--show-output")
    assert not (tmp_path / "hpcvod-jobs").exists()


def test_cancel_of_a_job_that_ended_says_so_and_keeps_its_end(tmp_path: Path) -> None:
    (tmp_path / "fails.py").write_text("import sys\nfrom mpi4py import MPI\nsys.exit(3)\n")
    job, job_dir = submit_local(tmp_path, "fails.py")
    assert wait_until_finished(job, tmp_path, clean_env(tmp_path))["state"] == "FAILED"
    done = hpcvod("cancel", job, cwd=tmp_path, env=clean_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"job {job} already ended (FAILED, exit 3): nothing to cancel\n"
    assert not (job_dir / "cancelled").exists()  # a mark would turn the FAILED job into CANCELLED
    after = hpcvod("status", "--json", job, cwd=tmp_path, env=clean_env(tmp_path))
    assert (json.loads(after.stdout)["state"], json.loads(after.stdout)["exit_code"]) == ("FAILED", 3)


def test_backoff_grows_by_half_up_to_the_max_and_starts_again_after_a_change() -> None:
    backoff = Backoff(2.0, 10.0)
    assert [backoff.next(False) for _ in range(6)] == [2.0, 3.0, 4.5, 6.75, 10.0, 10.0]
    assert backoff.next(True) == 2.0 and backoff.next(False) == 3.0
    assert Backoff(5.0, 1.0).next(False) == 5.0  # a max below the start is the start


def test_waiting_asks_less_often_while_nothing_changes(tmp_path: Path) -> None:
    """jobs.poll_interval / jobs.poll_max of the job's site set the waits between questions; the waits handed to
    sleep are recorded (the test's sleep lets real time pass until the job's go)."""
    (tmp_path / "gated.py").write_text(GATED)
    (tmp_path / "site.yaml").write_text("extends: local\njobs:\n  poll_interval: 0.01\n  poll_max: 0.05\n")
    go = tmp_path / "go"
    job, job_dir = submit_local(tmp_path, "--site", str(tmp_path / "site.yaml"), "gated.py", str(go))
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 12:
            go.write_text("")  # enough questions while nothing changed: let the job end
        threading.Event().wait(0.02)

    status = wait_for(ref_from_dir(job_dir), io.StringIO(), sleep=sleep, live=False)
    assert status.state == "COMPLETED"
    assert waits[:6] == pytest.approx([0.01, 0.015, 0.0225, 0.03375, 0.05, 0.05])
    assert max(waits) == pytest.approx(0.05)


def test_a_long_local_step_shows_progress_on_a_terminal_only() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    shown = Terminal()
    drawn = threading.Event()
    with progress(shown, "checking the MPI the job's Python loads", tick=0.01, on_draw=drawn.set):
        assert drawn.wait(30)  # the line is up while the step runs
    assert "checking the MPI the job's Python loads" in shown.getvalue()
    assert shown.getvalue().endswith("\r\x1b[K")  # and gone once it is done
    plain = io.StringIO()
    with progress(plain, "checking", tick=0.01):
        pass
    assert plain.getvalue() == ""  # a log file gets no progress lines
