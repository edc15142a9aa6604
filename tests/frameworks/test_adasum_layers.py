"""op=hvd.Adasum through the TensorFlow/Keras and MXNet layers on 2 real MPI ranks (issue 27)."""

from __future__ import annotations

import pytest
from frameworks_helpers import assert_check, assert_same_checks, require_framework, run_checks

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

CHECKS = {
    "tensorflow": ["tensorflow_allreduce_and_grouped_allreduce_are_the_runtimes_adasum",
                   "keras_distributed_optimizer_with_adasum_trains_and_ranks_stay_identical"],
    "mxnet": ["mxnet_allreduce_in_and_out_of_place_is_the_runtimes_adasum"],
}


@pytest.mark.parametrize("framework", sorted(CHECKS))
def test_adasum_through_the_layer(framework: str, tmp_path) -> None:
    require_framework(framework)
    report = run_checks("adasum_layers_worker.py", tmp_path, 2, 240.0, framework)
    for name in CHECKS[framework]:
        assert_check(report, name)
    assert_same_checks(report, CHECKS[framework])
