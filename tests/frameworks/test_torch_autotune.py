"""Autotune under a real training loop (hpcvod.torch's DistributedOptimizer on 2 ranks): every trial setting,
the cache turned off and on again included, leaves the trained parameters bit for bit as without autotune."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from frameworks_helpers import launch, require_framework

WORKER = Path(__file__).resolve().parent / "workers" / "torch_autotune_worker.py"
LINE = re.compile(r"^rank (\d) tuned (\d+) digest ([0-9a-f]{16})$", re.M)


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_training_with_autotune_computes_what_training_without_it_does() -> None:
    require_framework("torch")
    plain = launch(2, WORKER, "300")
    tuned = launch(2, WORKER, "300", env={"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2",
                                          "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1"})
    runs = []
    for done in (plain, tuned):
        assert done.returncode == 0, done.stdout + done.stderr
        runs.append({int(r): (int(n), d) for r, n, d in LINE.findall(done.stdout)})
    assert sorted(runs[0]) == sorted(runs[1]) == [0, 1], runs
    assert [n for n, _ in runs[0].values()] == [0, 0]
    assert runs[1][0][0] == runs[1][1][0] >= 10, runs        # every trial of the search, on both ranks
    assert {d for _, d in runs[0].values()} == {d for _, d in runs[1].values()}, runs
    assert len({d for _, d in runs[0].values()}) == 1, runs   # the ranks agree
