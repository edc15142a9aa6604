"""hvd.init() starts MPI when the script left that to it (issue 29, item 6), as Horovod does.

A script that sets ``mpi4py.rc.initialize = False`` died at hvd.init() with MPICH's "Attempting to use an MPI
routine before initializing" and exit status 1. Horovod's test/parallel/test_process_sets_static.py, which does
that, is ported in tests/frameworks/workers/mpi_started_by_hpcvod_worker.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from frameworks_helpers import ROOT, WORKERS, launch, rank_env, require_framework

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]


@pytest.mark.parametrize("framework,n", [("tensorflow", 2), ("tensorflow", 3), ("torch", 2)])
def test_process_sets_static_with_mpi_left_to_hpcvod(framework: str, n: int) -> None:
    require_framework(framework)
    proc = launch(n, WORKERS / "mpi_started_by_hpcvod_worker.py", framework, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for rank in range(n):
        for line in ("duplicate sets refused: ", "thread level multiple: True", "process sets {0: ",
                     "shut down", "at exit MPI finalized: True"):
            assert f"rank {rank}: {line}" in out, f"rank {rank} did not print {line!r}:\n{out[-6000:]}"


def test_init_after_mpi_was_finalized_says_so_in_one_line() -> None:
    require_framework("torch")
    script = ("import mpi4py\nmpi4py.rc.initialize = False\nfrom mpi4py import MPI\nMPI.Init()\nMPI.Finalize()\n"
              "import hpcvod.torch as hvd\n"
              "try:\n    hvd.init()\nexcept hvd.HpcvodError as exc:\n    print('refused:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=rank_env(), cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: hvd.init(): MPI has already been finalized in this process" in proc.stdout, proc.stdout
