"""hpcvod.torch on 2 real MPI ranks: collectives, autograd, DistributedOptimizer, broadcasts, SyncBatchNorm."""

from __future__ import annotations

from typing import Any

import pytest
from frameworks_helpers import assert_check, assert_same_checks, require_framework, run_checks

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

CHECKS = [
    "ops_allreduce_every_op_and_dtype",
    "ops_allreduce_inplace_writes_into_tensor_zero_copy",
    "ops_async_poll_synchronize",
    "ops_grouped_allreduce",
    "ops_allgather_broadcast_alltoall_reducescatter",
    "ops_compression_fp16",
    "autograd_through_collectives",
    "objects_join_barrier",
    "train_matches_single_rank_and_ranks_stay_identical",
    "optimizer_starts_reductions_during_backward",
    "optimizer_options_keep_ranks_identical",
    "optimizer_backward_passes_per_step",
    "optimizer_sparse_gradients",
    "process_sets",
    "optimizer_synchronize_skip_and_misuse",
    "lr_scheduler_created_before_wrapping",
    "checkpoint_restore_with_broadcast",
    "sync_batch_norm_matches_full_batch",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_framework("torch")
    return run_checks("torch_worker.py", tmp_path_factory.mktemp("torch"))


@pytest.mark.parametrize("name", CHECKS)
def test_torch_check(report: dict[str, Any], name: str) -> None:
    assert_check(report, name)


def test_torch_worker_ran_every_check_and_exited_cleanly(report: dict[str, Any]) -> None:
    assert_same_checks(report, CHECKS)
