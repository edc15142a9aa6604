"""Training throughput of hpcvod beside its peers, in one run: PyTorch DDP (gloo) and tf.distribute's
MultiWorkerMirroredStrategy.

    .venv/bin/python benchmarks/bench_training_vs_peers.py [--rounds 3] [--ranks 2 4] [--models mlp cnn transformer]
                                                           [--no-keras] [--no-torch] [--no-ceiling]

PyTorch: hpcvod's ``DistributedOptimizer`` against ``DistributedDataParallel`` over gloo on three models (the MLP
and CNN of bench_torch_synthetic.py, and a small transformer encoder on 64-token sequences), each at every rank
count. Keras 3: the MLP of bench_keras_synthetic.py, a ``tf.function`` step with hpcvod's
``DistributedGradientTape`` against the same step under ``MultiWorkerMirroredStrategy`` (gRPC ring on
localhost). Every configuration is started by the MPICH wheel's ``mpiexec`` with one compute thread per rank,
hpcvod and its peer one after the other in each round (a noisy neighbour slows both alike); each round prints
its ratio, the table the medians. More ranks than cores oversubscribe the machine (the script says so).
For PyTorch each round also runs the same ranks without any gradient exchange (the ``ceiling``): ceiling / DDP
is the most any data-parallel library could gain over DDP on this machine and model, so a target above it is
out of reach for reasons that are not the library's.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _synthetic_driver import launch  # noqa: E402

TARGETS = {"ddp": 1.2, "mwms": 1.0}     # issue 27: hpcvod / peer total throughput


def compare(script: str, peer: str, n: int, worker_args: list[str], rounds: int, label: str,
            ceiling: bool = False) -> dict:
    """hpcvod and ``peer`` on ``n`` ranks, alternately, ``rounds`` times: per-rank img/sec and their ratio.

    ``ceiling``: also the same ranks training without any gradient exchange (the worker's ``alone`` mode), so
    that ceiling / peer is the best ratio any data-parallel library could reach on this machine and model.
    """
    ours, theirs, ratios, alone = [], [], [], []
    for round_ in range(rounds):
        a = launch(script, "hpcvod", n, worker_args)["per_rank"]
        b = launch(script, peer, n, worker_args)["per_rank"]
        ours.append(a)
        theirs.append(b)
        ratios.append(a / b)
        extra = ""
        if ceiling:
            alone.append(launch(script, "alone", n, worker_args)["per_rank"])
            extra = f"  no exchange {alone[-1]:8.1f} ({alone[-1] / b:4.2f}x {peer})"
        load = os.getloadavg()[0]
        print(f"round {round_ + 1}: {label:28s} {n} ranks: hpcvod {a:8.1f}  {peer} {b:8.1f} img/sec per rank  "
              f"ratio {a / b:5.2f}{extra}  (load {load:.1f})", flush=True)
    return {"label": label, "n": n, "peer": peer, "ours": statistics.median(ours),
            "theirs": statistics.median(theirs), "ratios": ratios,
            "ceiling": statistics.median(a / b for a, b in zip(alone, theirs)) if alone else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "transformer"],
                        choices=["mlp", "cnn", "transformer"])
    parser.add_argument("--keras-ranks", type=int, nargs="+", default=[2])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-keras", action="store_true")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="skip the torch runs without gradient exchange (the best ratio any library could reach)")
    args = parser.parse_args()

    cores = os.cpu_count() or 1
    print(f"machine: {platform.node()}, {cores} cores, torch {version('torch')}, "
          f"tensorflow {version('tensorflow-cpu')}, batch {args.batch_size} per rank, 1 compute thread per rank, "
          f"{args.rounds} rounds; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    used = ([] if args.no_torch else args.ranks) + ([] if args.no_keras else args.keras_ranks)
    over = sorted({n for n in used if n > cores})
    if over:
        print(f"note: {', '.join(map(str, over))} ranks oversubscribe this {cores}-core machine", flush=True)
    common = ["--batch-size", str(args.batch_size), "--warmup", "5", "--iters", "4", "--batches-per-iter", "5"]
    rows = []
    if not args.no_torch:
        for model in args.models:
            for n in args.ranks:
                rows.append(compare(str(HERE / "bench_torch_synthetic.py"), "ddp", n, ["--model", model, *common],
                                    args.rounds, f"torch {model}", ceiling=not args.no_ceiling))
    if not args.no_keras:
        for n in args.keras_ranks:
            rows.append(compare(str(HERE / "bench_keras_synthetic.py"), "mwms", n, common, args.rounds,
                                "keras mlp"))
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}; medians of {args.rounds} rounds (img/sec per rank)")
    print(f"{'model':18s} {'ranks':>5s} {'hpcvod':>9s} {'peer':>22s} {'ratio (median)':>15s} {'rounds':>20s} "
          f"{'target':>7s}  {'ceiling':>7s}")
    for r in rows:
        peer = "DDP gloo" if r["peer"] == "ddp" else "MultiWorkerMirrored"
        target = TARGETS[r["peer"]]
        ratio = statistics.median(r["ratios"])
        each = " ".join(f"{x:.2f}" for x in r["ratios"])
        ceiling = "" if r["ceiling"] is None else f"{r['ceiling']:7.2f}"
        print(f"{r['label']:18s} {r['n']:5d} {r['ours']:9.1f} {peer:>12s} {r['theirs']:9.1f} {ratio:15.2f} "
              f"{each:>20s} {'>=' + str(target):>7s}  {ceiling:>7s}{'' if ratio >= target else '  (missed)'}")
    if any(r["ceiling"] is not None for r in rows):
        print("ceiling: the same ranks training without any gradient exchange, divided by the peer (median of the "
              "rounds): no data-parallel library can beat the peer by more than that on this machine")


if __name__ == "__main__":
    main()
