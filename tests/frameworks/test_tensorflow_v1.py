"""TensorFlow v1 graph mode through tf.compat.v1 (issue 17): the seeds' TF v1 example and Horovod's TF1 API
(DistributedOptimizer over tf.compat.v1.train optimizers, BroadcastGlobalVariablesHook,
broadcast_global_variables) on 1, 2 and 4 real MPI ranks (4 oversubscribed)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from frameworks_helpers import ROOT, WORKERS, assert_check, assert_same_checks, launch, require_framework, \
    run_checks

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

CHECKS = [
    "seeds_example_hook_session_and_rank0_checkpoints",
    "broadcast_global_variables_after_initialization",
    "every_graph_collective_gives_the_eager_values",
    "optimizer_options_sum_local_vars_and_aggregation",
    "fetching_one_op_runs_only_what_it_depends_on",
    "ops_run_in_different_orders_pair_by_name_and_fuse",
]


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"{n}ranks")
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_framework("tensorflow")
    base = tmp_path_factory.mktemp(f"tf1_{request.param}")
    (base / "checkpoints").mkdir()
    return run_checks("tf1_worker.py", base, request.param, 300.0, str(base / "checkpoints"))


@pytest.mark.parametrize("name", CHECKS)
def test_tf1_graph_mode(report: dict[str, Any], name: str) -> None:
    assert_check(report, name)


def test_tf1_worker_ran_every_check_and_exited_cleanly(report: dict[str, Any]) -> None:
    assert_same_checks(report, CHECKS)


def test_graph_and_eager_code_in_one_process_do_not_interfere(tmp_path: Path) -> None:
    require_framework("tensorflow")
    report = run_checks("tf1_mixed_worker.py", tmp_path)
    assert_check(report, "graph_and_eager_in_one_process")
    assert report["returncode"] == 0, report["stderr"][-4000:]


def test_a_rank_failing_inside_session_run_ends_the_job_on_every_rank() -> None:
    require_framework("tensorflow")
    started = time.monotonic()
    proc = launch(2, WORKERS / "tf1_fail_worker.py", timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-4000:]
    assert "TRAINED TO THE END" not in proc.stdout, output[-4000:]
    assert "injected failure inside session.run" in output, output[-4000:]
    assert re.search(r"rank 0: .*rank 1 .*failed", proc.stderr), output[-6000:]
    assert time.monotonic() - started < 200


def test_the_seeds_tf1_example_trains_and_checkpoints_on_rank_0(tmp_path: Path) -> None:
    require_framework("tensorflow")
    checkpoints = tmp_path / "ckpt"
    proc = launch(2, ROOT / "examples" / "tensorflow1_digits.py", timeout=300,
                  env={"TF1_DIGITS_CHECKPOINT_DIR": str(checkpoints), "TF1_DIGITS_STEPS": "300"})
    found = re.findall(r"test accuracy ([0-9.]+) after 300 steps on 2 ranks", proc.stdout)
    assert proc.returncode == 0 and found, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert float(found[0]) > 0.8
    assert any(p.name.startswith("model.ckpt") for p in checkpoints.iterdir()), list(checkpoints.iterdir())
