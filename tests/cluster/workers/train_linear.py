"""A small, exactly reproducible data-parallel training job that checkpoints and resumes.

Linear regression on a synthetic dataset; every step each rank takes its slice of the global batch at the
current data position (epoch, batch), the gradients are averaged with hvd.allreduce and every rank applies
the same update. State (parameters + step + data position) goes through hpcvod.runtime.checkpoint, so a
requeued job continues where it stopped. Stops early (save + exit 0) when a stop signal reaches any rank.

Files in --out (default $HPCVOD_JOB_DIR): ranks/<rank>.json (pid, host, local/cross rank, written at start),
applied.log (rank 0: one line per step applied: "<run> <step>"), result.json (rank 0, at the end).
"""

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

import hpcvod.runtime as hvd
from hpcvod.runtime.checkpoint import Checkpoint

SAMPLES, FEATURES, PER_RANK_BATCH, LR = 192, 4, 4, 0.05


def dataset() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((SAMPLES, FEATURES))
    y = x @ np.array([1.5, -2.0, 0.5, 3.0]) + 0.1 * rng.standard_normal(SAMPLES)
    return x, y


def batch_indices(epoch: int, batch: int, rank: int, size: int) -> np.ndarray:
    """This rank's samples at data position (epoch, batch): a fresh permutation per epoch."""
    order = np.random.default_rng(1000 + epoch).permutation(SAMPLES)
    start = (batch * size + rank) * PER_RANK_BATCH
    return order[start:start + PER_RANK_BATCH]


def batches_per_epoch(size: int) -> int:
    return SAMPLES // (PER_RANK_BATCH * size)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step (to leave time to interrupt)")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="0 = only when stopped")
    parser.add_argument("--out", default=os.environ.get("HPCVOD_JOB_DIR", "."))
    args = parser.parse_args()

    hvd.init()
    out = Path(args.out)
    (out / "ranks").mkdir(parents=True, exist_ok=True)
    run = os.environ.get("SLURM_RESTART_COUNT", "0")
    (out / "ranks" / f"{hvd.rank()}.json").write_text(json.dumps({
        "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "cross_rank": hvd.cross_rank(),
        "host": socket.gethostname(), "pid": os.getpid(), "run": run}))
    print(f"rank {hvd.rank()}/{hvd.size()} on {socket.gethostname()}: local_rank {hvd.local_rank()}, "
          f"cross_rank {hvd.cross_rank()}, run {run}", flush=True)

    x, y = dataset()
    ckpt = Checkpoint(out / "checkpoints")
    state = ckpt.restore({"w": np.zeros(FEATURES), "step": 0, "epoch": 0, "batch": 0})
    if hvd.rank() == 0 and ckpt.resumed_from is not None:
        print(f"resumed at step {ckpt.resumed_from}", flush=True)
    log = open(out / "applied.log", "a") if hvd.rank() == 0 else None
    while state["step"] < args.steps:
        idx = batch_indices(state["epoch"], state["batch"], hvd.rank(), hvd.size())
        residual = x[idx] @ state["w"] - y[idx]
        grad = hvd.allreduce(x[idx].T @ residual / len(idx), name="grad", op=hvd.Average)
        state["w"] = state["w"] - LR * grad
        state["step"] += 1
        state["batch"] += 1
        if state["batch"] == batches_per_epoch(hvd.size()):
            state["epoch"], state["batch"] = state["epoch"] + 1, 0
        if log:
            log.write(f"{run} {state['step']}\n")
            log.flush()
        time.sleep(args.sleep)
        stop = state["step"] < args.steps and ckpt.stop_requested()   # done: finish, do not requeue
        if stop or (args.checkpoint_every and state["step"] % args.checkpoint_every == 0):
            ckpt.save(state)
        if stop:
            print(f"rank {hvd.rank()}: stopping at step {state['step']} (checkpoint saved)", flush=True)
            hvd.shutdown()
            return 0
    if hvd.rank() == 0:
        (out / "result.json").write_text(json.dumps({"steps": state["step"], "w": state["w"].tolist(),
                                                     "epoch": state["epoch"], "batch": state["batch"]}))
        print(f"done: {state['step']} steps, w = {state['w'].tolist()}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
