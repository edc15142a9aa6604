"""The tf.data service compute job as a Spark barrier stage (issue 14, seed 003's "Compute job on Spark cluster"):
a real ``spark-submit --master local[2] compute_worker_spark.py`` (pyspark + a JVM) feeding a real 2-rank MPI
training job that is the same as with the MPI compute job.

pyspark and Java come with the test set-up (scripts/setup-venvs.sh); a machine without them skips these tests,
except in CI (``CI`` set, or HPCVOD_REQUIRE_SPARK=1), where a missing one fails: a skipped test must not pass CI.
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
from frameworks_helpers import MPIEXEC, ROOT, WORKERS, rank_env, require_framework

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks, pytest.mark.spark]
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"
WORKER = ROOT / "hpcvod" / "tensorflow" / "data" / "compute_worker_spark.py"


def require_spark() -> None:
    missing = []
    if importlib.util.find_spec("pyspark") is None or not SPARK_SUBMIT.exists():
        missing.append(f"pyspark (no {SPARK_SUBMIT})")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        missing.append("Java (no java on PATH, no JAVA_HOME)")
    if not missing:
        return
    message = f"the Spark tests need {' and '.join(missing)}: scripts/setup-venvs.sh installs them"
    if os.environ.get("CI", "").lower() not in ("", "0", "false") or os.environ.get("HPCVOD_REQUIRE_SPARK") == "1":
        pytest.fail(message + " (CI or HPCVOD_REQUIRE_SPARK=1: a missing component fails)", pytrace=False)
    pytest.skip(message)


def start_spark(config: Path, master: str, *args: str) -> subprocess.Popen:
    """The documented command; its own session, so that the JVM and its Python workers can be found and ended."""
    env = rank_env({"PYSPARK_PYTHON": sys.executable})
    return subprocess.Popen([str(SPARK_SUBMIT), "--master", master, str(WORKER), *args, str(config)], env=env,
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def train(config: Path, mode: str, out: Path, ranks: int = 2) -> subprocess.Popen:
    return subprocess.Popen([str(MPIEXEC), "-n", str(ranks), sys.executable, str(WORKERS / "tf_data_consumer.py"),
                             str(config), mode, str(out)], env=rank_env(), cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def session_processes(sid: int) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process in session ``sid``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found[int(entry.name)] = (int(fields[1]), cmdline)
    return found


def finish(proc: subprocess.Popen, timeout: float, what: str) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if proc.args[0] == str(SPARK_SUBMIT):
            os.killpg(proc.pid, signal.SIGKILL)     # the JVM and its Python workers too
        else:
            proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{what} did not end within {timeout:.0f} s\n{out[-2000:]}\n{err[-4000:]}")
    return proc.returncode, out + err


def assert_session_ends(sid: int, timeout: float = 20) -> None:
    """Nothing of the Spark job (JVM, pyspark daemon, task workers) outlives it."""
    deadline = time.monotonic() + timeout
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = session_processes(sid)
    if left:
        os.killpg(sid, signal.SIGKILL)
    assert not left, f"processes left behind by the Spark job: {left}"


def jvm_listeners(sid: int) -> list[str]:
    """The local addresses on which the Spark job's JVM listens for TCP connections (``ss``, this machine)."""
    import re

    pids = {pid for pid, (_, cmd) in session_processes(sid).items() if "java" in cmd.split(" ", 1)[0]}
    table = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[3] for line in table.splitlines()
            if pids & {int(p) for p in re.findall(r"pid=(\d+)", line)}]


@pytest.mark.timeout(240)
def test_spark_compute_job_gives_every_element_to_exactly_one_training_rank(tmp_path: Path) -> None:
    require_framework("tensorflow")
    require_spark()
    config = tmp_path / "service.json"
    spark = start_spark(config, "local[2]")
    deadline = time.monotonic() + 120
    while not config.exists() and spark.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert config.exists(), "the Spark compute job wrote no config"
    # local[N]: the JVM's RPC and block manager on loopback only, no web UI (Spark binds the host's address and
    # *:4040 by default); TensorFlow's own servers, in the Python tasks, are not the JVM's (docs/data-service.md)
    listening = jvm_listeners(spark.pid)
    assert listening and all(a.rsplit(":", 1)[0].strip("[]") in ("127.0.0.1", "::ffff:127.0.0.1") for a in listening), \
        listening
    code, log = finish(train(config, "shared", tmp_path / "seen.json"), 180, "the training job")
    spark_code, spark_log = finish(spark, 60, "the Spark compute job after the training side's shutdown")
    assert code == 0, log[-4000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    print(f"elements per training rank: {len(seen[0])} + {len(seen[1])}")
    assert sorted(seen[0] + seen[1]) == [3 * i for i in range(200)], "each element once, over both ranks"
    assert spark_code == 0, spark_log[-4000:]
    assert "2 barrier tasks served until the training side was done" in spark_log
    assert sorted(p.name for p in config.with_name("service.json.d").glob("worker.*")) == ["worker.0.0", "worker.0.1"]
    assert_session_ends(spark.pid)


@pytest.mark.timeout(120)
def test_more_barrier_tasks_than_slots_fail_fast_with_one_line(tmp_path: Path) -> None:
    require_spark()
    spark = start_spark(tmp_path / "service.json", "local[2]", "--tasks", "3")
    code, log = finish(spark, 90, "a Spark job with 3 barrier tasks on 2 slots")
    assert code == 1, log[-3000:]
    assert "hpcvod compute_worker_spark: Spark cannot run 3 barrier tasks at once" in log, log[-3000:]
    assert not (tmp_path / "service.json").exists()
    assert_session_ends(spark.pid)


@pytest.mark.timeout(240)
def test_a_dying_barrier_task_fails_the_spark_job_and_ends_the_training_with_the_clear_line(tmp_path: Path) -> None:
    require_framework("tensorflow")
    require_spark()
    config = tmp_path / "service.json"
    spark = start_spark(config, "local[2]", "--timeout", "5")
    training = train(config, "forever", tmp_path / "seen.json", ranks=1)   # one rank: less TensorFlow to load
    for line in training.stdout:                   # the rank is pulling from the service (pytest-timeout bounds it)
        if "reading for ever" in line:
            break
    assert config.exists() and training.poll() is None, "the training rank never started reading"
    time.sleep(3)
    # the task workers: children of the pyspark daemon (both run `python -m pyspark.daemon`)
    processes = session_processes(spark.pid)
    tasks = sorted(pid for pid, (parent, cmd) in processes.items()
                   if "pyspark.daemon" in cmd and "pyspark.daemon" in processes.get(parent, (0, ""))[1])
    assert len(tasks) == 2, f"expected 2 barrier task workers, found {processes}"
    os.kill(tasks[-1], signal.SIGKILL)
    killed = time.monotonic()
    spark_code, spark_log = finish(spark, 60, "the Spark job after one of its barrier tasks died")
    code, log = finish(training, 90, "the training job after the Spark compute job failed")
    print(f"training ended {time.monotonic() - killed:.1f} s after the task was killed")
    assert spark_code == 1, spark_log[-4000:]
    assert "hpcvod compute_worker_spark: a barrier task's Python worker died" in spark_log, spark_log[-4000:]
    assert code != 0
    assert "the tf.data service compute job is gone" in log, log[-3000:]
    assert time.monotonic() - killed < 90
    assert_session_ends(spark.pid)
