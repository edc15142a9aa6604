"""A world shut down and built again in the same process (what elastic training does after a rank is lost)."""

from __future__ import annotations

import pytest

ROUNDS = 20


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_world_is_rebuilt_twenty_times_without_leaks(mpi) -> None:
    """init over a new communicator (a duplicate, or a split that reverses the ranks), collectives (a fused
    burst of 1 MiB tensors, a process set now and then), shutdown: 20 times on 2 real ranks. After each
    shutdown the world holds no communicator or request, the process is back to its one thread and its file
    descriptors, and its memory does not grow after the warm-up (each world's fusion buffer alone is 8 MiB)."""
    run = mpi.run(2, "w_rebuild.py", str(ROUNDS), timeout=240)
    assert run.returncode == 0, run.explain()
    for rank in (0, 1):
        assert f"REBUILT OK {ROUNDS} rank {rank}: threads ['MainThread']" in run.stdout, run.explain()
