"""``hpcvod run``'s elastic mode (horovodrun's elastic flags, issue 28) with real Open MPI ranks under ULFM: the
scenarios of Horovod's elastic integration tests (test/integration/elastic_common.py) on one machine, whose
"hosts" are names of this machine (localhost, 127.0.0.1, its hostname: Open MPI puts them all here, the driver
keeps them apart for discovery, blacklisting and HOROVOD_HOSTNAME).

The worker (workers/elastic_run_worker.py) is NumPy only and commits every step; its committed history must be
0, 1, 2, ... with no step twice or missing, and every rank must end with the same parameters.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from frameworks_helpers import WORKERS, rank_env, run_or_fail
from test_elastic import LIMIT_MESSAGE, _openmpi

WORKER = WORKERS / "elastic_run_worker.py"
HOSTS = ["localhost", "127.0.0.1", socket.gethostname()]   # three names, one machine
LIMIT = 150.0   # seconds for one job: far above what it takes, so that a hang fails instead of blocking


def _env() -> dict[str, str]:
    return rank_env({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_pml": "ob1",
                     "OMPI_MCA_btl": "self,sm,tcp", "HPCVOD_TEST_WORKER_TIMEOUT": str(LIMIT - 20)})


def _argv(tmp: Path, flags: list[str], mode: str, goal: int = 0) -> list[str]:
    venv = _openmpi()
    return [str(venv / "bin" / "hpcvod"), "run", *flags, str(venv / "bin" / "python"), str(WORKER), mode, str(goal),
            str(tmp)]


def _discovery(tmp: Path, hosts: list[str]) -> Path:
    """A discovery script printing tmp/hosts, which the test rewrites to add or remove hosts."""
    (tmp / "hosts").write_text("".join(f"{h}\n" for h in hosts))
    script = tmp / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {tmp / 'hosts'}\n")
    script.chmod(0o700)
    return script


def _results(tmp: Path) -> dict[int, dict[str, Any]]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(tmp.glob("rank*.json"))}


def _wait_for_step(tmp: Path, job: subprocess.Popen, step: int) -> None:
    deadline = time.monotonic() + LIMIT
    progress = tmp / "progress"
    while time.monotonic() < deadline and job.poll() is None:
        text = progress.read_text().split() if progress.exists() else []
        if text and int(text[0]) >= step:
            return
        time.sleep(0.1)
    pytest.fail(f"the job did not reach step {step}: {_stop(job)}")


def _stop(job: subprocess.Popen) -> str:
    """Ctrl-C to hpcvod run (its driver ends mpirun and the ranks), then SIGKILL; its stderr."""
    job.send_signal(signal.SIGINT)
    try:
        return job.communicate(timeout=30)[1][-4000:]
    except subprocess.TimeoutExpired:
        job.kill()
        return job.communicate()[1][-4000:]


def _finish(job: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = job.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job did not end: {_stop(job)}")
    return job.returncode, err


def _trained_the_same(results: dict[int, dict[str, Any]], size: int) -> None:
    """Every finishing rank: the same world size, the same committed history 0..n-1, the same parameters."""
    assert len(results) == size, results.keys()
    first = next(iter(results.values()))
    steps = len(first["history"])
    for result in results.values():
        assert result["size"] == size
        assert result["history"] == list(range(steps))          # no committed step repeated or lost
        assert result["params"] == [float(sum(range(steps)))] * 4
        assert all(params == result["params"] for params in result["all_params"])


def test_hosts_added_grow_the_world_and_new_ranks_get_the_state(tmp_path):
    script = _discovery(tmp_path, [f"{HOSTS[0]}:2"])
    job = subprocess.Popen(_argv(tmp_path, ["-np", "2", "--host-discovery-script", str(script)], "grow", 3),
                           env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_step(tmp_path, job, 3)
    (tmp_path / "hosts").write_text(f"{HOSTS[0]}:2\n{HOSTS[1]}\n")
    code, err = _finish(job)
    assert code == 0, err
    results = _results(tmp_path)
    _trained_the_same(results, 3)
    assert [results[r]["env"]["HOROVOD_HOSTNAME"] for r in range(3)] == [HOSTS[0], HOSTS[0], HOSTS[1]]
    assert [results[r]["env"]["HOROVOD_RANK"] for r in range(3)] == ["0", "1", "2"]
    assert [results[r]["env"]["HOROVOD_LOCAL_RANK"] for r in range(3)] == ["0", "1", "0"]
    assert results[0]["env"]["HOROVOD_SIZE"] == "2" and results[2]["env"]["HOROVOD_SIZE"] == "3"
    assert results[0]["sizes"] == [2, 3] and results[0]["resets"] == [[0, 3]]
    assert results[2]["resets"] == []   # a new rank starts from sync(), without the reset callbacks
    assert f"hpcvod run: elastic: hosts now {HOSTS[0]}:2, {HOSTS[1]}:1" in err


def test_a_spawned_rank_dying_ends_the_job_without_hanging(tmp_path):
    """A limit of Open MPI 5.0.11 (PRRTE 3.0.11): the job of ranks spawned at growth is not fault tolerant (mpirun's
    --with-ft covers its first job only; spawn info "pmix.runopt"/"PMIX_RUNTIME_OPTIONS" = recoverable,notifyerrors
    did not change that, measured by hand), so a spawned rank's death ends the whole job. It must end, non-zero,
    and not hang; when Open MPI keeps spawned jobs going, this test should see the first two ranks train on."""
    script = _discovery(tmp_path, [f"{HOSTS[0]}:2"])
    job = subprocess.Popen(_argv(tmp_path, ["-np", "2", "--host-discovery-script", str(script)], "grow_kill", 3),
                           env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_step(tmp_path, job, 3)
    (tmp_path / "hosts").write_text(f"{HOSTS[0]}:2\n{HOSTS[1]}\n")
    code, err = _finish(job)
    assert code != 0, err
    assert "hpcvod: rank 0: elastic: starting 1 rank(s) on 127.0.0.1" in err
    assert "exited on\nsignal 9 (Killed)" in err


def test_host_removed_ends_its_ranks_and_the_others_train_on(tmp_path):
    script = _discovery(tmp_path, [HOSTS[0], HOSTS[1], HOSTS[2]])
    job = subprocess.Popen(_argv(tmp_path, ["-np", "3", "--min-np", "2", "--host-discovery-script", str(script)],
                                 "shrink", 2), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_step(tmp_path, job, 3)
    (tmp_path / "hosts").write_text(f"{HOSTS[0]}\n{HOSTS[2]}\n")
    code, err = _finish(job)
    assert code == 0, err
    results = _results(tmp_path)
    assert sorted(results) == [0, 2]
    _trained_the_same(results, 2)
    assert f"its host {HOSTS[1]} is no longer in the elastic job; it ends" in err


@pytest.mark.parametrize("mode", ["kill", "raise"])
def test_a_failing_rank_blacklists_its_host_and_the_others_finish(tmp_path, mode):
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = run_or_fail(_argv(tmp_path, ["-np", "3", "--min-np", "2", "-H", hosts], mode), _env(), LIMIT,
                       f"elastic hpcvod run {mode}")
    assert done.returncode == 0, done.stderr
    results = _results(tmp_path)
    assert sorted(results) == [0, 2]
    _trained_the_same(results, 2)
    assert f"hpcvod run: elastic: blacklisted {HOSTS[1]}\n" in done.stderr


def test_every_rank_failing_blacklists_every_host_and_ends_non_zero(tmp_path):
    hosts = ",".join(f"{h}:1" for h in HOSTS[:2])
    done = run_or_fail(_argv(tmp_path, ["-np", "2", "--min-np", "1", "-H", hosts], "raise_all"), _env(), LIMIT,
                       "elastic hpcvod run raise_all")
    assert done.returncode != 0
    assert _results(tmp_path) == {}
    assert done.stderr.strip().splitlines()[-1] == (
        f"hpcvod run: elastic: every host is blacklisted ({HOSTS[0]}, {HOSTS[1]}): no rank is left to train")


def test_fewer_than_min_np_past_the_elastic_timeout_is_one_line(tmp_path):
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = run_or_fail(_argv(tmp_path, ["-np", "3", "--min-np", "3", "--elastic-timeout", "2", "-H", hosts], "kill"),
                       _env(), LIMIT, "elastic hpcvod run, min-np timeout")
    assert done.returncode != 0
    line = (f"elastic: fewer than --min-np 3 slots for longer than --elastic-timeout 2 s (usable: {HOSTS[0]}:1, "
            f"{HOSTS[2]}:1; blacklisted: {HOSTS[1]})")
    assert done.stderr.strip().splitlines()[-1] == f"hpcvod run: {line}"
    assert f"hpcvod: rank 0: {line}" in done.stderr and f"hpcvod: rank 1: {line}" in done.stderr


def test_blacklisted_host_comes_back_after_its_cooldown(tmp_path):
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = run_or_fail(_argv(tmp_path, ["-np", "3", "--min-np", "2", "-H", hosts, "--blacklist-cooldown-range", "1",
                                        "2"], "kill_until", 3), _env(), LIMIT, "elastic hpcvod run, cooldown")
    assert done.returncode == 0, done.stderr
    results = _results(tmp_path)
    _trained_the_same(results, 3)
    assert results[0]["sizes"] == [2, 3]
    assert f"hpcvod run: elastic: blacklisted {HOSTS[2]} for 1-2 s" in done.stderr
    assert results[2]["env"]["HOROVOD_HOSTNAME"] == HOSTS[2]   # the new rank, on the host that came back


def test_reset_limit_ends_the_job_with_horovods_message(tmp_path):
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = run_or_fail(_argv(tmp_path, ["-np", "3", "--min-np", "2", "-H", hosts, "--blacklist-cooldown-range", "1",
                                        "2", "--reset-limit", "1"], "kill_until", 3), _env(), LIMIT,
                       "elastic hpcvod run, reset limit")
    assert done.returncode != 0
    assert LIMIT_MESSAGE.format(1) in done.stderr


@pytest.mark.parametrize("flags,line", [
    (["--min-np", "3", "--max-np", "2"], "--max-np 2: expected at least --min-np (3)"),
    (["-np", "4", "--min-np", "1", "--max-np", "2"], "-np 4: expected from --min-np (1) to --max-np (2)"),
    (["--min-np", "0"], "--min-np 0: expected a number of ranks from 1"),
    (["--min-np", "1", "--reset-limit", "0"], "--reset-limit 0: expected a number of resets from 1"),
    (["--min-np", "1", "--blacklist-cooldown-range", "5", "2"],
     "--blacklist-cooldown-range 5 2: expected MIN MAX seconds with 1 <= MIN <= MAX <= 3600"),
    (["--min-np", "1", "--elastic-timeout", "0"], "--elastic-timeout 0: expected a time in seconds above 0"),
    (["--min-np", "1", "--slots-per-host", "0"], "--slots-per-host 0: expected a number of slots from 1"),
    (["--host-discovery-script", "/nonexistent/discover.sh"],
     "--host-discovery-script '/nonexistent/discover.sh': not an executable file"),
    (["-np", "2", "--max-np", "3"], "--max-np: only for an elastic job; give --min-np or --host-discovery-script too"),
])
def test_bad_elastic_flags_are_one_line(tmp_path, flags, line):
    done = subprocess.run(_argv(tmp_path, flags, "fixed"), env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == f"hpcvod: error: {line}", done.stderr


def test_a_horovod_elastic_timeout_that_is_no_number_is_one_line(tmp_path):
    done = subprocess.run(_argv(tmp_path, ["--min-np", "1"], "fixed"),
                          env={**_env(), "HOROVOD_ELASTIC_TIMEOUT": "soon"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "hpcvod: error: HOROVOD_ELASTIC_TIMEOUT='soon': expected a time in seconds"


def test_discovery_script_failing_at_the_start_is_one_line(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho 'no inventory here' >&2\nexit 3\n")
    script.chmod(0o700)
    done = subprocess.run(_argv(tmp_path, ["-np", "2", "--host-discovery-script", str(script)], "fixed"), env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == f"hpcvod: error: --host-discovery-script {script}: exit status 3: no inventory here"


def test_max_np_caps_the_ranks_the_hosts_offer(tmp_path):
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = run_or_fail(_argv(tmp_path, ["--min-np", "1", "--max-np", "2", "-H", hosts], "fixed"), _env(), LIMIT,
                       "elastic hpcvod run --max-np 2")
    assert done.returncode == 0, done.stderr
    results = _results(tmp_path)
    _trained_the_same(results, 2)
    assert [results[r]["env"]["HOROVOD_HOSTNAME"] for r in range(2)] == HOSTS[:2]
