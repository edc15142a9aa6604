"""The Python API (hpcvod.jobs.submit/run on submitit) on the local site: a callable on 2 real MPI ranks."""

from __future__ import annotations

import json
import os

import pytest
from submitit.core.utils import FailedJobError

import hpcvod.jobs
from hpcvod.jobs.python_api import HpcvodExecutor, HpcvodJob
from hpcvod.sites import UserError
from submission_helpers import clean_env, hpcvod as hpcvod_cli

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def _clean_environment(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("HPCVOD_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)


def test_callable_runs_on_every_rank_and_rank_0_result_comes_back(tmp_path):
    def allreduce_sum(offset, scale=1):
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        return {"rank": comm.rank, "size": comm.size, "sum": comm.allreduce((comm.rank + offset) * scale),
                "world": os.environ["HPCVOD_WORLD_SIZE"]}

    job = hpcvod.jobs.submit(allreduce_sum, 10, kwargs={"scale": 2}, site="local", tasks_per_node=2,
                             folder=tmp_path / "jobs")
    assert isinstance(job, HpcvodJob)
    assert job.result() == {"rank": 0, "size": 2, "sum": (10 + 11) * 2, "world": "2"}
    assert [r["rank"] for r in job.results()] == [0, 1]
    assert job.state == "COMPLETED" and job.done()
    folder = job.job_dir
    assert folder.parent == tmp_path / "jobs" and folder.name.startswith("allreduce_sum-")
    assert {f"{job.job_id}_submitted.pkl", f"{job.job_id}_0_result.pkl", f"{job.job_id}_1_result.pkl", "job.sh",
            "output.log"} <= {p.name for p in folder.iterdir()}
    # an ordinary hpcvod job: the CLI knows it
    status = hpcvod_cli("status", "--json", str(folder), cwd=tmp_path, env=clean_env(tmp_path))
    assert json.loads(status.stdout)["state"] == "COMPLETED"


def test_run_returns_the_value_and_errors_carry_the_ranks_traceback(tmp_path):
    assert hpcvod.jobs.run(lambda: "only rank 0's", site="local", tasks_per_node=2, folder=tmp_path / "j") == \
        "only rank 0's"

    def breaks_on_rank_1():
        if os.environ.get("PMI_RANK") == "1":
            raise ValueError("rank one broke")
        return "fine"

    job = hpcvod.jobs.submit(breaks_on_rank_1, site="local", tasks_per_node=2, folder=tmp_path / "j")
    with pytest.raises(FailedJobError, match=r"(?s)rank 1\).*ValueError: rank one broke"):
        job.result()
    assert job.state == "FAILED"


def test_cancel_a_running_callable(tmp_path):
    def sleeps():
        import time

        time.sleep(600)

    job = hpcvod.jobs.submit(sleeps, site="local", tasks_per_node=2, folder=tmp_path / "j")
    try:
        assert job.state == "RUNNING"
        job.cancel()
        job.wait()
        assert job.state == "CANCELLED"
    finally:
        job.cancel()


def test_executor_parameters_are_checked():
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) 'node' \(did you mean 'nodes'\?\); valid: nodes"):
        HpcvodExecutor(site="local", node=2)
    executor = HpcvodExecutor(site="slurm-ib-openmpi", nodes=2, gpus_per_node=4)
    assert executor._num_tasks() == 8  # one rank per GPU, as `hpcvod submit` decides
    script = executor._make_submission_file_text("", "")
    assert "srun --mpi=pmix" in script and "submitit_worker.py" in script
    with pytest.raises(UserError, match="unknown site 'nowhere'"):
        HpcvodExecutor(site="nowhere")
    with pytest.raises(UserError, match="--gpus-per-node 8"):
        HpcvodExecutor(site="slurm-ib-openmpi", gpus_per_node=8)._num_tasks()


def test_executor_takes_the_scheduler_options_by_name():
    executor = HpcvodExecutor(site="slurm-ib-openmpi", nodes=2, gpus_per_node=4, exclusive=True, qos="high",
                              mem_per_gpu="80G", dependency="afterok:41", sched_opt=["comment=api"])
    script = executor._make_submission_file_text("", "")
    for directive in ("--exclusive", "--qos=high", "--mem-per-gpu=80G", "--dependency=afterok:41", "--comment=api"):
        assert f"#SBATCH {directive}\n" in script, directive
    with pytest.raises(UserError, match=r"^--mem '64X': expected a size"):
        HpcvodExecutor(site="slurm-ib-openmpi", mem="64X")._num_tasks()
    with pytest.raises(UserError, match=r"^--qos 'high': pbs has no such request"):
        HpcvodExecutor(site="pbs-ib-openmpi", qos="high")._num_tasks()
    with pytest.raises(UserError, match=r"^array: the Python API runs one call per job"):
        HpcvodExecutor(site="slurm-ib-openmpi", array="0-3")._num_tasks()


def test_a_call_with_a_data_service_compute_job_beside_it(tmp_path):
    """The Python API takes `hpcvod submit --data-service-nodes` by keyword: on the local site the compute job runs
    here beside the call's 2 ranks; every element reaches one rank once, and the compute job is ended."""
    pytest.importorskip("tensorflow")

    def consume_from_the_data_service(elements):
        """Runs on every training rank: the compute job's config from $HPCVOD_DATA_SERVICE_CONFIG, a finite dataset
        with distributed_epoch, what this rank saw; rank 0 ends the compute job."""
        import tensorflow as tf

        import hpcvod.tensorflow as hvd
        from hpcvod.tensorflow.data.compute_service import TfDataServiceConfig

        hvd.init()
        config = TfDataServiceConfig.read(os.environ["HPCVOD_DATA_SERVICE_CONFIG"], wait_for_file_creation=True,
                                          timeout=120)
        dataset = tf.data.Dataset.range(elements).map(lambda x: x * 3)
        seen = [int(x) for x in dataset.send_to_data_service(config, hvd.rank(), hvd.size(), reuse_dataset=True)]
        hvd.barrier()
        if hvd.rank() == 0:
            config.shutdown()
        return seen

    job = hpcvod.jobs.submit(consume_from_the_data_service, 120, site="local", tasks_per_node=2,
                             data_service_nodes=1, folder=tmp_path / "jobs")
    seen = job.results()
    assert sorted(seen[0] + seen[1]) == [3 * i for i in range(120)]
    assert "Shut down WorkerServer" in (job.job_dir / "data-service.log").read_text()
    with pytest.raises(UserError, match=r"^data_service_dispatchers: goes with data_service_nodes N"):
        HpcvodExecutor(site="local", data_service_dispatchers=2)._num_tasks()
