"""hpcvod.torch's DistributedOptimizer trains a small model for STEPS steps; each rank prints how many autotune
settings its engine applied and a digest of the trained parameters (test_torch_autotune.py: the same with and
without autotune, so no trial changed what was computed)."""

import hashlib
import os
import sys

import torch

import hpcvod.torch as hvd
from hpcvod.runtime import context

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(10)])
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.randn(16, 32) + hvd.rank()          # different data per rank: the averaged gradients matter
for step in range(int(sys.argv[1])):
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
tuned = len(context.runtime().lanes[0].tuned)
os.write(1, f"rank {hvd.rank()} tuned {tuned} digest {digest}\n".encode())
hvd.shutdown()
