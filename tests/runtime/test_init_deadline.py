"""A hanging MPI_Init ends the rank with one line after HPCVOD_INIT_TIMEOUT; a prompt one leaves nothing behind.

MPI_Init blocks in C with the GIL held, so only a process outside the rank can see it hang
(hpcvod/runtime/mpi_start.py). The hang is real: MPICH's own PMI client waiting on a server that never answers.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from conftest import MpiFlavour

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("mode", ["hang-init", "hang-lazy"])
def test_a_hanging_mpi_init_ends_the_rank_naming_it(mpich: MpiFlavour, mode: str) -> None:
    ranks = mpich.run_single("w_init_deadline.py", mode, env={"HPCVOD_INIT_TIMEOUT": "2"}, timeout=60)
    assert ranks.returncode == -signal.SIGTERM, ranks.explain()
    assert "MPI_Init returned" not in ranks.stdout, ranks.explain()
    lines = [line for line in ranks.stderr.splitlines() if line.startswith("hpcvod:")]
    assert len(lines) == 1, ranks.explain()
    assert "rank 3 on " in lines[0] and "MPI_Init has not returned after 2 s" in lines[0], lines[0]
    assert "HPCVOD_INIT_TIMEOUT" in lines[0]


def test_a_prompt_mpi_init_leaves_no_watcher_behind(mpich: MpiFlavour) -> None:
    ranks = mpich.run_single("w_init_deadline.py", "ok", env={"HPCVOD_INIT_TIMEOUT": "1"}, timeout=60)
    assert ranks.returncode == 0, ranks.explain()
    assert "MPI_Init returned" in ranks.stdout and "sum [1.0, 1.0, 1.0]" in ranks.stdout, ranks.explain()
    assert "hpcvod:" not in ranks.stderr, ranks.explain()


def test_no_deadline_when_switched_off(mpich: MpiFlavour) -> None:
    """HPCVOD_INIT_TIMEOUT=0 waits for ever: the hang outlives the test's own limit."""
    with pytest.raises(subprocess.TimeoutExpired):   # (subprocess.run kills it)
        mpich.run_single("w_init_deadline.py", "hang-init", env={"HPCVOD_INIT_TIMEOUT": "0"}, timeout=4)
