"""Failures end in errors, never in hangs: mismatched collectives, stalls, a killed rank."""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]


@pytest.mark.parametrize("ranks", [2, 4])
def test_mismatched_collectives_raise_on_every_rank(mpi, ranks: int) -> None:
    run = mpi.run(ranks, "w_mismatch.py", timeout=90)
    assert run.returncode == 0, run.explain()
    assert "MISMATCH OK 9" in run.stdout, run.explain()
    labels = ("shape", "dtype", "op", "root", "collective", "cached shape", "cached unnamed", "async",
              "allgather trailing")
    for label in labels:
        raised = {int(r) for r in re.findall(rf"rank (\d+) caught \[{re.escape(label)}\]", run.stdout)}
        assert raised == set(range(ranks)), f"{label}: raised on ranks {sorted(raised)} only\n{run.explain()}"


def test_stall_warning_names_the_missing_rank(mpi) -> None:
    run = mpi.run(3, "w_stall.py", "3", env={"HPCVOD_STALL_CHECK_TIME_SECONDS": "1"}, timeout=90)
    assert run.returncode == 0, run.explain()
    assert "STALL WORKER DONE" in run.stdout, run.explain()
    assert re.search(r"allreduce 'late.tensor' \(process set 0\) waited \d+ s: submitted by ranks \[0, 1\]; "
                     r"never submitted by ranks \[2\]", run.stderr), run.explain()


def test_stall_shutdown_aborts_the_job(mpi) -> None:
    run = mpi.run(2, "w_stall.py", "0", "never",
                  env={"HPCVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"},
                  timeout=90)
    assert run.returncode != 0, run.explain()
    assert run.seconds < 60, run.explain()
    assert "stalled for more than HPCVOD_STALL_SHUTDOWN_TIME_SECONDS=3 s" in run.stderr, run.explain()
    assert "never submitted by ranks [1]" in run.stderr, run.explain()
    assert "STALL WORKER DONE" not in run.stdout


def test_a_killed_rank_ends_the_job_naming_it(mpi) -> None:
    # Hydra (MPICH, Intel MPI) would kill the survivors itself; -disable-auto-cleanup leaves them to hpcvod,
    # as srun does by default. Open MPI's prterun reacts itself, but only after hpcvod has reported.
    run = mpi.run(3, "w_kill.py", "1", no_cleanup=True, timeout=90)
    assert "STEPS RUNNING" in run.stdout, run.explain()
    assert run.returncode != 0, run.explain()
    assert run.seconds < 30, run.explain()
    for survivor in (0, 2):
        assert re.search(rf"hpcvod: rank {survivor}: aborting the job: rank 1 \(pid \d+ on \S+\) died",
                         run.stderr), run.explain()
    assert "the loop ended" not in run.stdout
