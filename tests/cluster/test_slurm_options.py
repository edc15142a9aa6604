"""Per-job scheduler options submitted for real on the sandbox Slurm cluster (issue 12, item 1): an array of 3
with its logs, exit statuses and states per task, a dependency on a job folder that holds a job until the first
has ended, an exclusive job, a --begin in the future that stays pending until cancelled, and a --constraint the
nodes lack that sbatch refuses and hpcvod reports in one line."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest

from cluster_helpers import Cluster, hpcvod, hpcvod_status, submitted, wait_for_status

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

SITE = ("--site", "slurm-sandbox", "--tasks-per-node", "1", "--time", "5")

SHOW = """import os, socket, sys, time
print("index=%s slurm=%s host=%s" % (os.environ.get("HPCVOD_ARRAY_INDEX"), os.environ.get("SLURM_ARRAY_TASK_ID"),
                                     socket.gethostname()))
if len(sys.argv) > 1:
    time.sleep(float(sys.argv[1]))
if len(sys.argv) > 2:
    open(sys.argv[2], "w").write("done\\n")
"""

NEEDS = """import os, sys
print("first job's mark: " + (open(sys.argv[1]).read().strip() if os.path.exists(sys.argv[1]) else "MISSING"))
"""


def _write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(text)


def _submit(tmp_path: Path, *args: str) -> tuple[str, Path]:
    done = hpcvod("submit", *SITE, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return submitted(done)


def _wait_tasks(job: str, cwd: Path, count: int, timeout: float = 120) -> dict:
    """`hpcvod status --json` until every array task has ended; returns that status."""
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        status = hpcvod_status(job, cwd)
        tasks = status.get("tasks", [])
        if len(tasks) == count and all(t["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") for t in tasks):
            return status
        time.sleep(0.5)
    raise AssertionError(f"array job {job}: tasks not all ended after {timeout} s: {status}")


def test_array_of_three_all_finish_with_logs_and_states_per_task(slurm_cluster: Cluster, tmp_path: Path) -> None:
    _write(tmp_path, "show.py", SHOW)
    job, job_dir = _submit(tmp_path, "--array", "0-2", "show.py")
    status = _wait_tasks(job, tmp_path, 3)
    assert [(t["index"], t["state"], t["exit_code"]) for t in status["tasks"]] == [
        (0, "COMPLETED", 0), (1, "COMPLETED", 0), (2, "COMPLETED", 0)], status
    for index in range(3):
        log = (job_dir / f"output.{index}.log").read_text()
        assert f"index={index} slurm={index} " in log, log  # the hpcvod variable and Slurm's agree
        assert (job_dir / f"exitcode.{index}").read_text().strip() == "0"
    assert not (job_dir / "output.log").exists()
    text = hpcvod("status", job, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert [line.split()[:3] for line in text.stdout.splitlines()[1:]] == [
        ["task", str(i), "COMPLETED"] for i in range(3)], text.stdout
    assert wait_for_status(job, tmp_path, ["COMPLETED"], timeout=60)["state"] == "COMPLETED"


def test_dependency_on_a_job_folder_holds_the_job_until_the_first_ends(slurm_cluster: Cluster,
                                                                      tmp_path: Path) -> None:
    _write(tmp_path, "first.py", SHOW)
    _write(tmp_path, "second.py", NEEDS)
    mark = tmp_path / "first-done"
    first, first_dir = _submit(tmp_path, "first.py", "20", str(mark))  # long enough to see the second wait
    # the first job named by its folder's name, as `hpcvod jobs` lists it: hpcvod hands Slurm its job id
    second, second_dir = _submit(tmp_path, "--dependency", f"afterok:{first_dir.name}", "second.py", str(mark))
    assert f"--dependency=afterok:{first}" in (second_dir / "job.sbatch").read_text()
    waiting = wait_for_status(second, tmp_path, ["PENDING"], timeout=30)
    assert "Dependency" in waiting["reason"], waiting
    assert hpcvod_status(first, tmp_path)["state"] in ("PENDING", "RUNNING")
    wait_for_status(second, tmp_path, ["COMPLETED", "FAILED"], timeout=120)
    assert hpcvod_status(first, tmp_path)["state"] == "COMPLETED"
    assert "first job's mark: done" in (second_dir / "output.log").read_text()


def test_exclusive_job_gets_whole_nodes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    _write(tmp_path, "show.py", SHOW)
    job, job_dir = _submit(tmp_path, "--exclusive", "show.py", "3")
    assert "#SBATCH --exclusive" in (job_dir / "job.sbatch").read_text()
    fields = slurm_cluster.job(job)
    assert fields.get("OverSubscribe") == "NO", fields  # Slurm's word for a job that shares its nodes with none
    assert wait_for_status(job, tmp_path, ["COMPLETED", "FAILED"], timeout=120)["state"] == "COMPLETED"


def test_begin_in_the_future_stays_pending_until_cancelled(slurm_cluster: Cluster, tmp_path: Path) -> None:
    _write(tmp_path, "show.py", SHOW)
    later = (datetime.datetime.now() + datetime.timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%S")
    job, _ = _submit(tmp_path, "--begin", later, "show.py")
    time.sleep(3)  # the scheduler has had its chances to start it
    status = wait_for_status(job, tmp_path, ["PENDING"], timeout=30)
    assert status["reason"] == "BeginTime", status
    cancel = hpcvod("cancel", job, cwd=tmp_path)
    assert cancel.returncode == 0, cancel.stderr
    assert wait_for_status(job, tmp_path, ["CANCELLED"], timeout=60)["state"] == "CANCELLED"


def test_constraint_the_nodes_lack_is_refused_in_one_line(slurm_cluster: Cluster, tmp_path: Path) -> None:
    _write(tmp_path, "show.py", SHOW)
    done = hpcvod("submit", *SITE, "--constraint", "quantum", "show.py", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcvod: sbatch refused the job: "), done.stderr
    assert "feature" in lines[0].lower(), lines[0]  # Slurm: "Invalid feature specification"
    assert "Traceback" not in done.stderr
    jobs_root = tmp_path / "hpcvod-jobs"
    assert not jobs_root.exists() or not any(jobs_root.iterdir())  # nothing half-done: no folder left
