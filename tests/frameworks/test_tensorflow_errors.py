"""Every TensorFlow collective, misused as Horovod's tests misuse it, raises the exception type Horovod raises
(issue 29, item 9), eagerly and, for the misuses that reach the other ranks, in a TF1 graph: ranks that disagree on
shape, dtype, op or root (tf.errors.FailedPreconditionError), a root outside the job and bad alltoall splits
(InvalidArgumentError), a process set without this rank or never registered (InvalidArgumentError; ValueError
for allreduce and grouped_allreduce, which ask the set's size first), a call after shutdown
(FailedPreconditionError; ValueError for those two). The cases are in
tests/frameworks/workers/tf_errors_worker.py, one launch of 2 ranks for all of them."""

from __future__ import annotations

from typing import Any

import pytest
from frameworks_helpers import assert_check, assert_same_checks, require_framework, run_checks

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

COLLECTIVES = ["allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]
MISUSES = [
    "allreduce_shapes_differ", "allreduce_dtypes_differ", "allreduce_ops_differ", "grouped_allreduce_shapes_differ",
    "allgather_trailing_shapes_differ", "allgather_dtypes_differ",
    "broadcast_shapes_differ", "broadcast_dtypes_differ", "broadcast_roots_differ", "broadcast_root_outside_the_job",
    "alltoall_dtypes_differ", "alltoall_splits_do_not_add_up", "alltoall_splits_negative",
    "alltoall_splits_wrong_length", "reducescatter_shapes_differ", "reducescatter_dtypes_differ",
]
CASES = [
    *MISUSES, *[f"{m}_in_a_tf1_graph" for m in MISUSES],
    *[f"{c}_on_a_set_without_this_rank" for c in COLLECTIVES],
    *[f"{c}_on_an_unregistered_process_set" for c in COLLECTIVES],
    *[f"{c}_after_shutdown" for c in COLLECTIVES],
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_framework("tensorflow")
    return run_checks("tf_errors_worker.py", tmp_path_factory.mktemp("tf_errors"), n=2, timeout=300.0)


@pytest.mark.parametrize("case", CASES)
def test_tensorflow_misuse_raises_horovods_exception_type(report: dict[str, Any], case: str) -> None:
    assert_check(report, case)


def test_tensorflow_errors_worker_ran_every_case_and_exited_cleanly(report: dict[str, Any]) -> None:
    assert_same_checks(report, CASES)
