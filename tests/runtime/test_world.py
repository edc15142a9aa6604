"""init(): the world it finds, and the loud failure on the silent "N singletons" case."""

from __future__ import annotations

import re

import pytest

from hpcvod.runtime.errors import HpcvodWorldSizeError
from hpcvod.runtime.world import check_world_size, launcher_promises, mpi_flavour

MPICH = "MPICH Version:      5.0.2\nMPICH Release date: ..."
OPENMPI = "Open MPI v5.0.11, package: Open MPI ..."
INTEL = "Intel(R) MPI Library 2021.18 for Linux* OS"


def test_flavour_detection() -> None:
    assert mpi_flavour(MPICH) == "mpich"
    assert mpi_flavour(OPENMPI) == "openmpi"
    assert mpi_flavour(INTEL) == "intelmpi"
    assert mpi_flavour("MVAPICH2 2.3.7") == "mvapich"


@pytest.mark.parametrize("library, plugin", [(OPENMPI, "srun --mpi=pmix"), (MPICH, "srun --mpi=pmi2"),
                                             (INTEL, "I_MPI_PMI_LIBRARY")])
def test_singletons_under_srun_name_the_fix(library: str, plugin: str) -> None:
    env = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4", "SLURM_PROCID": "2"}
    with pytest.raises(HpcvodWorldSizeError) as err:
        check_world_size(1, library, env)
    text = str(err.value)
    assert "size 1" in text and "SLURM_STEP_NUM_TASKS=4" in text and "singletons" in text
    assert plugin in text


def test_hpcvod_world_size_is_checked() -> None:
    with pytest.raises(HpcvodWorldSizeError, match=r"has 3 ranks but the launcher promised HPCVOD_WORLD_SIZE=4"):
        check_world_size(3, MPICH, {"HPCVOD_WORLD_SIZE": "4"})
    check_world_size(4, MPICH, {"HPCVOD_WORLD_SIZE": "4"})


def test_mpirun_inside_a_batch_script_is_not_a_false_alarm() -> None:
    # Open MPI's mpirun starts its daemons with srun (one task per node): its ranks inherit the daemon
    # step's SLURM_STEP_NUM_TASKS, but OMPI_COMM_WORLD_SIZE is the real promise.
    env = {"SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "8", "OMPI_COMM_WORLD_SIZE": "8"}
    check_world_size(8, OPENMPI, env)
    assert [p.variable for p in launcher_promises(env)] == ["OMPI_COMM_WORLD_SIZE"]
    # Hydra (MPICH, Intel MPI) likewise: PMI_SIZE wins
    check_world_size(6, MPICH, {"SLURM_STEP_NUM_TASKS": "2", "PMI_SIZE": "6"})
    # a deliberate single process inside a batch allocation (no srun step) is fine
    check_world_size(1, MPICH, {"SLURM_NTASKS": "8", "SLURM_JOB_ID": "7"})


def test_open_mpi_started_by_srun_pmi2_is_caught_through_pmi_size() -> None:
    with pytest.raises(HpcvodWorldSizeError, match=re.escape("PMI_SIZE=2")):
        check_world_size(1, OPENMPI, {"PMI_SIZE": "2", "PMI_RANK": "1", "SLURM_STEP_NUM_TASKS": "2"})


def test_garbled_launcher_variables_are_no_promise() -> None:
    check_world_size(2, MPICH, {"PMI_SIZE": "", "SLURM_STEP_NUM_TASKS": "two"})


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_real_worlds(mpi) -> None:
    run = mpi.run(2, "w_init.py", timeout=60)
    assert run.returncode == 0, run.explain()
    for r in (0, 1):
        assert f"WORLD rank={r} size=2 local={r}/2 cross=0/1 homogeneous=True threads=True" in run.stdout, \
            run.explain()


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_real_world_size_mismatch(mpi) -> None:
    run = mpi.run(2, "w_init.py", env={"HPCVOD_WORLD_SIZE": "3"}, timeout=60)
    assert run.returncode != 0, run.explain()
    assert run.stdout.count("WORLD SIZE ERROR") == 2, run.explain()
    assert "the MPI world has 2 ranks but the launcher promised HPCVOD_WORLD_SIZE=3" in run.stdout


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_real_singleton_under_a_pretend_srun(mpi) -> None:
    # What `srun --mpi=<wrong plugin>` produces: a process that is rank 0 of 1 while srun started 4 tasks.
    run = mpi.run_single("w_init.py", env={"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3"})
    assert run.returncode == 3, run.explain()
    expected = {"openmpi": "srun --mpi=pmix", "mpich": "srun --mpi=pmi2", "impi": "I_MPI_PMI_LIBRARY"}[mpi.name]
    assert "alone in an MPI world of size 1" in run.stdout and expected in run.stdout, run.explain()
