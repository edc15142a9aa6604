"""op=Adasum (runtime/adasum.py) against a NumPy transcription of Horovod's formula on real ranks.

2 ranks under every MPI flavour, 4 ranks (oversubscribed on small machines) under MPICH; 3 ranks must get
Horovod's NotImplementedError on every rank and keep working. The checks are in workers/w_adasum.py.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]


def test_adasum_matches_horovods_formula_on_two_ranks(mpi) -> None:
    run = mpi.run(2, "w_adasum.py")
    assert run.returncode == 0, run.explain()
    assert "ADASUM OK" in run.stdout and "on 2 ranks" in run.stdout, run.explain()


@pytest.mark.parametrize("ranks", [1, 4])
def test_adasum_matches_horovods_formula(mpich, ranks: int) -> None:
    run = mpich.run(ranks, "w_adasum.py")
    assert run.returncode == 0, run.explain()
    assert "ADASUM OK" in run.stdout and f"on {ranks} ranks" in run.stdout, run.explain()


def test_adasum_on_three_ranks_is_refused_everywhere_as_horovod_does(mpich) -> None:
    run = mpich.run(3, "w_adasum.py")
    assert run.returncode == 0, run.explain()
    assert "ADASUM REFUSED OK" in run.stdout and "on 3 ranks" in run.stdout, run.explain()


def test_adasum_without_fusion(mpich) -> None:
    """Every request alone (no fusion buffer): the same values."""
    run = mpich.run(2, "w_adasum.py", env={"HPCVOD_FUSION_THRESHOLD": "0"})
    assert run.returncode == 0, run.explain()
    assert "ADASUM OK" in run.stdout, run.explain()
