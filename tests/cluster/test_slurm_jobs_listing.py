"""`hpcvod jobs` asks the real Slurm once per listing (issue 25 item 8): one squeue for every folder, at most one
sacct for the jobs squeue no longer lists, and a finished job's exit file for the rest. The scheduler commands are
counted by a shim first on PATH that logs each call and execs the real command."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from cluster_helpers import Cluster, hpcvod, submitted, wait_for_status

pytestmark = [pytest.mark.cluster, pytest.mark.mpi, pytest.mark.timeout(240)]

GATED = """
import os, sys, time
from mpi4py import MPI
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
sys.exit(int(sys.argv[2]))
"""
COMMANDS = ("squeue", "sacct", "scontrol", "sinfo", "scancel", "sbatch")


def _counting_path(tmp: Path) -> tuple[dict[str, str], Path]:
    """An environment whose PATH starts with shims of the Slurm commands, and the file they log to."""
    shims, log = tmp / "shims", tmp / "calls.log"
    shims.mkdir()
    for name in COMMANDS:
        real = shutil.which(name)
        assert real, name
        shim = shims / name
        shim.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexec "{real}" "$@"\n')
        shim.chmod(0o755)
    return {"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}, log


def _calls(log: Path) -> Counter:
    counts = Counter(line.split(" ", 1)[0] for line in log.read_text().splitlines()) if log.exists() else Counter()
    log.unlink(missing_ok=True)
    return counts


def test_jobs_asks_slurm_once_per_listing_not_per_folder(slurm_cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "gated.py").write_text(GATED)
    jobs: dict[str, tuple[str, Path]] = {}
    for name, code in (("ok", 0), ("fails", 3), ("also-ok", 0), ("runs", 0)):
        if name != "runs":
            (tmp_path / f"go-{name}").touch()
        sub = hpcvod("submit", "--site", "slurm-sandbox", "--nodes", "1", "--tasks-per-node", "1", "--time", "5",
                     "--job-name", name, "gated.py", str(tmp_path / f"go-{name}"), str(code), cwd=tmp_path)
        assert sub.returncode == 0, sub.stdout + sub.stderr
        jobs[name] = submitted(sub)
    for name in ("ok", "fails", "also-ok"):
        wait_for_status(jobs[name][0], tmp_path, {"COMPLETED", "FAILED"})
    wait_for_status(jobs["runs"][0], tmp_path, {"RUNNING"})
    # jobs slurmctld has forgotten (MinJobAge) and accounting never knew: copies of a finished folder with ids
    # Slurm has not handed out
    forgotten = {}
    for index in range(3):
        folder = jobs["fails"][1].with_name(f"forgotten-{index}")
        shutil.copytree(jobs["fails"][1], folder)
        record = json.loads((folder / "job.json").read_text())
        record["job_id"] = str(900000 + index)
        (folder / "job.json").write_text(json.dumps(record))
        forgotten[record["job_id"]] = folder
    env, log = _counting_path(tmp_path)
    try:
        # before: where each folder stands asked one job at a time (what `hpcvod jobs` did for every folder)
        _calls(log)
        for folder in [folder for _, folder in jobs.values()] + list(forgotten.values()):
            assert hpcvod("status", "--json", folder, cwd=tmp_path, env=env).returncode == 0
        one_by_one = _calls(log)
        listing = hpcvod("jobs", "--json", cwd=tmp_path, env=env)
        assert listing.returncode == 0, listing.stderr
        at_once = _calls(log)
    finally:
        (tmp_path / "go-runs").touch()
    rows = {row["job_id"]: row for row in json.loads(listing.stdout)}
    assert {job: (rows[job]["state"], rows[job]["exit_code"]) for job, _ in jobs.values() if job in rows} == {
        jobs["ok"][0]: ("COMPLETED", 0), jobs["fails"][0]: ("FAILED", 3), jobs["also-ok"][0]: ("COMPLETED", 0),
        jobs["runs"][0]: ("RUNNING", rows[jobs["runs"][0]]["exit_code"])}
    assert all((rows[job]["state"], rows[job]["exit_code"]) == ("FAILED", 3) for job in forgotten), rows
    print(f"7 folders, scheduler calls: one by one {dict(one_by_one)}, hpcvod jobs {dict(at_once)}")
    assert at_once["squeue"] == 1 and at_once["sacct"] <= 1 and at_once["scontrol"] == 0, at_once
    assert sum(at_once.values()) <= 2 < sum(one_by_one.values()), (at_once, one_by_one)
    # one by one, each forgotten job costs a squeue, a scontrol and (with accounting) a sacct
    assert one_by_one["squeue"] >= 7 and one_by_one["scontrol"] >= 3, one_by_one
