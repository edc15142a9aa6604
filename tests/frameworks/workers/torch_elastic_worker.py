"""A small elastic PyTorch training run whose failures are scripted (tests/frameworks/test_elastic.py).

``torch_elastic_worker.py MODE OUT_DIR``; MODE says which ranks fail, and how, in the first world:
``none``, ``kill`` (the rank that started as 2 SIGKILLs itself mid-epoch, between two commits), ``kill0`` (rank 0,
the watchdog's hub, does), ``raise`` (rank 2 raises instead), ``allraise`` (every rank raises at that point),
``twice`` (rank 2 is killed, then the rank that started as 1 after the reset). Each rank that finishes writes OUT_DIR/rank<start rank>.json: its final
rank and size, the resets it went through, the errors its training function saw, the committed history (the
samples of every step, from every rank) and the model's parameters.

The Open MPI venv has no torch: HPCVOD_TEST_TORCH_SITE names the main venv's site-packages, appended after this
venv's own (so mpi4py and NumPy stay this venv's).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path

if os.environ.get("HPCVOD_TEST_TORCH_SITE"):
    sys.path.append(os.environ["HPCVOD_TEST_TORCH_SITE"])
if os.environ.get("HPCVOD_TEST_WORKER_TIMEOUT"):
    faulthandler.dump_traceback_later(float(os.environ["HPCVOD_TEST_WORKER_TIMEOUT"]), exit=True)

import torch  # noqa: E402

import hpcvod.torch as hvd  # noqa: E402

SAMPLES, BATCH, EPOCHS, COMMIT_EVERY = 96, 4, 2, 2
FAIL_EPOCH, FAIL_AFTER_BATCH = 0, 5      # 3 ranks: 8 batches per epoch, commits after batches 2, 4, 6, 8


def data() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.linspace(-1.0, 1.0, SAMPLES * 3, dtype=torch.float64).reshape(SAMPLES, 3)
    return x, x @ torch.tensor([[0.5], [-1.0], [2.0]], dtype=torch.float64) + 0.25


def fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1).double()


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    hvd.init()
    start_rank = hvd.rank()
    x, y = data()
    model = fresh_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(SAMPLES), shuffle=True, seed=7)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, history=[])
    seen: dict = {"resets": [], "errors": [], "times": {"start": time.time()}}
    state.register_reset_callbacks([lambda: seen["resets"].append([hvd.rank(), hvd.size()])])
    # when the failure was seen, and when the first step after the reset ended (the recovery time)
    seen["times"]["reset"] = []

    def fails_here() -> bool:
        if state.epoch == FAIL_EPOCH and state.batch == FAIL_AFTER_BATCH and hvd.size() == 3:
            return (mode in ("kill", "raise", "twice") and start_rank == 2 or mode == "kill0" and start_rank == 0
                    or mode == "allraise")
        return mode == "twice" and hvd.size() == 2 and start_rank == 1 and state.epoch == 1 and state.batch == 2

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        try:
            while state.epoch < EPOCHS:
                mine = list(iter(sampler))
                for first in range(0, len(mine), BATCH):
                    idx = mine[first:first + BATCH]
                    optimizer.zero_grad()
                    torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
                    optimizer.step()
                    # a new list, not append: ObjectState's commit keeps a reference, as Horovod's does
                    state.history = state.history + [[state.epoch, hvd.allgather_object(idx)]]
                    sampler.record_batch(first // BATCH, BATCH)
                    state.batch += 1
                    if seen["times"]["reset"] and seen["times"]["reset"][-1][1] is None:
                        seen["times"]["reset"][-1][1] = time.time()
                    if fails_here():
                        if mode in ("kill", "kill0", "twice"):
                            os.kill(os.getpid(), signal.SIGKILL)
                        raise RuntimeError(f"injected failure on the rank that started as {start_rank}")
                    if state.batch % COMMIT_EVERY == 0:
                        state.commit()
                state.epoch += 1
                state.batch = 0
                sampler.set_epoch(state.epoch)
                state.commit()
        except hvd.HorovodInternalError as exc:
            seen["errors"].append(type(exc).__name__)
            seen["times"]["reset"].append([time.time(), None])
            raise

    train(state)
    result = {"start_rank": start_rank, "rank": hvd.rank(), "size": hvd.size(), "resets": seen["resets"],
              "errors": seen["errors"], "times": {**seen["times"], "end": time.time()}, "history": state.history,
              "params": [p.detach().reshape(-1).tolist() for p in model.parameters()]}
    (out / f"rank{start_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
