"""Horovod's tf.data service client API (issue 29 item 2): ``config.compute_client(verbose).shutdown()``, the last
line of Horovod's data-service examples, ends the compute job; ``compute_worker.main(dispatchers,
dispatcher_side, configfile, timeout)`` run in a thread of a training process returns after that shutdown; a
client whose compute job is gone fails in one line within its timeout. Real TensorFlow, real MPI jobs
(started as in test_tf_data_service.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from frameworks_helpers import MPIEXEC, ROOT, WORKERS, rank_env, require_framework
from test_tf_data_service import finish, start_compute

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

CLIENT = WORKERS / "tf_data_service_client.py"


@pytest.mark.timeout(300)
def test_the_examples_last_line_shuts_the_compute_job_down(tmp_path: Path) -> None:
    require_framework("tensorflow")
    config = tmp_path / "service.json"
    compute = start_compute(2, config)
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(CLIENT), "example", str(config)],
                          env=rank_env(), cwd=str(ROOT), capture_output=True, text=True, timeout=180)
    code, log = finish(compute, done)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("shut down") == 1, done.stdout[-2000:]     # rank 0's shutdown() returned
    assert code == 0, log[-3000:]
    assert Path(f"{config}.d/finished").exists()     # every compute rank stopped its servers before shutdown returned


@pytest.mark.timeout(300)
def test_compute_worker_main_in_a_thread_returns_after_the_clients_shutdown(tmp_path: Path) -> None:
    # Two training ranks, each with a compute rank in a thread, as in Horovod's test_compute_worker.py; a child job,
    # not pytest's own process: main() uses hpcvod's runtime (MPI), which would stay for every later test here.
    require_framework("tensorflow")
    config = tmp_path / "service.json"
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(CLIENT), "thread", str(config)], env=rank_env(),
                          cwd=str(ROOT), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("shut down") == 1, done.stdout[-2000:]
    assert done.stdout.count("compute thread alive=False returned=[0]") == 2, (done.stdout[-2000:] +
                                                                               done.stderr[-3000:])


@pytest.mark.timeout(300)
def test_a_client_whose_compute_job_is_gone_fails_in_one_line(tmp_path: Path) -> None:
    require_framework("tensorflow")
    from hpcvod.frameworks.tensorflow.data_service import DataServiceError, TfDataServiceConfig
    config = tmp_path / "service.json"
    compute = start_compute(2, config, "--timeout", "6")
    client = TfDataServiceConfig.read(str(config), wait_for_file_creation=True, timeout=120).compute_client(verbose=2)
    os.killpg(compute.pid, signal.SIGKILL)
    compute.communicate()
    # just killed: its heartbeat is still fresh, so the shutdown is sent and its confirmation never comes
    with pytest.raises(DataServiceError, match="did not stop after shutdown") as stopped:
        client.shutdown()
    # by now the heartbeat is older than the timeout: refused at once
    with pytest.raises(DataServiceError, match="it is gone") as gone:
        client.shutdown()
    for exc in (stopped.value, gone.value):
        assert "\n" not in str(exc) and str(config) in str(exc), str(exc)
    assert "no heartbeat in" in str(gone.value) and "for 6 s" in str(gone.value)
