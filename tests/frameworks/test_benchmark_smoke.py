"""The benchmarks that carry issue 27's figures still run (tiny sizes, no timing asserted: speed lives in the
benchmarks themselves, never in a test). A benchmark that no longer starts would only be found the next time
someone needs its figures."""

from __future__ import annotations

import subprocess
import sys

from frameworks_helpers import ROOT, launch, require_framework

BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from _synthetic_driver import results_in  # noqa: E402  (the benchmarks' own parser of a worker's result)


def test_bench_allreduce_prints_every_target_beside_its_raw_reference() -> None:
    proc = launch(2, BENCHMARKS / "bench_allreduce.py", "--max-mib", "0.004", "--rounds", "1",
                  "--budget", "0.001", timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    row = next((line for line in out.splitlines() if line.strip().startswith("4 KiB |")), None)
    assert row is not None, out
    assert "latency us: raw" in row and "x)" in row, row
    assert "x the hand-fused raw code (target <= 1.1x)" in out, out
    assert "16 MiB" not in out, "--max-mib 0.004 must stop at 4 KiB"


def test_probe_call_path_times_every_piece_of_the_call() -> None:
    proc = launch(2, BENCHMARKS / "probe_call_path.py", "--kib", "4", "--rounds", "1", "--calls", "20",
                  timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    arms = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith(" ")]
    assert arms[-6:] == ["raw", "+negotiation", "handle+neg", "solo+executor", "lane.run", "allreduce_"], proc.stdout
    assert "off the chain: +negotiation after" in proc.stdout, proc.stdout


def test_torch_synthetic_workers_run_with_and_without_the_exchange() -> None:
    """``--worker alone`` (the no-exchange ceiling of bench_training_vs_peers) and ``--worker hpcvod`` train the
    same model and report a throughput."""
    require_framework("torch")
    args = ["--model", "cnn", "--batch-size", "4", "--warmup", "1", "--iters", "1", "--batches-per-iter", "1"]
    results = {}
    for system in ("alone", "hpcvod"):
        proc = launch(2, BENCHMARKS / "bench_torch_synthetic.py", "--worker", system, *args, timeout=180)
        assert proc.returncode == 0, f"{system}: {proc.stderr[-4000:]}"
        found = results_in(proc.stdout)
        assert len(found) == 1, proc.stdout[-2000:]
        results[system] = found[0]
    assert results["alone"]["params"] == results["hpcvod"]["params"] > 0
    assert all(r["per_rank"] > 0 for r in results.values()), results


def test_bench_training_vs_peers_refuses_an_unknown_model() -> None:
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_training_vs_peers.py"), "--models", "resnet"],
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 2 and "invalid choice: 'resnet'" in proc.stderr, proc.stderr
