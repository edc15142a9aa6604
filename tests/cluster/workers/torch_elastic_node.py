"""Elastic PyTorch training for the Slurm sandbox (tests/cluster/test_slurm_elastic.py): a tiny linear model,
hvd.elastic.TorchState with an ElasticSampler, a commit every COMMIT_EVERY steps, SLEEP seconds per step so that
the test can kill a whole node mid-run. The data and the model are tests/frameworks/workers/torch_elastic_worker.py's
(its path in HPCVOD_TEST_MODEL), whose test replays the committed history the same way.

``torch_elastic_node.py EPOCHS SLEEP``. Rank 0 appends ``STEP SIZE HOST`` to $HPCVOD_JOB_DIR/steps.log after each
step (the test's sign of progress); at the end it writes $HPCVOD_JOB_DIR/result.json: its final rank and size, the
resets seen (new size after each), the committed history (the samples of every step, from every rank) and the
parameters. The Open MPI venv has no torch: HPCVOD_TEST_TORCH_SITE names a site-packages that has.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import time
from pathlib import Path

if os.environ.get("HPCVOD_TEST_TORCH_SITE"):
    sys.path.append(os.environ["HPCVOD_TEST_TORCH_SITE"])

import torch  # noqa: E402

import hpcvod.torch as hvd  # noqa: E402

BATCH, COMMIT_EVERY = 4, 2


def model_module():  # -> the module of tests/frameworks/workers/torch_elastic_worker.py
    spec = importlib.util.spec_from_file_location("torch_elastic_worker", os.environ["HPCVOD_TEST_MODEL"])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    epochs, sleep = int(sys.argv[1]), float(sys.argv[2])
    job_dir = Path(os.environ["HPCVOD_JOB_DIR"])
    hvd.init()
    host = socket.gethostname()
    print(f"PROBE {json.dumps({'rank': hvd.rank(), 'size': hvd.size(), 'host': host, 'pid': os.getpid()})}",
          flush=True)
    shared = model_module()
    x, y = shared.data()
    model = shared.fresh_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(shared.SAMPLES), shuffle=True, seed=7)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, history=[])
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    steps = job_dir / "steps.log"

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < epochs:
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
                if hvd.rank() == 0:
                    with steps.open("a") as f:
                        f.write(f"{len(state.history)} {hvd.size()} {host}\n")
                time.sleep(sleep)
                if state.batch % COMMIT_EVERY == 0:
                    state.commit()
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        result = {"rank": hvd.rank(), "size": hvd.size(), "host": host, "resets": resets, "history": state.history,
                  "params": [p.detach().reshape(-1).tolist() for p in model.parameters()]}
        (job_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
