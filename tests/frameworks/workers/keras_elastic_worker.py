"""Keras 3 ``fit`` under ``hvd.elastic.run`` with the Keras state callbacks; the rank that started as 2 SIGKILLs itself
in its second epoch (tests/frameworks/test_elastic.py runs it, beside the PyTorch worker).

``keras_elastic_worker.py OUT_DIR``: each rank that finishes writes OUT_DIR/rank<start rank>.json (final rank and
size, resets, the errors ``fit`` raised inside ``run``, the state's epoch, the weights). Like the torch worker it
takes TensorFlow from HPCVOD_TEST_TORCH_SITE (the main venv's site-packages), appended after the Open MPI venv's.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
from pathlib import Path

if os.environ.get("HPCVOD_TEST_TORCH_SITE"):
    sys.path.append(os.environ["HPCVOD_TEST_TORCH_SITE"])
if os.environ.get("HPCVOD_TEST_WORKER_TIMEOUT"):
    faulthandler.dump_traceback_later(float(os.environ["HPCVOD_TEST_WORKER_TIMEOUT"]), exit=True)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hpcvod.tensorflow.keras as hvd  # noqa: E402

SAMPLES, BATCH, EPOCHS = 48, 4, 3


def main() -> None:
    out = Path(sys.argv[1])
    hvd.init()
    start_rank = hvd.rank()
    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, 3)).astype("float32")
    y = x @ np.array([[0.5], [-1.0], [2.0]], "float32")
    keras.utils.set_random_seed(start_rank)   # different starting weights: sync must make them rank 0's
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    seen: dict = {"resets": [], "errors": []}
    state.register_reset_callbacks([lambda: seen["resets"].append([hvd.rank(), hvd.size()])])

    class Kill(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            if start_rank == 2 and hvd.size() == 3 and state.epoch == 1 and batch == 2:
                os.kill(os.getpid(), signal.SIGKILL)

    callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2), Kill()]

    @hvd.elastic.run
    def train(state: hvd.elastic.KerasState) -> None:
        mine = slice(hvd.rank(), None, hvd.size())   # this world's shard
        try:
            # as Horovod's examples: the epochs left (UpdateEpochStateCallback counts from state.epoch)
            model.fit(x[mine], y[mine], batch_size=BATCH, epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=0)
        except Exception as exc:   # inside a tf.function: TensorFlow's UnknownError carrying the runtime's
            seen["errors"].append(type(exc).__name__)
            raise

    train(state)
    result = {"start_rank": start_rank, "rank": hvd.rank(), "size": hvd.size(), "resets": seen["resets"],
              "errors": seen["errors"], "epoch": state.epoch,
              "weights": [w.reshape(-1).tolist() for w in model.get_weights()]}
    (out / f"rank{start_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
