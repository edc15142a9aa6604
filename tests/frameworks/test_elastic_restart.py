"""Elastic ``hpcvod run`` where the MPI has no ULFM (MPICH, Intel MPI): each reset starts a new world, which
resumes from the last commit that its hosts kept on node-local storage (hpcvod/runtime/elastic_restart.py,
docs/elastic.md "Restarting the world"). Horovod's elastic integration scenarios, as test_elastic_run.py runs them
under Open MPI's ULFM, with real MPICH (and Intel MPI) ranks on one machine whose "hosts" are names of it.

The worker (workers/elastic_run_worker.py) commits every step; the committed history of the last world must be
0, 1, 2, ... with no step twice or missing, and every rank must end with the same parameters.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from frameworks_helpers import ROOT, WORKERS, rank_env, run_or_fail
from test_elastic import LIMIT_MESSAGE
from test_elastic_run import HOSTS, LIMIT, _discovery, _finish, _results, _trained_the_same, _wait_for_step

WORKER = WORKERS / "elastic_run_worker.py"
IMPI = ROOT / ".venvs" / "impi"


def _venv(flavour: str) -> Path:
    if flavour == "mpich":
        return Path(sys.prefix)
    if not (IMPI / "bin" / "mpiexec").exists():
        message = f"no Intel MPI venv at {IMPI} (scripts/setup-venvs.sh creates it)"
        if os.environ.get("HPCVOD_REQUIRE_ALL_MPI") == "1":
            pytest.fail(message + "; HPCVOD_REQUIRE_ALL_MPI=1 requires every flavour")
        pytest.skip(message)
    return IMPI


def _argv(tmp: Path, flags: list[str], mode: str, goal: int = 0, flavour: str = "mpich") -> list[str]:
    venv = _venv(flavour)
    return [str(venv / "bin" / "hpcvod"), "run", *flags, str(venv / "bin" / "python"), str(WORKER), mode, str(goal),
            str(tmp)]


def _env(tmp: Path) -> dict[str, str]:
    # the state folders go under tmp (HPCVOD_ELASTIC_STATE_BASE), so that the test sees what is left behind
    return rank_env({"HPCVOD_TEST_WORKER_TIMEOUT": str(LIMIT - 20), "HPCVOD_ELASTIC_STATE_BASE": str(tmp / "node")})


def _run(tmp: Path, flags: list[str], mode: str, goal: int = 0, flavour: str = "mpich"):
    (tmp / "node").mkdir(mode=0o700)
    return run_or_fail(_argv(tmp, flags, mode, goal, flavour), _env(tmp), LIMIT, f"elastic hpcvod run {mode}")


@pytest.mark.parametrize("flavour", ["mpich", "intelmpi"])
def test_a_killed_rank_blacklists_its_host_and_a_new_world_resumes_from_the_last_commit(tmp_path, flavour):
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = _run(tmp_path, ["-np", "3", "--min-np", "2", "-H", hosts], "kill", flavour=flavour)
    assert done.returncode == 0, done.stderr
    results = _results(tmp_path)
    assert sorted(results) == [0, 1]            # the new world's ranks (the first world's died or ended)
    _trained_the_same(results, 2)
    assert len(results[0]["history"]) == 30     # every step, each once, across the two worlds
    assert f"hpcvod run: elastic: blacklisted {HOSTS[1]}\n" in done.stderr
    assert f"hpcvod run: elastic: starting world 1 on {HOSTS[0]}:1, {HOSTS[2]}:1" in done.stderr
    assert "hpcvod: rank 0: elastic: world 1 of 2 ranks resumes from commit 5" in done.stderr   # killed at step 5
    assert [results[r]["env"]["HOROVOD_HOSTNAME"] for r in (0, 1)] == [HOSTS[0], HOSTS[2]]
    assert list((tmp_path / "node").iterdir()) == []   # the driver removed the node-local copies at the end


def test_a_raising_rank_blacklists_its_host_and_the_others_finish(tmp_path):
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = _run(tmp_path, ["-np", "3", "--min-np", "2", "-H", hosts], "raise")
    assert done.returncode == 0, done.stderr
    _trained_the_same(_results(tmp_path), 2)
    assert "RuntimeError: rank 1 fails on purpose at step 5" in done.stderr
    assert f"hpcvod run: elastic: blacklisted {HOSTS[1]}\n" in done.stderr


def test_every_rank_failing_blacklists_every_host_and_ends_non_zero(tmp_path):
    hosts = ",".join(f"{h}:1" for h in HOSTS[:2])
    done = _run(tmp_path, ["-np", "2", "--min-np", "1", "-H", hosts], "raise_all")
    assert done.returncode != 0
    assert _results(tmp_path) == {}
    # in the order they were blacklisted: both in the first world, or one there and the other in the next
    assert done.stderr.strip().splitlines()[-1] in (
        f"hpcvod run: elastic: every host is blacklisted ({HOSTS[0]}, {HOSTS[1]}): no rank is left to train",
        f"hpcvod run: elastic: every host is blacklisted ({HOSTS[1]}, {HOSTS[0]}): no rank is left to train")


def test_fewer_than_min_np_past_the_elastic_timeout_is_one_line(tmp_path):
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = _run(tmp_path, ["-np", "3", "--min-np", "3", "--elastic-timeout", "2", "-H", hosts], "kill")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f"hpcvod run: elastic: fewer than --min-np 3 slots for longer than --elastic-timeout 2 s (usable: "
        f"{HOSTS[0]}:1, {HOSTS[2]}:1; blacklisted: {HOSTS[1]})")


def test_blacklisted_host_comes_back_after_its_cooldown_and_the_world_grows(tmp_path):
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = _run(tmp_path, ["-np", "3", "--min-np", "2", "-H", hosts, "--blacklist-cooldown-range", "1", "2"],
                "kill_until", 3)
    assert done.returncode == 0, done.stderr
    results = _results(tmp_path)
    _trained_the_same(results, 3)
    assert f"hpcvod run: elastic: blacklisted {HOSTS[2]} for 1-2 s" in done.stderr
    assert "hpcvod: rank 0: elastic: hosts changed; the state is on node-local storage" in done.stderr
    assert f"hpcvod run: elastic: starting world 2 on {HOSTS[0]}:1, {HOSTS[1]}:1, {HOSTS[2]}:1" in done.stderr
    assert results[2]["env"]["HOROVOD_HOSTNAME"] == HOSTS[2]


def test_reset_limit_ends_the_job_with_horovods_message(tmp_path):
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = _run(tmp_path, ["-np", "3", "--min-np", "2", "-H", hosts, "--blacklist-cooldown-range", "1", "2",
                           "--reset-limit", "1"], "kill_until", 3)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == LIMIT_MESSAGE.format(1)


def test_hosts_added_restart_the_world_larger_with_the_state(tmp_path):
    (tmp_path / "node").mkdir(mode=0o700)
    script = _discovery(tmp_path, [f"{HOSTS[0]}:2"])
    job = subprocess.Popen(_argv(tmp_path, ["-np", "2", "--host-discovery-script", str(script)], "grow", 3),
                           env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_step(tmp_path, job, 3)
    (tmp_path / "hosts").write_text(f"{HOSTS[0]}:2\n{HOSTS[1]}\n")
    code, err = _finish(job)
    assert code == 0, err
    results = _results(tmp_path)
    _trained_the_same(results, 3)
    assert [results[r]["env"]["HOROVOD_HOSTNAME"] for r in range(3)] == [HOSTS[0], HOSTS[0], HOSTS[1]]
    assert [results[r]["env"]["HOROVOD_SIZE"] for r in range(3)] == ["3"] * 3
    assert f"hpcvod run: elastic: hosts now {HOSTS[0]}:2, {HOSTS[1]}:1" in err
    assert "blacklisted" not in err   # a planned restart blames no host


def test_host_removed_restarts_the_world_without_it(tmp_path):
    (tmp_path / "node").mkdir(mode=0o700)
    script = _discovery(tmp_path, [HOSTS[0], HOSTS[1], HOSTS[2]])
    job = subprocess.Popen(_argv(tmp_path, ["-np", "3", "--min-np", "2", "--host-discovery-script", str(script)],
                                 "shrink", 2), env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    _wait_for_step(tmp_path, job, 3)
    (tmp_path / "hosts").write_text(f"{HOSTS[0]}\n{HOSTS[2]}\n")
    code, err = _finish(job)
    assert code == 0, err
    results = _results(tmp_path)
    _trained_the_same(results, 2)
    assert [results[r]["env"]["HOROVOD_HOSTNAME"] for r in range(2)] == [HOSTS[0], HOSTS[2]]


def test_a_state_folder_others_can_read_is_refused_in_one_line(tmp_path):
    """The node-local copy holds the model: a folder another user made, or one others can read, is not used."""
    from hpcvod.runtime.elastic_restart import StateStore
    from hpcvod.runtime.errors import HpcvodConfigError

    root = tmp_path / "state"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    os.environ["HPCVOD_ELASTIC_STATE_DIR"] = str(root)
    try:
        with pytest.raises(HpcvodConfigError, match=r"is not a folder of this user's that only they can read"):
            StateStore("h1", 0)
        os.chmod(root, 0o700)
        for hostile in ("../outside", "..", "a/b"):   # a discovery script's name must not lead out of the folder
            with pytest.raises(HpcvodConfigError, match=r"cannot name a folder of the state"):
                StateStore(hostile, 0)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]
        store = StateStore("h1", 0)
        assert stat.S_IMODE(os.stat(root / "h1").st_mode) == 0o700
    finally:
        del os.environ["HPCVOD_ELASTIC_STATE_DIR"]

    class Unpicklable:
        def __reduce__(self):
            raise TypeError("cannot pickle this")

    class FakeState:
        def _snapshot(self):
            return {"objects": {"lock": Unpicklable()}}

    with pytest.raises(HpcvodConfigError, match=r"commit\(\): the state cannot be written for a restarted world"):
        store.write(FakeState())
    assert not (root / "h1" / "state").exists()


def test_keras_fit_resumes_in_a_restarted_world_from_the_node_local_commit(tmp_path):
    """KerasState (the model's and the optimizer's variables as NumPy arrays) through a restarted world: rank 2 dies
    in the second of three epochs; the new world of 2 ranks loads the last commit and finishes the three."""
    from frameworks_helpers import require_framework
    require_framework("tensorflow")
    worker = WORKERS / "keras_elastic_worker.py"
    (tmp_path / "node").mkdir(mode=0o700)
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    done = run_or_fail([str(Path(sys.prefix) / "bin" / "hpcvod"), "run", "-np", "3", "--min-np", "2", "-H", hosts,
                        sys.executable, str(worker), str(tmp_path)], _env(tmp_path), LIMIT, "elastic keras restart")
    assert done.returncode == 0, done.stderr[-4000:]
    results = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    assert sorted(results) == [0, 1], done.stderr[-4000:]
    for start_rank, result in results.items():   # the new world's processes: one reset, seen once, no error
        assert (result["size"], result["epoch"], result["resets"], result["errors"]) == (2, 3, [[start_rank, 2]], [])
    assert results[0]["weights"] == results[1]["weights"]
    assert "hpcvod: rank 0: elastic: world 1 of 2 ranks resumes from commit" in done.stderr
