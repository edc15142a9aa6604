"""hpcvod.tensorflow behaves as Horovod's TensorFlow API does (issues 11 and 18), on real MPI ranks.

tf_gradients_worker.py: the gradients of allreduce, allgather, grouped_allgather, broadcast, reducescatter (Sum,
Average, scaled, grouped) and alltoall against Horovod's closed forms on 1, 2 and 4 ranks, eager and in a
tf.function. tf_semantics_worker.py (2 ranks): Horovod's tf.errors classes, unnamed ops in TF1 graphs pairing by
graph name, pre/postscaled and grouped reducescatter values, in-place broadcasts, IndexedSlices, Keras 3 edges.
"""

from __future__ import annotations

from typing import Any

import pytest
from frameworks_helpers import assert_check, assert_same_checks, require_framework, run_checks

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

GRADIENT_CHECKS = [
    "allreduce_gradient_sum_and_average",
    "allgather_gradient_is_the_average_cut_to_this_rank",
    "grouped_allgather_gradient",
    "broadcast_gradient_is_the_average_on_the_root_only",
    "reducescatter_gradient_sum_average_and_scaled",
    "grouped_reducescatter_gradient",
    "alltoall_gradient_equal_and_explicit_splits",
]
SEMANTIC_CHECKS = [
    "mismatch_is_failed_precondition_eager_function_and_graph",
    "input_errors_are_invalid_argument",
    "tf1_graph_unnamed_ops_pair_by_graph_name",
    "reducescatter_scaled_and_grouped_values",
    "broadcast_inplace_eager_and_graph",
    "indexed_slices_grouped_and_scaling_refused",
    "partial_tape_with_keras3_layers",
    "sync_batch_normalization_matches_global_batch",
    "keras_collectives_take_value_and_name",
    "broadcast_callback_keeps_local_variables",
    "tensorflow_signatures_as_horovod",
]


@pytest.fixture(scope="module", params=[1, 2, 4])
def gradients(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_framework("tensorflow")
    return run_checks("tf_gradients_worker.py", tmp_path_factory.mktemp(f"tf_gradients_{request.param}"),
                      n=request.param, timeout=400.0)


@pytest.fixture(scope="module")
def semantics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_framework("tensorflow")
    return run_checks("tf_semantics_worker.py", tmp_path_factory.mktemp("tf_semantics"), timeout=400.0)


@pytest.mark.parametrize("name", GRADIENT_CHECKS)
def test_gradient_as_horovod(gradients: dict[str, Any], name: str) -> None:
    assert_check(gradients, name)


def test_gradient_worker_ran_every_check(gradients: dict[str, Any]) -> None:
    assert_same_checks(gradients, GRADIENT_CHECKS)


@pytest.mark.parametrize("name", SEMANTIC_CHECKS)
def test_behaves_as_horovod(semantics: dict[str, Any], name: str) -> None:
    assert_check(semantics, name)


def test_semantics_worker_ran_every_check(semantics: dict[str, Any]) -> None:
    assert_same_checks(semantics, SEMANTIC_CHECKS)
