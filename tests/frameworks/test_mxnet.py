"""hpcvod.mxnet (MXNet 1.9 with the np.bool alias) on 2 real MPI ranks."""

from __future__ import annotations

from typing import Any

import pytest
from frameworks_helpers import assert_check, assert_same_checks, require_framework, run_checks

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

CHECKS = [
    "ops_every_op_and_dtype",
    "ops_in_place_zero_copy_and_others",
    "distributed_trainer_matches_single_rank",
    "distributed_optimizer_in_gluon_trainer_matches_single_rank",
    "broadcast_parameters_after_deferred_init",
    "checkpoint_restore_with_broadcast",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_framework("mxnet")
    return run_checks("mxnet_worker.py", tmp_path_factory.mktemp("mxnet"))


@pytest.mark.parametrize("name", CHECKS)
def test_mxnet_check(report: dict[str, Any], name: str) -> None:
    assert_check(report, name)


def test_mxnet_worker_ran_every_check_and_exited_cleanly(report: dict[str, Any]) -> None:
    assert_same_checks(report, CHECKS)
