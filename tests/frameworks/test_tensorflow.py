"""hpcvod.tensorflow and hpcvod.tensorflow.keras (Keras 3) on 2 real MPI ranks."""

from __future__ import annotations

import os
from typing import Any

import pytest
from frameworks_helpers import (
    ROOT, WORKERS, assert_check, assert_same_checks, launch, require_framework, run_checks,
)

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

CHECKS = [
    "ops_eager_every_op_and_dtype",
    "ops_zero_copy_views",
    "ops_eager_gather_broadcast_alltoall_reducescatter_sparse",
    "ops_inside_tf_function",
    "gradients_through_collectives_eager_and_graph",
    "broadcast_variables_and_objects",
    "custom_loop_distributed_gradient_tape_matches_single_rank",
    "partial_tape_keeps_local_layer_local_and_sparse_grads",
    "keras_fit_matches_single_rank_with_callbacks",
    "keras_backward_passes_per_step",
    "learning_rate_callbacks",
    "checkpoint_restore_with_load_model_and_broadcast_callback",
    "xla_compiled_step_gives_a_clear_error",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_framework("tensorflow")
    return run_checks("tf_worker.py", tmp_path_factory.mktemp("tensorflow"))


@pytest.mark.parametrize("name", CHECKS)
def test_tensorflow_check(report: dict[str, Any], name: str) -> None:
    assert_check(report, name)


def test_tensorflow_worker_ran_every_check_and_exited_cleanly(report: dict[str, Any]) -> None:
    assert_same_checks(report, CHECKS)


def test_tensorflow_gpu_branch_on_the_cpu_stand_in() -> None:
    """The GPU branch of hpcvod.tensorflow (DLPack in and out, bfloat16 as tagged words, out-of-place forms) on 2
    ranks, with the CPU stand-in for CuPy and NCCL (tests/runtime/cpu_cupy): plumbing only; CUDA needs a GPU."""
    require_framework("tensorflow")
    stand_in = ROOT / "tests" / "runtime" / "cpu_cupy"
    run = launch(2, WORKERS / "tf_device_glue.py", timeout=240,
                 env={"PYTHONPATH": f"{stand_in}{os.pathsep}{ROOT}"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    assert run.stdout.count("TF DEVICE GLUE OK 13") == 2, run.stdout[-3000:] + run.stderr[-3000:]
