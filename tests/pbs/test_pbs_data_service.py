"""A PBS job with a tf.data service compute job (submit --data-service-nodes, issue 14) run as PBS's MOM would run
it (tests/pbs/test_pbs_script_body.py: no PBS server here): `select=` asks for two chunk kinds, the script splits
PBS_NODEFILE into the compute part's hosts and the training's, starts both, and ends the compute job after the
training. The node file names this machine only (one host), so the split is checked by its line counts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from test_pbs_script_body import render_job, run_like_pbs_mom, venv_or_skip

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "cluster" / "workers" / "tf_data_service_train.py"

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks, pytest.mark.timeout(240)]


def test_pbs_data_service_job_splits_the_node_file_and_trains(tmp_path: Path) -> None:
    venv = venv_or_skip("mpich")
    if subprocess.run([str(venv / "bin" / "python"), "-c", "import tensorflow"], capture_output=True).returncode:
        pytest.skip(f"tensorflow is not installed in {venv}")
    # 2 compute ranks + 2 training ranks = the 4 lines run_like_pbs_mom writes to the node file
    job_dir = render_job(tmp_path, venv, "train.py", "seen.json", layout=(
        "--nodes", "1", "--tasks-per-node", "2", "--data-service-nodes", "1", "--data-service-tasks-per-node", "2"))
    shutil.copy(WORKER, job_dir / "train.py")
    assert "#PBS -l select=1:ncpus=128:mpiprocs=2:ompthreads=64+1:ncpus=2:mpiprocs=2:ompthreads=1" in \
        (job_dir / "job.pbs").read_text()
    done = run_like_pbs_mom(job_dir, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len((job_dir / "hosts.data-service").read_text().split()) == 2
    assert len((job_dir / "hosts.training").read_text().split()) == 2
    ranks = json.loads((job_dir / "seen.json").read_text())
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == [3 * i for i in range(300)]
    assert "Shut down WorkerServer" in (job_dir / "data-service.log").read_text()
    assert (job_dir / "exitcode").read_text().strip() == "0"
