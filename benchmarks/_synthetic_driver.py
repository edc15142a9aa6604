"""Shared driver of the ``*_synthetic.py`` benchmarks: launch each configuration with the venv's ``mpiexec``,
in interleaved rounds (a noisy neighbour slows every configuration alike), and report medians.

A benchmark's worker (the same script, started with ``--worker SYSTEM``) prints one line
``RESULT {"per_rank": img/sec, "params": N}`` on rank 0.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

RESULT_TAG = "RESULT "
ROOT = Path(__file__).resolve().parents[1]


def print_result(per_rank_rates: list[float], params: int) -> None:
    """What a worker's rank 0 prints: the mean img/sec of its timed iterations."""
    print(RESULT_TAG + json.dumps({"per_rank": statistics.mean(per_rank_rates), "params": params}), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, system: str, n: int, worker_args: list[str], root: Path = ROOT) -> dict:
    """Runs ``mpiexec -n N python SCRIPT --worker SYSTEM ...`` (importing hpcvod from ``root``) and returns rank 0's
    result."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    argv = [str(mpiexec), "-n", str(n), sys.executable, script, "--worker", system, "--port", str(free_port()),
            *worker_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCVOD_", "HOROVOD_", "PMI_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(root))
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    results = results_in(proc.stdout)
    if proc.returncode != 0 or not results:
        raise SystemExit(f"{system} on {n} ranks failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-4000:]}")
    return results[0]


def results_in(stdout: str) -> list[dict]:
    """Every ``RESULT`` line of a worker's output, parsed (rank 0 prints one)."""
    return [json.loads(line[len(RESULT_TAG):]) for line in stdout.splitlines() if line.startswith(RESULT_TAG)]


def interleaved(script: str, configs: list[tuple[str, int]], worker_args: list[str],
                rounds: int) -> tuple[dict[tuple[str, int], float], int]:
    """Median img/sec per rank of each (system, ranks) configuration, and the model's parameter count."""
    rates: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    params = 0
    for round_ in range(rounds):
        for system, n in configs:
            result = launch(script, system, n, worker_args)
            rates[(system, n)].append(result["per_rank"])
            params = result["params"]
            print(f"round {round_ + 1}: {system:8s} {n} rank(s): {result['per_rank']:8.1f} img/sec per rank",
                  flush=True)
    return {c: statistics.median(v) for c, v in rates.items()}, params


def table(rows: list[tuple[str, float, int]], single: float) -> None:
    """Rows of (label, img/sec per rank, ranks); scaling efficiency against ``single`` (1 rank)."""
    print(f"{'system':30s} {'img/sec per rank':>17s} {'total img/sec':>14s} {'scaling eff.':>13s}")
    for label, per_rank, n in rows:
        eff = "(reference)" if n == 1 else f"{per_rank / single:.1%}"
        print(f"{label:30s} {per_rank:17.1f} {per_rank * n:14.1f} {eff:>13s}")
