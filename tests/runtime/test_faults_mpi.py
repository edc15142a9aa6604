"""Ranks that leave, raise, die or stop at every phase: the job must end within seconds, naming the culprit.

Issue 10's fault-injection matrix (workers/w_fault.py) runs under the MPICH wheel behind Hydra with
``-disable-auto-cleanup`` and workers/linger.py, so that Hydra leaves the survivors to hpcvod as srun does by
default; the clean-leave cases also run under every MPI flavour.
"""

from __future__ import annotations

import re

import pytest

from conftest import flavour

FAST = {"HPCVOD_HEARTBEAT_TIMEOUT_SECONDS": "3", "HPCVOD_INIT_TIMEOUT": "10"}
PID = r"\(pid \d+ on \S+\)"
# What the survivors (or the launcher) say about the victim, rank 1, in each case.
NAMED = {
    ("exit", "mid-collective"): rf"rank 1 {PID} finished execution",
    ("raise", "mid-collective"): rf"aborting the job: rank 1 {PID} failed: uncaught RuntimeError: injected",
    ("kill", "mid-collective"): rf"aborting the job: rank 1 {PID} died",
    ("stop", "mid-collective"): rf"aborting the job: rank 1 {PID} has not been heard from",
    ("exit", "in-shutdown"): rf"aborting the job: rank 1 {PID} failed: it exited in the middle of hvd.shutdown",
    ("raise", "in-shutdown"): rf"aborting the job: rank 1 {PID} failed: it exited in the middle of hvd.shutdown",
    ("kill", "in-shutdown"): rf"aborting the job: rank 1 {PID} died",
    ("stop", "in-shutdown"): rf"aborting the job: rank 1 {PID} has not been heard from",
    ("raise", "before-init"): r"hpcvod: rank 1 on \S+: uncaught RuntimeError before hvd.init\(\) completed",
    **{(fault, "before-init"): r"hpcvod: rank 0 on \S+: rank\(s\) 1 of 3 never reached hvd.init\(\) within 5 s"
       for fault in ("exit", "kill", "stop")},
    ("raise", "in-init"): r"hpcvod: rank 1 on \S+: uncaught RuntimeError before hvd.init\(\) completed",
}
# A rank that exits, dies or stops inside init(), after its first collectives, leaves the others in init()'s
# collectives, which end after HPCVOD_INIT_TIMEOUT without knowing which rank is missing.
INIT_DEADLINE = r"hpcvod: rank [02] on \S+: hvd.init\(\) has not completed after 10 s"

CASES = [(f, p) for f in ("exit", "raise", "kill", "stop")
         for p in ("before-init", "in-init", "mid-collective", "in-shutdown")]


