"""Two real MPI ranks running a worker of tests/checkpoint/workers, each printing one ``RESULT {json}`` line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parent / "workers"


def two_ranks(worker: str, *args: str) -> tuple[dict[int, dict], str]:
    """Each rank's RESULT record by rank, and the ranks' stderr; the launch must end with exit status 0."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip(f"no mpiexec beside {sys.executable}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCVOD_", "PMI_", "OMPI_", "SLURM_"))}
    proc = subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(WORKERS / worker), *args],
                          capture_output=True, text=True, timeout=100, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(m) for m in re.findall(r"RESULT (\{[^\n]*?\})(?=RESULT |\n|$)", proc.stdout)]
    by_rank = {r["rank"]: r for r in records}
    assert sorted(by_rank) == [0, 1] and len(records) == 2, proc.stdout + proc.stderr
    return by_rank, proc.stderr
