"""Per-job scheduler options on a real Grid Engine (scripts/sge-sandbox.sh): an array job (-t, -tc) whose tasks
see HPCVOD_ARRAY_INDEX, write output.<index>.log and exitcode.<index>, and are listed by `hpcvod status`; a hold
(-hold_jid) on a job folder."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cluster_helpers import hpcvod, hpcvod_status, submitted, wait_for_status

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

SHOW = """import os, sys, time
print("index=%s sge=%s" % (os.environ.get("HPCVOD_ARRAY_INDEX"), os.environ.get("SGE_TASK_ID")))
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""
SITE = ("--site", "sge-sandbox", "--tasks-per-node", "1", "--time", "5")


def test_array_job_tasks_see_their_index_and_keep_their_logs(sge_cluster: None, tmp_path: Path) -> None:
    (tmp_path / "show.py").write_text(SHOW)
    done = hpcvod("submit", *SITE, "--array", "1-3%2", "show.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    job, job_dir = submitted(done)
    script = (job_dir / "job.sge").read_text()
    assert "#$ -t 1-3:1\n" in script and "#$ -tc 2\n" in script
    deadline = time.monotonic() + 150
    status: dict = {}
    while time.monotonic() < deadline:
        status = hpcvod_status(job, tmp_path)
        if [t["state"] for t in status.get("tasks", [])] == ["COMPLETED"] * 3:
            break
        time.sleep(1)
    assert [(t["index"], t["state"], t["exit_code"]) for t in status["tasks"]] == [
        (1, "COMPLETED", 0), (2, "COMPLETED", 0), (3, "COMPLETED", 0)], status
    for index in (1, 2, 3):
        assert f"index={index} sge={index}" in (job_dir / f"output.{index}.log").read_text()
    assert wait_for_status(job, tmp_path, ["COMPLETED"], timeout=90)["state"] == "COMPLETED"


def test_hold_on_a_job_folder(sge_cluster: None, tmp_path: Path) -> None:
    (tmp_path / "show.py").write_text(SHOW)
    first = hpcvod("submit", *SITE, "show.py", "15", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    first_id, first_dir = submitted(first)
    second = hpcvod("submit", *SITE, "--dependency", f"afterany:{first_dir}", "show.py", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    second_id, second_dir = submitted(second)
    assert f"#$ -hold_jid {first_id}\n" in (second_dir / "job.sge").read_text()
    assert hpcvod_status(second_id, tmp_path)["state"] == "PENDING"  # held (hqw) while the first runs
    wait_for_status(second_id, tmp_path, ["COMPLETED", "FAILED"], timeout=150)
    assert hpcvod_status(first_id, tmp_path)["state"] == "COMPLETED"
