"""hpcvod.torch behaves as Horovod's torch API does (issue 11), on 1, 2 and 4 real MPI ranks (4 oversubscribed).

Each check of tests/frameworks/workers/torch_fidelity_worker.py states the Horovod behaviour it matches, in
closed form: gradients of every collective, float16 pre/postscaling to the bit, names in flight refused, join's
limits, the sparse path and the optimizer-state helpers.
"""

from __future__ import annotations

from typing import Any

import pytest
from frameworks_helpers import assert_check, assert_same_checks, require_framework, run_checks

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

CHECKS = [
    "grad_allgather_is_the_average_of_the_ranks_gradients",
    "grad_grouped_allgather_is_differentiable_and_averages",
    "grad_broadcast_is_the_average_on_the_root_and_zero_elsewhere",
    "grad_reducescatter_sum_and_average_match_horovod",
    "grad_grouped_reducescatter_is_differentiable",
    "grad_alltoall_equal_splits_with_rank_dependent_sizes",
    "grad_alltoall_with_splits",
    "grad_allreduce_keeps_op_and_scaling",
    "prescale_matches_horovod_exactly",
    "postscale_matches_horovod_exactly",
    "reducescatter_scaling_matches_horovod_exactly",
    "grouped_reducescatter_async_returns_the_list",
    "duplicate_names_in_flight_raise",
    "duplicate_name_of_a_grouped_member_raises",
    "join_refuses_allgather_and_broadcast_on_the_other_ranks",
    "join_then_unnamed_allgather_fails_and_allgather_object_still_pairs",
    "sparse_allreduce_async_returns_a_callable_handle",
    "sparse_embedding_trains_with_sparse_adam",
    "broadcast_optimizer_state_with_parameters_without_gradients",
    "distributed_optimizer_has_horovods_parameter_names",
]


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"{n}ranks")
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_framework("torch")
    return run_checks("torch_fidelity_worker.py", tmp_path_factory.mktemp("torch_fidelity"), n=request.param,
                      timeout=300.0)


@pytest.mark.parametrize("name", CHECKS)
def test_torch_behaves_as_horovod(report: dict[str, Any], name: str) -> None:
    assert_check(report, name)


def test_torch_fidelity_worker_ran_every_check_and_exited_cleanly(report: dict[str, Any]) -> None:
    assert_same_checks(report, CHECKS)
