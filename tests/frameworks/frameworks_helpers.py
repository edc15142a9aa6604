"""Launch real MPI ranks (the main venv's MPICH wheel) running one framework's checks, and read their results.

Framework imports are slow (torch ~1 s, TensorFlow several s), so each framework's checks run in one launch
(tests/frameworks/workers/<framework>_worker.py); every check becomes one pytest test through ``assert_check``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
# Variables a surrounding job could leak into the ranks (a Slurm allocation, a Horovod or hpcvod job script).
_LEAKY_PREFIXES = ("HPCVOD_", "HOROVOD_", "SLURM_", "PMI_", "PMIX_", "OMPI_", "PRTE_", "I_MPI_", "HYDRA_")


def rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY_PREFIXES)}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    env.update(extra or {})
    return env


def require_framework(module: str) -> None:
    """Skips (without importing it: that costs seconds) when ``module`` is not installed in this venv."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in {sys.prefix}")


def launch(n: int, script: Path, *args: str, timeout: float = 240.0,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``mpiexec -n N python SCRIPT ARGS`` with a clean environment; a hang fails the test with the output."""
    if not MPIEXEC.exists():
        pytest.fail(f"no mpiexec beside {sys.executable}: the main venv needs the MPICH wheel "
                    f"(scripts/setup-venvs.sh)")
    argv = [str(MPIEXEC), "-n", str(n), sys.executable, str(script), *args]
    # A hung worker dumps its stacks (tests/frameworks/workers/_harness.py) before we give up on it.
    worker_env = rank_env({"HPCVOD_TEST_WORKER_TIMEOUT": str(max(timeout - 20, 10)), **(env or {})})
    return run_or_fail(argv, worker_env, timeout, f"mpiexec -n {n} {script.name}")


def run_or_fail(argv: list[str], env: dict[str, str], timeout: float, what: str) -> subprocess.CompletedProcess:
    """``argv`` run from the repository root, its output captured; past ``timeout`` the test fails with it."""
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"{what} did not finish within {timeout:.0f} s\n--- stdout ---\n"
                    f"{out[-4000:]}\n--- stderr ---\n{err[-6000:]}")


def run_checks(worker: str, tmp_dir: Path, n: int = 2, timeout: float = 240.0, *args: str) -> dict[str, Any]:
    """Runs a checks worker on ``n`` ranks (``worker RESULTS.json ARGS...``) and returns its report (every rank's
    outcome per check)."""
    out = tmp_dir / f"{worker}.json"
    started = time.monotonic()
    proc = launch(n, WORKERS / worker, str(out), *args, timeout=timeout)
    if not out.exists():
        pytest.fail(f"{worker} on {n} ranks wrote no report (exit status {proc.returncode} after "
                    f"{time.monotonic() - started:.1f} s)\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n"
                    f"{proc.stderr[-8000:]}")
    report = json.loads(out.read_text())
    report["returncode"] = proc.returncode
    report["stderr"] = proc.stderr
    assert report["size"] == n, f"the worker saw a world of {report['size']} ranks, expected {n}"
    return report


def assert_check(report: dict[str, Any], name: str) -> None:
    outcomes = report["checks"].get(name)
    assert outcomes is not None, f"check {name!r} did not run (checks that ran: {sorted(report['checks'])})"
    failed = [(rank, o["detail"]) for rank, o in enumerate(outcomes) if not o["ok"]]
    assert not failed, "\n".join(f"--- rank {rank} ---\n{detail}" for rank, detail in failed)


def assert_same_checks(report: dict[str, Any], expected: list[str]) -> None:
    """Every check the worker ran is one the tests know, and the worker exited cleanly."""
    assert sorted(report["checks"]) == sorted(expected)
    assert report["returncode"] == 0, report["stderr"][-4000:]
