"""Knowing where your jobs stand, on the real Slurm test cluster: a pending job's reason (Resources, Dependency)
and expected start in `status --wait`'s lines and in `status --json`, Ctrl-C (SIGINT) that stops the waiting and
leaves the job queued, `hpcvod jobs` over Slurm job folders, and `logs -f` that follows a job through a requeue."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cluster_helpers import (REPO, WORKERS, Cluster, cli_env, hpcvod, hpcvod_status, run, submitted,
                             wait_for_file, wait_for_status)

pytestmark = [pytest.mark.cluster, pytest.mark.mpi, pytest.mark.timeout(300)]

TWO_BY_TWO = ("--nodes", "2", "--tasks-per-node", "2")  # both sandbox nodes, every CPU: the next job waits
SLEEPER = "import time\nprint('holding the nodes', flush=True)\ntime.sleep(float(__import__('sys').argv[1]))\n"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}


def _submit(cwd: Path, *args: str) -> tuple[str, Path]:
    sub = hpcvod("submit", "--site", "slurm-sandbox", *TWO_BY_TWO, "--time", "3", *args, cwd=cwd)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    return submitted(sub)


def _read_until(proc: subprocess.Popen, pattern: str, timeout: float = 60) -> str:
    """stderr of ``proc`` (line by line) until a line matches ``pattern``."""
    seen, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        if not line:
            break
        seen += line
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"no line like /{pattern}/ within {timeout} s:\n{seen}")


def test_pending_reasons_expected_start_and_ctrl_c_leave_the_job_queued(slurm_cluster: Cluster, tmp_path: Path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    blocker, _ = _submit(tmp_path, "sleeper.py", "150")
    wait_for_status(blocker, tmp_path, {"RUNNING"})
    waiting, waiting_dir = _submit(tmp_path, "sleeper.py", "1")
    after, _ = _submit(tmp_path, "--dependency", f"afterok:{waiting}", "sleeper.py", "1")
    try:
        status = wait_for_status(waiting, tmp_path, {"PENDING"})
        deadline = time.monotonic() + 60  # the backfill scheduler computes the expected start within seconds
        # the reason comes first; the expected start once the backfill scheduler has gone over the queue
        while (status["reason"] != "Resources" or not status["start_time"]) and time.monotonic() < deadline:
            time.sleep(1)
            status = hpcvod_status(waiting, tmp_path)
        assert status["reason"] == "Resources", status
        assert status["start_time"] and status["start_time"] > time.time() - 60, status  # Slurm's expected start
        assert wait_for_status(after, tmp_path, {"PENDING"})["reason"] == "Dependency"

        # no terminal: a plain line per change, with the reason and the expected start squeue --start shows
        proc = subprocess.Popen([REPO / ".venv" / "bin" / "python", "-m", "hpcvod.cli", "status", "--wait", waiting],
                                cwd=tmp_path, env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True,
                                # Ctrl-C reaches it even when the tests run as a background job (SIGINT ignored)
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        seen = _read_until(proc, rf"^job {waiting}: PENDING \(Resources\)  expected start \d{{4}}-\d\d-\d\d \d\d:\d\d$")
        shown = re.search(r"expected start (\S+ \S+)", seen).group(1)
        slurm_says = run(["squeue", "--start", "--noheader", "--jobs", waiting, "--format", "%S"]).stdout.strip()
        assert slurm_says.replace("T", " ")[:16] == shown, (slurm_says, seen)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        rest = proc.communicate(timeout=30)
        assert proc.returncode == 130, rest
        assert f"job {waiting} goes on" in rest[1] and f"hpcvod cancel {waiting_dir}" in rest[1], rest
        assert slurm_cluster.state(waiting) == "PENDING"  # still queued: waiting stopped, not the job

        # the blocker has served its purpose: ending it lets the other two run now instead of in two minutes
        run(["scancel", blocker], timeout=30)
        dependent = hpcvod("status", "--wait", after, cwd=tmp_path, timeout=200)
        assert dependent.returncode == 0, dependent.stdout + dependent.stderr
        lines = dependent.stderr.splitlines()
        assert lines[0] == f"job {after}: PENDING (Dependency)" and lines[-1] == f"job {after}: COMPLETED (exit 0)", lines

        table = hpcvod("jobs", "--json", cwd=tmp_path)
        rows = {row["job_id"]: row for row in json.loads(table.stdout)}
        assert [rows[j]["state"] for j in (blocker, waiting, after)] == ["CANCELLED", "COMPLETED", "COMPLETED"], rows
        assert all(rows[j]["site"] == "slurm-sandbox" and rows[j]["elapsed_seconds"] is not None
                   for j in (blocker, waiting, after)), rows
        assert [row["job_id"] for row in json.loads(table.stdout)][:3] == [after, waiting, blocker]
    finally:
        run(["scancel", blocker, waiting, after], timeout=30)


def test_logs_follow_a_job_through_a_requeue(slurm_cluster: Cluster, tmp_path: Path):
    """`logs -f` started while the job runs keeps following it through `scontrol requeue` (PENDING, then a
    second run appending to output.log) and ends when the job does, having printed the whole log."""
    shutil.copy(WORKERS / "train_linear.py", tmp_path / "train.py")
    job, job_dir = _submit(tmp_path, "train.py", "--steps", "40", "--sleep", "0.1")
    wait_for_file(job_dir / "applied.log", timeout=90, predicate=lambda text: text.count("\n") >= 10)
    follow = subprocess.Popen([REPO / ".venv" / "bin" / "python", "-m", "hpcvod.cli", "logs", "-f", job],
                              cwd=tmp_path, env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert run(["scontrol", "requeue", job], timeout=30).returncode == 0
        out, err = follow.communicate(timeout=240)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    assert wait_for_status(job, tmp_path, FINISHED)["state"] == "COMPLETED"
    assert int(slurm_cluster.job(job).get("Restarts", "0")) >= 1
    assert out == (job_dir / "output.log").read_text()
    assert "[0]<stdout>: resumed at step" in out and "[0]<stdout>: done: 40 steps" in out, out[-3000:]
    one = hpcvod("logs", "--rank", "3", job, cwd=tmp_path).stdout.splitlines()
    assert one and all(line.startswith("[3]<") for line in one), one
    assert sum("rank 3/4 on n2" in line for line in one) == 2, one  # its start line, once per run


def test_logs_and_jobs_of_an_array_job(slurm_cluster: Cluster, tmp_path: Path):
    """An array job keeps a log per task (output.<index>.log): `logs` prints each under a header, `--rank` filters
    inside each, and `jobs` lists the job once."""
    (tmp_path / "hello.py").write_text(
        "import os\nimport hpcvod.runtime as hvd\nhvd.init()\n"
        "print(f\"task {os.environ['HPCVOD_ARRAY_INDEX']} rank {hvd.rank()}\", flush=True)\n")
    sub = hpcvod("submit", "--site", "slurm-sandbox", "--nodes", "1", "--tasks-per-node", "2", "--time", "2",
                 "--array", "0-1", "--wait", "hello.py", cwd=tmp_path)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    job, _ = submitted(sub)
    logs = hpcvod("logs", job, cwd=tmp_path).stdout.splitlines()
    assert logs[0] == "==> array task 0: output.0.log <==" and "==> array task 1: output.1.log <==" in logs, logs
    for task in (0, 1):
        for rank in (0, 1):
            assert f"[{rank}]<stdout>: task {task} rank {rank}" in logs, logs
    one = hpcvod("logs", "--rank", "1", job, cwd=tmp_path).stdout.splitlines()
    assert [line for line in one if not line.startswith("==>")] == \
        ["[1]<stdout>: task 0 rank 1", "[1]<stdout>: task 1 rank 1"], one
    rows = json.loads(hpcvod("jobs", "--json", cwd=tmp_path).stdout)
    assert [(r["job_id"], r["state"]) for r in rows] == [(job, "COMPLETED")], rows