@pytest.mark.mpi
@pytest.mark.parametrize("fault,phase", CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_fault_matrix_ends_the_job_naming_the_culprit(mpich, fault: str, phase: str) -> None:
    # A stopped rank (it runs no code), and a rank that exits or dies inside init() (an early exit waits in
    # MPI_Finalize), outlive what hpcvod can do on the others: the launcher ends them. Hydra does by default
    # (as `hpcvod run` and the local site use it); srun with --kill-on-bad-exit, which hpcvod's srun line passes.
    # Before init(), rank 0's arrival check ends the job itself (MPI_Abort). Every other case runs with the
    # launcher held back, so hpcvod alone ends the job.
    left_to_launcher = phase != "before-init" and (fault == "stop" or (fault in ("exit", "kill") and phase == "in-init"))
    run = mpich.run(3, "w_fault.py", "1", fault, phase, env=FAST, timeout=60, no_cleanup=not left_to_launcher)
    assert f"victim 1: {fault} at {phase}" in run.stdout, run.explain()
    assert run.returncode != 0, run.explain()
    assert run.seconds < 30, run.explain()
    assert "finished, which only the victim" not in run.stdout, run.explain()
    expected = NAMED.get((fault, phase), INIT_DEADLINE)
    if left_to_launcher:   # whichever comes first: the others' init deadline, or Hydra's cleanup naming the pid
        expected = f"{expected}|BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"
    assert re.search(expected, run.output), f"expected /{expected}/\n" + run.explain()


@pytest.mark.mpi
def test_a_rank_0_that_comes_late_to_init_still_names_the_missing_rank(mpich) -> None:
    # rank 0 reaches init() 7 s after rank 2; the others' limit counts from rank 0's answer, not from their own
    # arrival (the fresh-clone CI saw rank 2 give up first, 'rank 0 did not say which', under a loaded machine)
    run = mpich.run(3, "w_fault.py", "1", "stop", "before-init", env={**FAST, "HPCVOD_TEST_RANK0_LATE": "7"},
                    timeout=60, no_cleanup=True)
    assert run.returncode != 0, run.explain()
    assert re.search(NAMED[("stop", "before-init")], run.output), run.explain()
    assert "did not say which" not in run.output and "has not completed" not in run.output, run.explain()


@pytest.mark.mpi
def test_a_rank_0_that_stops_after_answering_is_not_waited_for_for_ever(mpich) -> None:
    # rank 1 never arrives; rank 0 arrives, answers rank 2, and is stopped 2 s into init() (before its own 5 s
    # limit could name rank 1): rank 2 ends the job once rank 0's time and the grace have passed since its answer
    run = mpich.run(3, "w_fault.py", "1", "stop", "before-init", env={**FAST, "HPCVOD_TEST_RANK0_STOP": "2"},
                    timeout=60)
    assert run.returncode != 0, run.explain()
    assert re.search(r"hpcvod: rank 2 on \S+: rank 0 reached hvd.init\(\) but has neither seen every rank nor "
                     r"named the missing ones within 10 s", run.output), run.explain()
    assert run.seconds < 30, run.explain()


# Every way of leaving under MPICH; one case under each other flavour (the mechanism is hpcvod's, not the MPI's).
LEAVES = [("mpich", 1, "return"), ("mpich", 0, "exit"), ("mpich", 2, "shutdown"), ("openmpi", 1, "return"),
          ("impi", 1, "return")]


@pytest.mark.mpi
@pytest.mark.parametrize("flavour_name,leaver,how", LEAVES, ids=[f"{f}-{r}-{h}" for f, r, h in LEAVES])
def test_a_rank_that_leaves_cleanly_fails_the_others_collectives(flavour_name: str, leaver: int, how: str) -> None:
    mpi = flavour(flavour_name)
    run = mpi.run(3, "w_leave.py", str(leaver), how, timeout=90)
    assert f"rank {leaver} leaves by {how}" in run.stdout, run.explain()
    assert run.returncode != 0, run.explain()
    assert run.seconds < 30, run.explain()
    for other in {0, 1, 2} - {leaver}:
        # its own HpcvodShutdownError, or the abort relayed from the first rank that raised it: both name the leaver
        assert re.search(rf"rank {other} got HpcvodShutdownError: hpcvod has been shut down: rank {leaver} "
                         rf"{PID} finished execution|hpcvod: rank {other}: aborting the job: .*rank {leaver} {PID} "
                         rf"finished execution", run.output), run.explain()
    assert "the loop ended" not in run.stdout


@pytest.mark.mpi
def test_settings_that_differ_between_ranks_are_refused_at_init(mpich) -> None:
    run = mpich.run(3, "w_settings.py", timeout=60)
    assert run.returncode != 0, run.explain()
    assert "init passed" not in run.stdout
    assert ("runtime settings differ between ranks: HPCVOD_FUSION_THRESHOLD (134217728 on ranks 0, 2; 1000 on "
            "rank 1), HPCVOD_HIERARCHICAL_ALLREDUCE (False on ranks 0, 2; True on rank 1)") in run.stderr, \
        run.explain()


@pytest.mark.mpi
def test_a_bad_setting_on_one_rank_ends_the_job_naming_it(mpich) -> None:
    run = mpich.run(3, "w_settings.py", "bad", env={"HPCVOD_INIT_TIMEOUT": "20"}, timeout=60)
    assert run.returncode != 0 and run.seconds < 15, run.explain()
    assert "HPCVOD_CYCLE_TIME='fast': expected a non-negative number of milliseconds" in run.stderr, run.explain()
    assert re.search(r"hpcvod: rank 2 on \S+: uncaught HpcvodConfigError before hvd.init\(\) completed",
                     run.stderr), run.explain()


@pytest.mark.mpi
@pytest.mark.parametrize("naming", ["named", "unnamed"])
def test_a_caught_failure_on_one_rank_gives_a_mismatch_everywhere_not_a_hang(mpich, naming: str) -> None:
    run = mpich.run(2, "w_out_of_step.py", naming, timeout=60)
    assert run.returncode == 0, run.explain()
    assert "rank 1 caught: injected failure" in run.stdout, run.explain()
    for rank in (0, 1):
        assert f"rank {rank} done, 1 mismatch error(s)" in run.stdout, run.explain()
    if naming == "named":
        assert ("every rank waits for collectives that no other rank submitted (rank 0 waits for 'backward.2'; "
                "rank 1 waits for 'forward.3')") in run.stdout, run.explain()
    else:   # unnamed collectives pair by position: the shapes differ, so the pairing error names both
        assert "rank 0: allreduce(dtype=float64, shape=(6,)" in run.stdout, run.explain()


@pytest.mark.mpi
def test_a_name_reused_on_one_rank_ends_in_an_error_on_every_rank(mpich) -> None:
    run = mpich.run(2, "w_name_reused.py", timeout=60)
    assert run.returncode == 0, run.explain()
    assert "rank 0 refused at submission: a collective named 'grad' is still in flight" in run.stdout, run.explain()
    for rank in (0, 1):
        assert f"rank {rank} HpcvodMismatchError: ranks are out of step" in run.stdout, run.explain()
    assert "finished without an error" not in run.stdout, run.explain()


@pytest.mark.mpi
def test_strangers_at_the_control_channel_are_refused_and_detection_still_works(mpich) -> None:
    run = mpich.run(3, "w_channel_attack.py", timeout=90, no_cleanup=True)
    assert "ATTACKS SENT" in run.stdout, run.explain()
    for rank in range(3):
        assert f"rank {rank} TRAINED OK" in run.stdout, run.explain()
    refused = re.search(r"hpcvod: rank 0: the control channel refused (\d+) connection\(s\) that were not this "
                        r"job's ranks: (.*)", run.stderr)
    assert refused, run.explain()
    assert int(refused.group(1)) >= 8, run.explain()
    for why in ("2 x no or a wrong job token", "rank 7 out of range", "rank 1 from pid 1 on",
                "rank 2 already connected", "a line longer than 64 KiB", "not a JSON hello line",
                "a message of type 'abort' before any hello"):
        assert why in refused.group(2), run.explain()
    assert "forged" not in run.stderr.replace("a forged abort", ""), run.explain()
    assert run.returncode != 0 and run.seconds < 60, run.explain()
    for survivor in (0, 1):
        assert re.search(rf"hpcvod: rank {survivor}: aborting the job: rank 2 {PID} died", run.stderr), \
            run.explain()
