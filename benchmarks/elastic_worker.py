"""One rank of benchmarks/bench_elastic.py: the same small PyTorch model trained four ways.

``elastic_worker.py MODE OUT_DIR --steps N --commit-every C [--kill-at K] [--ckpt-dir DIR]``

- ``plain``: a plain hpcvod loop (``hvd.DistributedOptimizer``, no elastic state).
- ``elastic``: the same loop inside ``hvd.elastic.run`` with a ``TorchState``, ``state.commit()`` every C steps.
- ``checkpoint``: the same loop with hpcvod's checkpoint (hpcvod/runtime/checkpoint.py) saved every C steps and
  restored at the start (the requeue path, docs/preemption.md).
- ``torchrun``: the same model under ``torch.distributed.run`` (gloo, DistributedDataParallel), ``torch.save`` of
  model and optimizer every C steps by rank 0, loaded at the start of each restart.

With ``--kill-at K`` the rank that started as 2 SIGKILLs itself right after its step K (in its first run only),
having written the time to OUT_DIR/killed.json. Each rank that finishes writes OUT_DIR/<mode>-rank<start
rank>.json: when its process started, when its imports were done, when it saw the failure, and the end time of the
first step it completed after the failure (or after a restart), plus the steady-state time of the steps after the
warm-up and the time spent in commit / save.

The Open MPI venv has no torch: HPCVOD_BENCH_TORCH_SITE names the main venv's site-packages, appended after this
venv's own (as tests/frameworks/workers/torch_elastic_worker.py does).
"""

from __future__ import annotations

import time

PROCESS_START = time.time()   # before any import: a restart's cost includes them

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

if os.environ.get("HPCVOD_BENCH_TORCH_SITE"):
    sys.path.append(os.environ["HPCVOD_BENCH_TORCH_SITE"])

import numpy as np  # noqa: E402
import torch  # noqa: E402

FEATURES, HIDDEN, CLASSES, BATCH, POOL = 512, 1024, 10, 32, 16
WARMUP = 10                      # steps left out of the steady-state time
VICTIM = 2                       # the rank (at start) that --kill-at kills


