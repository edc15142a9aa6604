"""An elastic job for ``hpcvod run``'s elastic driver (tests/frameworks/test_elastic_run.py): NumPy only, so that
a rank starts in a fraction of a second.

``elastic_run_worker.py MODE OUT_DIR``. Each step adds the world's average of ``step`` (the same on every rank
whatever the size) to a parameter vector and commits; the committed history lists the steps, so a step done twice
or lost shows. MODE:
  ``grow N``: train until the world has N ranks (the test adds hosts), then STEPS_AFTER more steps;
  ``shrink N``: until the world has N ranks (the test removes a host), then STEPS_AFTER more steps;
  ``kill``/``raise``: the rank that started as 1 SIGKILLs itself / raises at step FAIL_AT; the others finish;
  ``raise_all``: every rank raises at step FAIL_AT;
  ``kill_until N``: the last rank of a world of N ranks or more dies at step FAIL_AT, then train until the world
  has N ranks again (its host back from the blacklist);
  ``grow_kill N``: as ``grow``, then the rank spawned last SIGKILLs itself 3 steps after the world reached N
  ranks; train on until STEPS_AFTER steps after that;
  ``fixed``: train STEPS steps (reset-limit / timeout tests kill ranks from outside).
Every rank that finishes writes OUT_DIR/rank<start rank>.json. OUT_DIR/progress<start rank> holds the last
committed step (the test waits on it before changing hosts).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

if os.environ.get("HPCVOD_TEST_WORKER_TIMEOUT"):
    faulthandler.dump_traceback_later(float(os.environ["HPCVOD_TEST_WORKER_TIMEOUT"]), exit=True)

from hpcvod.runtime import collectives, context, reduction  # noqa: E402
from hpcvod.runtime.elastic import ObjectState, run_fn  # noqa: E402

STEPS_AFTER, FAIL_AT, STEPS = 10, 5, 30
PAUSE = 0.05   # per step: gives host discovery (every second) time to see a change mid-training


def main() -> None:
    mode, goal, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    context.init()
    start_rank = context.rank()
    env = {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}
    state = ObjectState(collectives.broadcast_object, context.rank, step=0, params=np.zeros(4), history=[],
                        reached=-1, smallest=1 << 30, grown_at=-1)
    seen: dict = {"resets": [], "sizes": []}
    state.register_reset_callbacks([lambda: seen["resets"].append([context.rank(), context.size()])])

    def done() -> bool:
        if mode in ("grow", "shrink", "kill_until", "grow_kill"):
            return state.reached >= 0 and state.step >= state.reached + STEPS_AFTER
        return state.step >= STEPS

    @run_fn
    def train(state: ObjectState) -> None:
        while not done():
            step = state.step
            # raise_all: a rank that saw another fail first and reset raises in the next world (every rank fails)
            # a restarted world (MPICH, Intel MPI) is new processes: only the first world's ranks fail on purpose
            first_world = os.environ.get("HPCVOD_ELASTIC_RESTART", "0") == "0" or mode in ("kill_until", "raise_all")
            if step == FAIL_AT and (context.size() > 1 or mode == "raise_all") and first_world:
                if mode == "kill" and start_rank == 1 or mode == "kill_until" and context.size() >= goal \
                        and context.rank() == context.size() - 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                if mode == "raise" and start_rank == 1 or mode == "raise_all":
                    raise RuntimeError(f"rank {start_rank} fails on purpose at step {step}")
            if mode == "grow_kill" and state.grown_at >= 0 and step == state.grown_at + 3 \
                    and context.size() >= goal and context.rank() == context.size() - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            mean = reduction.allreduce(np.full(4, float(step)), average=True, name="step")
            time.sleep(PAUSE)
            state.params = state.params + mean
            state.history = state.history + [step]
            state.step = step + 1
            size = context.size()
            state.smallest = min(state.smallest, size)
            if mode == "grow_kill" and size >= goal and state.grown_at < 0:
                state.grown_at = state.step
            if state.reached < 0 and (mode == "grow" and size >= goal or mode == "shrink" and size <= goal
                                      or mode == "kill_until" and size >= goal > state.smallest
                                      or mode == "grow_kill" and state.grown_at >= 0 and size < goal):
                state.reached = state.step
            seen["sizes"].append(size)
            if context.rank() == 0:
                (out / "progress").write_text(f"{state.step} {size}")
            state.commit()

    train(state)
    params = collectives.allgather_object(state.params.tolist())
    (out / f"rank{start_rank}.json").write_text(json.dumps({
        "rank": context.rank(), "size": context.size(), "history": state.history, "params": state.params.tolist(),
        "all_params": params, "resets": seen["resets"], "env": env, "sizes": sorted(set(seen["sizes"]))}))


if __name__ == "__main__":
    main()
