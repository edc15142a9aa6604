"""op=hvd.Adasum through hpcvod.torch on 2 and 4 real MPI ranks (4 oversubscribed), refused on 3 (issue 27).

Horovod's test/parallel/test_adasum_pytorch.py in hpcvod's words (its criterion, float32 and float16, the GPU-only
cases on CPU tensors too) and DistributedOptimizer(op=Adasum) as Horovod's _DistributedAdasumOptimizer: the
parameters become start + Adasum(each rank's own optimizer delta), training converges, ranks stay identical.
"""

from __future__ import annotations

from typing import Any

import pytest
from frameworks_helpers import assert_check, assert_same_checks, require_framework, run_checks

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

CHECKS = [
    "horovod_orthogonal_vectors_add_up",
    "horovod_parallel_vectors_average",
    "horovod_stability_with_tiny_values",
    "horovod_stability_with_scales_from_tiny_to_huge",
    "distributed_optimizer_steps_by_the_adasum_of_the_ranks_deltas",
    "distributed_optimizer_trains_and_ranks_stay_identical",
    "distributed_optimizer_misuse_is_refused_as_in_horovod",
]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_framework("torch")
    return run_checks("torch_adasum_worker.py", tmp_path_factory.mktemp("torch_adasum"), n=request.param,
                      timeout=300.0)


@pytest.mark.parametrize("name", CHECKS)
def test_torch_adasum_behaves_as_horovod(report: dict[str, Any], name: str) -> None:
    assert_check(report, name)


def test_torch_adasum_worker_ran_every_check_and_exited_cleanly(report: dict[str, Any]) -> None:
    assert_same_checks(report, CHECKS)


def test_three_ranks_refused_on_every_rank_as_in_horovod(tmp_path) -> None:
    require_framework("torch")
    report = run_checks("torch_adasum_worker.py", tmp_path, n=3, timeout=240.0)
    assert_check(report, "non_power_of_two_ranks_refused_as_in_horovod")
    assert_same_checks(report, ["non_power_of_two_ranks_refused_as_in_horovod"])