def build_model() -> torch.nn.Module:
    """An MLP of 1.6 M parameters (6.3 MB in float32), the same start on every rank."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))


def batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(BATCH, FEATURES, generator=generator),
             torch.randint(0, CLASSES, (BATCH,), generator=generator)) for _ in range(POOL)]


class Clock:
    """What one rank measures, written at the end as JSON."""

    def __init__(self, mode: str, out: Path) -> None:
        self.out = out
        self.record: dict = {"mode": mode, "process_start": PROCESS_START, "imported": None, "failure_seen": None,
                             "first_step_after": None, "first_step_of_run": None, "steady_steps": 0,
                             "steady_seconds": None, "commit_seconds": 0.0, "commits": 0, "resumed_from": None}
        self._warm_at: float | None = None

    def step_done(self, step: int, total: int) -> None:
        now = time.time()
        if self.record["first_step_of_run"] is None:
            self.record["first_step_of_run"] = now
        if self.record["failure_seen"] is not None and self.record["first_step_after"] is None:
            self.record["first_step_after"] = now
        if step == WARMUP:
            self._warm_at = time.perf_counter()
        elif step == total and self._warm_at is not None and self.record["failure_seen"] is None:
            self.record["steady_steps"] = total - WARMUP
            self.record["steady_seconds"] = time.perf_counter() - self._warm_at

    def timed_commit(self, commit: callable) -> None:
        started = time.perf_counter()
        commit()
        self.record["commit_seconds"] += time.perf_counter() - started
        self.record["commits"] += 1

    def maybe_die(self, start_rank: int, step: int, kill_at: int) -> None:
        if kill_at and step == kill_at and start_rank == VICTIM:
            (self.out / "killed.json").write_text(json.dumps({"time": time.time(), "step": step}))
            os.kill(os.getpid(), signal.SIGKILL)

    def write(self, start_rank: int, **extra: object) -> None:
        self.record.update(start_rank=start_rank, **extra)
        (self.out / f"{self.record['mode']}-rank{start_rank}.json").write_text(json.dumps(self.record))


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: tuple) -> None:
    x, y = data
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def run_hpcvod(mode: str, args: argparse.Namespace, clock: Clock) -> None:
    import hpcvod.torch as hvd
    clock.record["imported"] = time.time()
    hvd.init()
    start_rank = hvd.rank()
    model = build_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model.named_parameters())
    pool = batches(start_rank)
    if mode == "plain":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for step in range(1, args.steps + 1):
            train_step(model, optimizer, pool[step % POOL])
            clock.step_done(step, args.steps)
    elif mode == "elastic":
        state = hvd.elastic.TorchState(model, optimizer, step=0)
        if os.environ.get("HPCVOD_ELASTIC_RESTART", "0") != "0":   # a restarted world (MPICH): after the failure
            clock.record["failure_seen"] = PROCESS_START

        @hvd.elastic.run
        def train(state: hvd.elastic.TorchState) -> None:
            try:
                while state.step < args.steps:
                    train_step(model, optimizer, pool[(state.step + 1) % POOL])
                    state.step += 1
                    clock.step_done(state.step, args.steps)
                    clock.maybe_die(start_rank, state.step, args.kill_at)
                    if state.step % args.commit_every == 0:
                        clock.timed_commit(state.commit)
            except hvd.HorovodInternalError:
                if clock.record["failure_seen"] is None:
                    clock.record["failure_seen"] = time.time()
                raise

        train(state)
    else:   # checkpoint: the requeue path
        from hpcvod.runtime.checkpoint import Checkpoint
        params = list(model.parameters())
        ckpt = Checkpoint(directory=args.ckpt_dir, signals=())
        initial = {"step": 0, "params": {f"p{i}": p.detach().numpy() for i, p in enumerate(params)},
                   "momentum": {f"p{i}": np.zeros(tuple(p.shape), np.float32) for i, p in enumerate(params)}}
        state = ckpt.restore(initial)
        clock.record["resumed_from"] = ckpt.resumed_from
        if ckpt.resumed_from is not None:   # a restarted run counts as "after the failure"
            clock.record["failure_seen"] = PROCESS_START
            with torch.no_grad():
                for i, p in enumerate(params):
                    p.copy_(torch.from_numpy(state["params"][f"p{i}"]))
                    optimizer.state[p]["momentum_buffer"] = torch.from_numpy(state["momentum"][f"p{i}"]).clone()
        else:
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        step = state["step"]

        def save() -> None:
            ckpt.save({"step": step, "params": {f"p{i}": p.detach().numpy() for i, p in enumerate(params)},
                       "momentum": {f"p{i}": optimizer.state[p]["momentum_buffer"].numpy()
                                    for i, p in enumerate(params)}}, step=step)

        while step < args.steps:
            train_step(model, optimizer, pool[(step + 1) % POOL])
            step += 1
            clock.step_done(step, args.steps)
            clock.maybe_die(start_rank, step, args.kill_at if ckpt.resumed_from is None else 0)
            if step % args.commit_every == 0:
                clock.timed_commit(save)
    clock.write(start_rank, rank=hvd.rank(), size=hvd.size())


def run_torchrun(args: argparse.Namespace, clock: Clock) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    clock.record["imported"] = time.time()
    dist.init_process_group("gloo")
    rank, restarts = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    path = Path(args.ckpt_dir) / "torchrun.pt"
    step = 0
    if path.exists():
        saved = torch.load(path)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = clock.record["resumed_from"] = saved["step"]
    if restarts:
        clock.record["failure_seen"] = PROCESS_START
    ddp = DistributedDataParallel(model)   # broadcasts rank 0's parameters
    pool = batches(rank)

    def save() -> None:
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                       path.with_suffix(".partial"))
            os.replace(path.with_suffix(".partial"), path)
        dist.barrier()

    while step < args.steps:
        train_step(ddp, optimizer, pool[(step + 1) % POOL])
        step += 1
        clock.step_done(step, args.steps)
        clock.maybe_die(rank, step, args.kill_at if restarts == 0 else 0)
        if step % args.commit_every == 0:
            clock.timed_commit(save)
    clock.write(rank, rank=rank, size=dist.get_world_size(), restarts=restarts)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["plain", "elastic", "checkpoint", "torchrun"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--commit-every", type=int, default=10)
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--ckpt-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock = Clock(args.mode, args.out)
    if args.mode == "torchrun":
        run_torchrun(args, clock)
    else:
        run_hpcvod(args.mode, args, clock)


if __name__ == "__main__":
    main()
