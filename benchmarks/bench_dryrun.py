"""How long `hpcvod submit --dry-run` takes, next to the floor it cannot beat, measured in the same run.

    .venv/bin/python benchmarks/bench_dryrun.py [--rounds 7] [--site slurm-ib-openmpi]

Prints the median wall time of `python -c pass` (interpreter start), `python -c "import jinja2, yaml"` (the two
libraries submission needs) and the dry-run itself, interleaved round by round so a noisy machine affects
all three alike, then the ratios. The budget is 0.3 s wall for the dry-run (issue 2).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_SECONDS = 0.3


def _wall(argv: list[str], cwd: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--site", default="local", help="site profile to render for (default: local)")
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as cwd:
        Path(cwd, "train.py").write_text("print('hi')\n")
        hpcvod = [python, "-m", "hpcvod.cli"]
        cases = {
            "python -c pass": [python, "-c", "pass"],
            "python -c 'import jinja2, yaml'": [python, "-c", "import jinja2, yaml"],
            f"hpcvod submit --dry-run (site {args.site})":
                hpcvod + ["submit", "--dry-run", "--site", args.site, "--nodes", "1", "train.py", "--lr", "0.1"],
        }
        for argv in cases.values():  # warm the file cache and the bytecode
            _wall(argv, cwd)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, argv in cases.items():
                times[name].append(_wall(argv, cwd))
    medians = {name: statistics.median(values) for name, values in times.items()}
    floor, libs, ours = medians.values()
    width = max(len(n) for n in medians)
    print(f"median of {args.rounds} interleaved rounds, wall time:")
    for name, value in medians.items():
        print(f"  {name:<{width}}  {value * 1000:7.1f} ms")
    print(f"  dry-run / python -c pass          = {ours / floor:5.2f}x")
    print(f"  dry-run / import jinja2, yaml     = {ours / libs:5.2f}x")
    verdict = "within" if ours < BUDGET_SECONDS else "OVER"
    print(f"  dry-run {ours * 1000:.0f} ms: {verdict} the {BUDGET_SECONDS * 1000:.0f} ms budget")
    return 0 if ours < BUDGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
