"""Preemption, requeue and time limits on the real sandbox cluster: a job stopped mid-run resumes from its
checkpoint and ends with the same step count and bit-identical parameters as an uninterrupted run, every step
applied exactly once (nothing lost, nothing done twice).

The cycle (docs/preemption.md): Slurm sends SIGTERM to the ranks on `scontrol requeue` and on preemption, or
warns the job script (SIGUSR1, --signal) before the time limit, which leaves `stop-requested` for the ranks;
hpcvod.runtime.checkpoint saves on rank 0 and the ranks exit; Slurm (or the job script) requeues the job;
the next run restores the checkpoint, data position included."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cluster_helpers import WORKERS, Cluster, hpcvod, run, submitted, wait_for_file, wait_for_status

pytestmark = [pytest.mark.cluster, pytest.mark.mpi, pytest.mark.timeout(300)]

STEPS = 60
TWO_BY_TWO = ("--nodes", "2", "--tasks-per-node", "2")
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The result of the same training, run once without interruption on the same 2 x 2 layout."""
    work = tmp_path_factory.mktemp("uninterrupted")
    shutil.copy(WORKERS / "train_linear.py", work / "train.py")
    done = hpcvod("submit", "--site", "slurm-sandbox", *TWO_BY_TWO, "--wait", "train.py", "--steps", str(STEPS),
                  cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    _, job_dir = submitted(done)
    return json.loads((job_dir / "result.json").read_text())


def start_training(tmp_path: Path, *extra: str, steps: int = STEPS, sleep: float = 0.1) -> tuple[str, Path]:
    shutil.copy(WORKERS / "train_linear.py", tmp_path / "train.py")
    sub = hpcvod("submit", "--site", "slurm-sandbox", *TWO_BY_TWO, *extra, "train.py", "--steps", str(steps),
                 "--sleep", str(sleep), cwd=tmp_path)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    return submitted(sub)


def applied_steps(job_dir: Path) -> list[tuple[int, int]]:
    """(run, step) for every step rank 0 applied, in order (run = SLURM_RESTART_COUNT)."""
    return [tuple(map(int, line.split())) for line in (job_dir / "applied.log").read_text().splitlines()]


def wait_for_steps(job_dir: Path, n: int) -> None:
    wait_for_file(job_dir / "applied.log", timeout=90, predicate=lambda text: text.count("\n") >= n)


def check_resumed_exactly(job: str, job_dir: Path, cwd: Path, reference: dict, cluster: Cluster,
                          min_restarts: int = 1) -> list[tuple[int, int]]:
    """The job completed after >= min_restarts requeues, with the uninterrupted run's result, each step once."""
    status = wait_for_status(job, cwd, FINISHED, timeout=240)
    output = (job_dir / "output.log").read_text()
    assert status["state"] == "COMPLETED", f"{status}\n{output[-4000:]}"
    restarts = int(cluster.job(job).get("Restarts", "0"))
    assert restarts >= min_restarts, output[-4000:]
    result = json.loads((job_dir / "result.json").read_text())
    assert result == reference, "the resumed run did not end where the uninterrupted one did"
    applied = applied_steps(job_dir)
    assert sorted(step for _, step in applied) == list(range(1, STEPS + 1)), f"steps lost or repeated: {applied}"
    runs = sorted({run_ for run_, _ in applied})
    assert len(runs) == restarts + 1, (runs, restarts)
    assert "resumed at step" in output   # (open-mode=append: output.log holds every run)
    return applied


def test_scontrol_requeue_mid_run_resumes_from_the_checkpoint(slurm_cluster: Cluster, tmp_path: Path,
                                                              uninterrupted: dict) -> None:
    job, job_dir = start_training(tmp_path)
    wait_for_steps(job_dir, 15)
    requeue = run(["scontrol", "requeue", job], timeout=30)
    assert requeue.returncode == 0, requeue.stderr
    applied = check_resumed_exactly(job, job_dir, tmp_path, uninterrupted, slurm_cluster)
    first_run = [step for run_, step in applied if run_ == 0]
    assert 15 <= len(first_run) < STEPS    # it really was stopped part-way


def test_warning_signal_before_the_limit_checkpoints_and_requeues_itself(slurm_cluster: Cluster, tmp_path: Path,
                                                                         uninterrupted: dict) -> None:
    """Slurm's --signal=B:USR1 warning, sent now by hand (`scancel --signal=USR1 --batch`), exactly as
    Slurm sends it when the time limit nears: the job script asks the ranks to stop, then requeues the job."""
    job, job_dir = start_training(tmp_path)
    wait_for_steps(job_dir, 15)
    warn = run(["scancel", "--signal=USR1", "--batch", job], timeout=30)
    assert warn.returncode == 0, warn.stderr
    check_resumed_exactly(job, job_dir, tmp_path, uninterrupted, slurm_cluster)
    output = (job_dir / "output.log").read_text()
    assert "requeueing job" in output and "time limit near" in output, output[-3000:]


def test_preempted_by_a_higher_priority_partition_resumes(slurm_cluster: Cluster, tmp_path: Path,
                                                          uninterrupted: dict) -> None:
    """A job of partition `urgent` needs the nodes: Slurm preempts (requeues) the debug job, which resumes
    from its checkpoint once the urgent job is done."""
    job, job_dir = start_training(tmp_path)
    wait_for_steps(job_dir, 15)
    urgent = _urgent_job(slurm_cluster, tmp_path)
    assert slurm_cluster.wait_done(urgent, timeout=120)["JobState"] == "COMPLETED"
    check_resumed_exactly(job, job_dir, tmp_path, uninterrupted, slurm_cluster)


def _urgent_job(cluster: Cluster, tmp_path: Path) -> str:
    script = tmp_path / "urgent.sh"
    script.write_text("#!/bin/bash\nsrun hostname\nsleep 2\n")
    return cluster.sbatch(script, ["--partition=urgent", "--nodes=2", "--ntasks-per-node=2", "--time=2",
                                   f"--output={tmp_path}/urgent.out"])


def test_real_time_limit_warning_from_slurm(slurm_cluster: Cluster, tmp_path: Path, uninterrupted: dict) -> None:
    """--time 1 (60 s) and more than 60 s of work: without the warning the job would end TIMEOUT. Slurm's own
    --signal warning (30 s before the limit, give or take Slurm's 60 s resolution) stops it in time, it
    requeues itself, and as often as needed until the training is done."""
    job, job_dir = start_training(tmp_path, "--time", "1", sleep=1.05)    # 60 steps x 1.05 s = 63 s of work
    check_resumed_exactly(job, job_dir, tmp_path, uninterrupted, slurm_cluster)
    assert "--signal=B:USR1@30" in (job_dir / "job.sbatch").read_text()
    assert "time limit near" in (job_dir / "output.log").read_text()
