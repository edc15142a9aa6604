"""hpcvod's `sge` scheduler against a real Grid Engine (scripts/sge-sandbox.sh, one execution host, 4 slots):
submit/--wait with each MPI flavour, status from qstat and from accounting (qacct), cancel, failures, and the
kept script re-run with plain qsub. Multi-host Grid Engine is not tested (one execd only)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from cluster_helpers import (WORKERS, flavours, hpcvod, hpcvod_status, parse_probe_lines, require_flavour, run,
                             submitted, wait_for_status)

pytestmark = [pytest.mark.cluster, pytest.mark.mpi, pytest.mark.timeout(240)]

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}
GATED = """\
import os, sys, time
gate, code = sys.argv[1], int(sys.argv[2])
while not os.path.exists(gate):
    time.sleep(0.1)
sys.exit(code)
"""


@pytest.mark.parametrize("name", ["mpich", "openmpi", "impi"])
def test_submit_wait_four_ranks_in_the_parallel_environment(sge_cluster: None, tmp_path: Path, name: str) -> None:
    flavour = flavours()[name]
    require_flavour(flavour)
    shutil.copy(WORKERS / "hvd_world.py", tmp_path / "train.py")
    done = hpcvod("submit", "--site", "sge-sandbox", "--tasks-per-node", "4", "--wait", "train.py", cwd=tmp_path,
                  venv=flavour.venv)
    job, job_dir = submitted(done)
    output = (job_dir / "output.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr + output
    records = parse_probe_lines(output)
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3], output
    assert {(r["size"], r["local_size"], r["cross_size"]) for r in records} == {(4, 4, 1)}, output
    assert all(r["allreduce"] == [10.0, 15.0] for r in records), output
    assert "#$ -pe mpi 4" in (job_dir / "job.sge").read_text()
    status = hpcvod_status(job, tmp_path)
    assert (status["state"], status["exit_code"]) == ("COMPLETED", 0), status
    logs = hpcvod("logs", job, cwd=tmp_path).stdout
    assert len(parse_probe_lines(logs)) == 4

    # the kept script re-runs with plain qsub from its folder
    (job_dir / "output.log").unlink()
    again = run(["qsub", "-terse", "-sync", "y", "job.sge"], cwd=job_dir, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(parse_probe_lines((job_dir / "output.log").read_text())) == 4


def test_status_from_qstat_then_accounting_and_cancel(sge_cluster: None, tmp_path: Path) -> None:
    (tmp_path / "gated.py").write_text(GATED)
    jobs = {}
    # "blocker" takes all 4 slots, so the others wait behind it
    for name, code in (("blocker", 0), ("ok", 0), ("fails", 3), ("cancelled", 0)):
        sub = hpcvod("submit", "--site", "sge-sandbox", "--tasks-per-node", "4", "--job-name", name, "--",
                     "/bin/bash", "-c", f"[ $PMI_RANK$OMPI_COMM_WORLD_RANK = 0 ] || exit 0; "
                     f"{shutil.which('python3')} gated.py go-{name} {code}", cwd=tmp_path)
        assert sub.returncode == 0, sub.stdout + sub.stderr
        jobs[name] = submitted(sub)[0]
    assert wait_for_status(jobs["blocker"], tmp_path, {"RUNNING"})["source"] == "qstat"
    for name in ("ok", "fails", "cancelled"):
        pending = hpcvod_status(jobs[name], tmp_path)
        assert (pending["state"], pending["source"]) == ("PENDING", "qstat"), pending
    (tmp_path / "go-blocker").touch()
    for name in ("ok", "fails"):
        wait_for_status(jobs[name], tmp_path, {"RUNNING"})
        (tmp_path / f"go-{name}").touch()
        wait_for_status(jobs[name], tmp_path, FINISHED)
    wait_for_status(jobs["cancelled"], tmp_path, {"RUNNING"})
    assert hpcvod("cancel", jobs["cancelled"], cwd=tmp_path).returncode == 0
    wait_for_status(jobs["cancelled"], tmp_path, FINISHED, timeout=60)

    # once Grid Engine's accounting file has the records (flushed every few seconds), status comes from qacct
    expected = {jobs["ok"]: ("COMPLETED", 0), jobs["fails"]: ("FAILED", 3), jobs["cancelled"]: ("CANCELLED", None)}
    deadline = time.monotonic() + 60
    while True:
        found = {job: hpcvod_status(job, tmp_path) for job in expected}
        if all(s["source"] == "qacct -j" for s in found.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    for job, (state, code) in expected.items():
        assert found[job]["source"] == "qacct -j" and found[job]["state"] == state, found[job]
        if code is not None:
            assert found[job]["exit_code"] == code, found[job]
