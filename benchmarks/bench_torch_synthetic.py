"""Synthetic PyTorch training throughput: hpcvod's DistributedOptimizer against DistributedDataParallel (gloo).

    .venv/bin/python benchmarks/bench_torch_synthetic.py [--model mlp|cnn] [--batch-size 32] [--rounds 3]
                                                         [--device cpu|cuda]

One invocation launches, in interleaved rounds (medians reported), with the MPICH wheel's ``mpiexec``:
  * hpcvod, 1 rank   (the scaling reference: a DistributedOptimizer on one rank is the plain optimizer)
  * hpcvod, 2 ranks  (``hvd.DistributedOptimizer``: gradient allreduces start from backward hooks)
  * DDP,    2 ranks  (``torch.nn.parallel.DistributedDataParallel`` over gloo, default buckets)
with the same model, the same per-rank batch of synthetic images and one compute thread per rank, in the
spirit of Horovod's ``pytorch_synthetic_benchmark.py``: warm-up batches, then timed iterations of several
batches; img/sec per rank and in total. Scaling efficiency = 2-rank total / (2 x 1-rank). The ranks are
started by ``mpiexec`` for both systems; DDP's workers read their rank from the launcher's PMI variables and
meet over TCP on localhost (``--worker`` runs one rank; the driver starts them).

``--device cuda`` puts the model and the batches on the rank's GPU (local rank modulo the visible GPUs): hpcvod
reduces CUDA gradients through NCCL (one GPU per rank) or staged through MPI (ranks sharing a GPU), DDP uses NCCL
when every rank has its own GPU and gloo on CUDA tensors when ranks share one (NCCL refuses that).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic_driver import interleaved, print_result, table  # noqa: E402


# ---------------------------------------------------------------------------------------------- models
MODELS = ("mlp", "cnn", "transformer")
VOCAB, TOKENS = 1000, 64


def synthetic_batch(name: str, batch_size: int, device):
    """(inputs, class labels): 32x32x3 images, or ``TOKENS`` token ids for the transformer."""
    import torch

    if name == "transformer":
        data = torch.randint(0, VOCAB, (batch_size, TOKENS), device=device)
    else:
        data = torch.randn(batch_size, 3, 32, 32, device=device)
    return data, torch.randint(0, 10, (batch_size,), device=device)


def build_model(name: str):
    import torch
    from torch import nn

    if name == "transformer":  # 2 encoder layers over 64 tokens, 1.2 M parameters: many small tensors
        class Classifier(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(VOCAB, 128)
                layer = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
                self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                self.head = nn.Linear(128, 10)

            def forward(self, tokens: torch.Tensor) -> torch.Tensor:
                return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

        return Classifier()
    if name == "mlp":  # 12.6 M parameters (50 MB of gradients per step): communication matters
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 2048), nn.ReLU(), nn.Linear(2048, 2048),
                             nn.ReLU(), nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 10))

    class Block(nn.Module):
        """A ResNet basic block."""

        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                      nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = (nn.Identity() if stride == 1 and cin == cout else
                         nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.body(x) + self.skip(x))

    # a narrow CIFAR-sized ResNet-10 (0.6 M parameters): compute-bound, communication is a small share
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         Block(16, 32, 1), Block(32, 64, 2), Block(64, 128, 2), Block(128, 128, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


# ---------------------------------------------------------------------------------------------- one rank
def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    device = torch.device("cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device on this machine")
        local = int(os.environ.get("MPI_LOCALRANKID", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    if args.worker == "hpcvod":
        import hpcvod.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    elif args.worker == "alone":
        # The ceiling of any data-parallel library here: every rank runs the same steps, nothing is exchanged
        # (the ranks still share the machine's cores and memory bandwidth, as in the other two).
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        rank, size = world.Get_rank(), world.Get_size()
    else:
        import torch.distributed as dist
        rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
        own_gpus = args.device == "cuda" and torch.cuda.device_count() >= size
        dist.init_process_group("nccl" if own_gpus else "gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=rank, world_size=size)

    model = build_model(args.model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if args.worker == "hpcvod":
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    elif args.worker == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    data, target = synthetic_batch(args.model, args.batch_size, device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(data), target).backward()
        optimizer.step()

    def barrier() -> None:
        if args.worker == "hpcvod":
            hvd.barrier()
        elif args.worker == "alone":
            world.Barrier()
        else:
            dist.barrier()

    def sync() -> None:                 # CUDA kernels run asynchronously: time finished work only
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        step()
    sync()
    rates = []
    for _ in range(args.iters):
        barrier()
        start = time.perf_counter()
        for _ in range(args.batches_per_iter):
            step()
        sync()
        barrier()  # an iteration ends when the slowest rank is done
        rates.append(args.batch_size * args.batches_per_iter / (time.perf_counter() - start))
    if rank == 0:
        print_result(rates, sum(p.numel() for p in model.parameters()))
    if args.worker == "hpcvod":
        hvd.shutdown()
    elif args.worker == "ddp":
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- driver
def driver(args: argparse.Namespace) -> None:
    worker_args = ["--model", args.model, "--batch-size", str(args.batch_size), "--warmup", str(args.warmup),
                   "--iters", str(args.iters), "--batches-per-iter", str(args.batches_per_iter),
                   "--device", args.device]
    med, params = interleaved(__file__, [("hpcvod", 1), ("hpcvod", 2), ("ddp", 2)], worker_args, args.rounds)
    single, ours, ddp = med[("hpcvod", 1)], med[("hpcvod", 2)], med[("ddp", 2)]
    print()
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, torch {version('torch')}, "
          f"model {args.model} ({params / 1e6:.1f} M parameters), batch {args.batch_size} per rank, "
          f"1 compute thread per rank, device {args.device}, medians of {args.rounds} interleaved rounds")
    peer = "torch DDP (NCCL, or gloo where ranks share a GPU)" if args.device == "cuda" else "torch DDP over gloo"
    table([("hpcvod, 1 rank", single, 1), ("hpcvod DistributedOptimizer", ours, 2), (peer, ddp, 2)], single)
    print(f"hpcvod / DDP total throughput: {ours / ddp:.3f}x (target >= 1.0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="mlp")
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    parser.add_argument("--warmup", type=int, default=5, help="untimed batches first")
    parser.add_argument("--iters", type=int, default=4, help="timed iterations")
    parser.add_argument("--batches-per-iter", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of all three runs")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where model and batches live")
    parser.add_argument("--worker", choices=["hpcvod", "ddp", "alone"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
