"""The framework examples train on real data (scikit-learn's digits) to the same accuracy on 1 and 2 ranks:
every rank count trains on the same global batches, so the results must agree up to rounding."""

from __future__ import annotations

import re

import pytest
from frameworks_helpers import ROOT, launch, require_framework

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

ACCURACY = re.compile(r"test accuracy ([0-9.]+) \((\d+) ranks, global batch 64\)")


def accuracy(n: int, example: str) -> float:
    proc = launch(n, ROOT / "examples" / example, "--epochs", "8", timeout=240)
    found = ACCURACY.findall(proc.stdout)
    assert proc.returncode == 0 and len(found) == 1, (f"exit status {proc.returncode}\n{proc.stdout[-3000:]}\n"
                                                      f"{proc.stderr[-5000:]}")
    value, ranks = found[0]
    assert int(ranks) == n, f"the example ran on {ranks} ranks, expected {n}"
    return float(value)


@pytest.mark.parametrize("example, framework", [("torch_digits.py", "torch"), ("keras_digits.py", "tensorflow"),
                                                ("mxnet_digits.py", "mxnet")])
def test_two_ranks_reach_the_one_rank_accuracy(example: str, framework: str) -> None:
    require_framework(framework)
    one, two = accuracy(1, example), accuracy(2, example)
    assert abs(one - two) <= 0.01, f"{example}: 1 rank {one:.4f}, 2 ranks {two:.4f}"
    assert two >= 0.85, f"{example}: 2-rank accuracy {two:.4f} is too low to show learning"
