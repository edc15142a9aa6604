"""Horovod's Keras suites, test/parallel/test_tensorflow2_keras.py and test_tensorflow_keras.py, ported to Keras 3
(issue 29 item 1) and run on 2 real MPI ranks in one launch (workers/keras3_port_worker.py says how each Keras 2
spelling became its Keras 3 form).

Also issue 29 item 4's Keras piece: with hpcvod's Keras module imported, ``model.compile(...,
experimental_run_tf_function=False)`` (Horovod's documented call, which Keras 3 refuses) works, with one warning
line per process.
"""

from __future__ import annotations

from typing import Any

import pytest
from frameworks_helpers import assert_check, assert_same_checks, require_framework, run_checks

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

TF2_KERAS_CHECKS = [  # test_tensorflow2_keras.py, by Horovod's test names
    "train_model_lr_schedule",
    "sparse_as_dense",
    "legacy_optimizer",
    "sparse_as_dense_with_grad_aggregation",
    "grad_aggregation_with_inf_grad",
    "from_config",
    "gradient_aggregation_average_aggregated",
    "gradient_aggregation_summed",
    "gradient_aggregation_with_local_vars_average_aggregated",
    "gradient_aggregation_with_local_vars_summed",
    "partial_distributed_optimizer",
    "broadcast_global_variables_callback_with_local_vars",
    "elastic_state",  # also in test_tensorflow_keras.py
    "elastic_state_callbacks_and_run",  # beyond Horovod's tests: its elastic Keras callbacks
]
TF1_KERAS_CHECKS = [  # test_tensorflow_keras.py (its sparse_as_dense and from_config are the ones above)
    "train_model",
    "train_model_with_gradient_aggregation",
    "load_model",
    "load_model_custom_optimizers",
    "load_model_custom_objects",
    "load_model_broadcast",
    "gradient_aggregation_apply_gradients",
]
COMPILE_WARNING = ("hpcvod: model.compile(): dropped experimental_run_tf_function=False, a Keras 2 argument that "
                   "Keras 3 refuses (remove it from the call)")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_framework("tensorflow")
    return run_checks("keras3_port_worker.py", tmp_path_factory.mktemp("keras3_port"))


@pytest.mark.parametrize("name", TF2_KERAS_CHECKS + TF1_KERAS_CHECKS)
def test_horovod_keras_test_ported(report: dict[str, Any], name: str) -> None:
    assert_check(report, name)


def test_worker_ran_every_ported_test_and_exited_cleanly(report: dict[str, Any]) -> None:
    assert_same_checks(report, TF2_KERAS_CHECKS + TF1_KERAS_CHECKS)


def test_experimental_run_tf_function_is_dropped_with_one_warning_line_per_rank(report: dict[str, Any]) -> None:
    # The worker compiles with the argument three times on each rank (train_model_lr_schedule twice,
    # legacy_optimizer once); each compile worked (those checks pass) and each rank said so once.
    assert_check(report, "train_model_lr_schedule")
    assert_check(report, "legacy_optimizer")
    lines = [line for line in report["stderr"].splitlines() if "experimental_run_tf_function" in line]
    assert lines == [COMPILE_WARNING] * report["size"], lines
