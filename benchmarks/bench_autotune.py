"""Autotune against hand-tuned settings, in one invocation (issue 27 item 2).

    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/bench_autotune.py [--steps 60] [--steps-per-sample 5]

The model's gradients are a poor match for the defaults: many small tensors (``--small`` x ``--small-kib`` KiB)
and one huge layer (``--large-mib`` MiB), reduced in place each step with ``allreduce_async_`` then
``synchronize`` (op Average), as DistributedOptimizer does. The default 128 MiB fusion threshold packs the huge
layer into the fusion buffer with the small ones (a copy in and out of it each step) and the 0 ms cycle time
negotiates the first tensors before the rest arrive.

1. Hand-tuned: every setting of a grid (fusion threshold x cycle time) in a fresh world (init/shutdown), its
   throughput (gradient bytes reduced per second, the slowest rank's wall time) over ``--steps`` steps after a
   few warm-up steps.
2. ``--rounds`` times: a fresh world with HOROVOD_AUTOTUNE=1 from the defaults trains until the tuner settles
   (the step is printed), then ``--steps`` more steps are measured; then the best hand-tuned setting of 1. once
   more, right after, so that both figures come from the same minutes.

Printed: each figure, and the median of autotune's throughput as a fraction of the median of the best
hand-tuned one (target >= 0.95).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import hpcvod.runtime as hvd
from hpcvod.runtime import context

MIB = 1 << 20
FUSION_MIB = (0, 1, 4, 16, 64, 128)
CYCLE_MS = (0.0, 2.5)
TUNED = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
         "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "HPCVOD_FUSION_THRESHOLD", "HPCVOD_CYCLE_TIME", "HPCVOD_AUTOTUNE")


def make_grads(args: argparse.Namespace) -> list[np.ndarray]:
    small = [np.ones(args.small_kib * 1024 // 4, np.float32) for _ in range(args.small)]
    return small + [np.ones(args.large_mib * MIB // 4, np.float32)]


def step(grads: list[np.ndarray], names: list[str]) -> None:
    handles = [hvd.allreduce_async_(g, name=n) for g, n in zip(grads, names)]
    for h in handles:
        hvd.synchronize(h)


def throughput(grads: list[np.ndarray], names: list[str], steps: int) -> float:
    """Gradient bytes reduced per second over ``steps`` steps (the slowest rank's time)."""
    comm = MPI.COMM_WORLD
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step(grads, names)
    elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
    return sum(g.nbytes for g in grads) * steps / elapsed


def world(env: dict[str, str]) -> None:
    """A fresh hpcvod world whose settings are ``env`` (every rank sets the same)."""
    for key in TUNED:
        os.environ.pop(key, None)
    os.environ.update(env)
    hvd.init()


def hand_tuned(grads: list[np.ndarray], names: list[str], fusion_mib: float, cycle_ms: float,
               args: argparse.Namespace) -> float:
    world({"HOROVOD_FUSION_THRESHOLD": str(int(fusion_mib * MIB)), "HOROVOD_CYCLE_TIME": f"{cycle_ms:g}"})
    for _ in range(args.warmup):
        step(grads, names)
    value = throughput(grads, names, args.steps)
    hvd.shutdown()
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=128, help="number of small tensors (default 128)")
    parser.add_argument("--small-kib", type=int, default=8, help="size of each small tensor in KiB (default 8)")
    parser.add_argument("--large-mib", type=int, default=16, help="size of the huge layer in MiB (default 16)")
    parser.add_argument("--steps", type=int, default=60, help="measured steps per figure (default 60)")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured steps before each hand-tuned figure")
    parser.add_argument("--steps-per-sample", type=int, default=5, help="HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE")
    parser.add_argument("--max-steps", type=int, default=1000, help="give up waiting for autotune after this")
    parser.add_argument("--rounds", type=int, default=3, help="autotune runs, each followed by the best "
                        "hand-tuned setting (medians reported)")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    say = print if comm.Get_rank() == 0 else (lambda *a, **k: None)
    grads = make_grads(args)
    names = [f"grad.{i}" for i in range(len(grads))]
    total = sum(g.nbytes for g in grads)
    say(f"hpcvod autotune benchmark: {comm.Get_size()} ranks, {MPI.Get_library_version().splitlines()[0].strip()}")
    say(f"model: {args.small} x {args.small_kib} KiB + 1 x {args.large_mib} MiB = {total / 1e6:.1f} MB of "
        f"gradients per step; throughput in GB/s of gradients reduced (in place, op Average)\n")

    grid: dict[tuple[float, float], float] = {}
    for fusion in FUSION_MIB:
        for cycle in CYCLE_MS:
            grid[(fusion, cycle)] = hand_tuned(grads, names, fusion, cycle, args)
            say(f"  hand-tuned fusion {fusion:>4g} MiB, cycle {cycle:>4g} ms: {grid[(fusion, cycle)] / 1e9:6.3f} GB/s"
                + ("   (the defaults)" if (fusion, cycle) == (128, 0.0) else ""))
    best = max(grid, key=grid.get)

    autotuned, hand, settled_at = [], [], []
    chosen = None
    for _ in range(args.rounds):
        result = autotune_run(grads, names, args)
        if result is None:
            say(f"autotune: not settled after {args.max_steps} steps")
            return
        steps, chosen, value = result
        settled_at.append(steps)
        autotuned.append(value)
        hand.append(hand_tuned(grads, names, best[0], best[1], args))
        say(f"  round {len(hand)}: autotune settled after {steps} steps on fusion "
            f"{chosen.fusion_threshold / MIB:g} MiB, cycle {chosen.cycle_time_ms:g} ms, cache "
            f"{'on' if chosen.cache_enabled else 'off'}: {value / 1e9:.3f} GB/s over the next {args.steps} steps; "
            f"best hand-tuned (fusion {best[0]:g} MiB, cycle {best[1]:g} ms) right after: {hand[-1] / 1e9:.3f} GB/s")
    ratio = statistics.median(autotuned) / statistics.median(hand)
    say(f"\nmedians over {args.rounds} rounds: autotune {statistics.median(autotuned) / 1e9:.3f} GB/s (settled after "
        f"{statistics.median(settled_at):g} steps), best hand-tuned {statistics.median(hand) / 1e9:.3f} GB/s, the "
        f"defaults {grid[(128, 0.0)] / 1e9:.3f} GB/s (grid)")
    say(f"autotune / best hand-tuned: {ratio:.2f} (target >= 0.95)")


def autotune_run(grads: list[np.ndarray], names: list[str], args: argparse.Namespace) -> tuple | None:
    """A fresh world with autotune on: (steps until it settled, the setting, throughput over ``args.steps`` steps
    after that), or None when it did not settle within ``args.max_steps``."""
    comm = MPI.COMM_WORLD
    world({"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": str(args.steps_per_sample),
           "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1"})
    lane = context.runtime().lanes[0]
    steps = 0
    settled = 0
    while not settled and steps < args.max_steps:
        step(grads, names)
        steps += 1
        # rank 0's tuner is gone once every rank applied its final setting
        settled = comm.allreduce(1 if comm.Get_rank() == 0 and lane.tuned and lane.tuner is None else 0)
    value = throughput(grads, names, args.steps) if settled else 0.0
    chosen = lane.tuned[-1] if lane.tuned else None
    hvd.shutdown()
    return (steps, chosen, value) if settled else None


if __name__ == "__main__":
    main()
