"""`hpcvod submit --data-service-nodes` on the real Slurm test cluster (issue 14): one heterogeneous job, the
tf.data service compute job in component 0 (one node), 2 training ranks in component 1 (the other node).

Each test is bounded (pytest-timeout) and takes ~10-30 s here: TensorFlow's import dominates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cluster_helpers import WORKERS, Cluster, hpcvod, hpcvod_status, submitted, wait_for_file, wait_for_status

pytestmark = [pytest.mark.cluster, pytest.mark.mpi, pytest.mark.timeout(150)]

LAYOUT = ("--site", "slurm-sandbox", "--nodes", "1", "--tasks-per-node", "2", "--data-service-nodes", "1")
ELEMENTS = [3 * i for i in range(300)]  # tf_data_service_train.py's dataset after the service's map


def require_tensorflow() -> None:
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed in this venv")


def job_processes(job_dir: Path) -> list[str]:
    """This machine's processes (the sandbox's nodes live on it) whose command line names the job folder."""
    done = subprocess.run(["pgrep", "-af", str(job_dir)], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if "pgrep" not in line]


def assert_no_process_left(job_dir: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while job_processes(job_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not job_processes(job_dir), job_processes(job_dir)


def component_nodes(cluster: Cluster, job: str) -> list[str]:
    return [cluster.job(f"{job}+{i}").get("NodeList", "") for i in (0, 1)]


def accounted_states(cluster: Cluster, job: str) -> dict[str, str]:
    """Each component's state as sacct records it ({} without accounting)."""
    if not cluster.accounting:
        return {}
    deadline = time.monotonic() + 30
    states: dict[str, str] = {}
    while time.monotonic() < deadline:  # slurmdbd hears of the end a moment after slurmctld
        done = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,State"], capture_output=True,
                              text=True)
        states = dict(line.split("|")[:2] for line in done.stdout.split() if "|" in line)
        if len(states) == 2 and all(s not in ("RUNNING", "PENDING") for s in states.values()):
            break
        time.sleep(1)
    return states


def test_hetjob_feeds_two_training_ranks_and_both_components_complete(slurm_cluster: Cluster,
                                                                      tmp_path: Path) -> None:
    require_tensorflow()
    (tmp_path / "train.py").write_text((WORKERS / "tf_data_service_train.py").read_text())
    dry = hpcvod("submit", *LAYOUT, "--dry-run", "train.py", "seen.json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH hetjob" in dry.stdout and "srun --het-group=0" in dry.stdout
    done = hpcvod("submit", *LAYOUT, "--wait", "train.py", "seen.json", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    job, job_dir = submitted(done)
    # every element of the finite dataset reached exactly one training rank (distributed_epoch, shared job)
    ranks = json.loads((tmp_path / "seen.json").read_text())
    assert len(ranks) == 2
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == ELEMENTS, [len(r["seen"]) for r in ranks]
    compute_node, training_node = component_nodes(slurm_cluster, job)
    assert compute_node and training_node and compute_node != training_node
    assert {r["host"] for r in ranks} == {training_node}
    # the compute job wrote its config in the job folder and stopped at the shutdown mark
    assert json.loads((job_dir / "data-service.json").read_text())["addresses"][0].startswith("grpc://")
    assert "Shut down WorkerServer" in (job_dir / "data-service.log").read_text()
    status = hpcvod_status(job, tmp_path)
    assert status["state"] == "COMPLETED" and status["exit_code"] == 0
    assert [(c["part"], c["state"]) for c in status["components"]] == [("data service", "COMPLETED"),
                                                                        ("training", "COMPLETED")]
    accounted = accounted_states(slurm_cluster, job)
    if accounted:
        assert accounted == {f"{job}+0": "COMPLETED", f"{job}+1": "COMPLETED"}
    logs = hpcvod("logs", job, cwd=tmp_path)
    assert "==> tf.data service compute job: data-service.log <==" in logs.stdout
    assert "consumed" in logs.stdout
    assert_no_process_left(job_dir)


def start_forever(tmp_path: Path) -> tuple[str, Path]:
    """A job whose training ranks read a repeated dataset until the compute job goes away."""
    (tmp_path / "train.py").write_text((WORKERS / "tf_data_service_train.py").read_text())
    done = hpcvod("submit", *LAYOUT, "train.py", "seen.json", "forever", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    job, job_dir = submitted(done)
    wait_for_file(job_dir / "output.log", timeout=90, predicate=lambda t: t.count("reading for ever") == 2)
    return job, job_dir


def test_a_compute_job_that_dies_ends_the_training_with_a_clear_line(slurm_cluster: Cluster, tmp_path: Path) -> None:
    require_tensorflow()
    job, job_dir = start_forever(tmp_path)
    workers = [line for line in job_processes(job_dir) if "-m hpcvod.tensorflow.data.compute_worker" in line
               and "hpcvod.launchers.label" not in line and not line.split()[1].endswith("srun")]
    assert len(workers) == 1, workers
    os.kill(int(workers[0].split()[0]), signal.SIGKILL)
    killed = time.monotonic()
    status = wait_for_status(job, tmp_path, {"FAILED", "COMPLETED", "CANCELLED"}, timeout=60)
    assert status["state"] == "FAILED", status
    assert time.monotonic() - killed < 60
    assert "the tf.data service compute job ended (exit 137) while the training ran; ending the training" in \
        (job_dir / "output.log").read_text()
    assert not (tmp_path / "seen.json").exists()
    assert_no_process_left(job_dir)


def test_cancel_ends_both_components(slurm_cluster: Cluster, tmp_path: Path) -> None:
    require_tensorflow()
    job, job_dir = start_forever(tmp_path)
    done = hpcvod("cancel", job, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    status = wait_for_status(job, tmp_path, {"CANCELLED", "FAILED", "COMPLETED"}, timeout=60)
    assert status["state"] == "CANCELLED", status
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        parts = [c["state"] for c in hpcvod_status(job, tmp_path)["components"]]
        if parts == ["CANCELLED", "CANCELLED"]:
            break
        time.sleep(0.5)
    assert parts == ["CANCELLED", "CANCELLED"]
    assert_no_process_left(job_dir)
