"""One rank inside a container: where it runs, an allreduce, and a small torch model trained with
hpcvod.torch's DistributedOptimizer; prints one RESULT line of JSON per rank."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys

import torch

import hpcvod.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum).item()

torch.manual_seed(1234 + rank)  # each rank its own start and data; the broadcast and allreduce make them one model
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
true_w = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
x = torch.randn(256, 8)
y = x @ true_w
losses = []
for step in range(60):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(hvd.allreduce(loss.detach(), op=hvd.Average).item())
weights = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes()

data = os.environ.get("CONTAINER_TEST_DATA")
print("RESULT " + json.dumps({
    "rank": rank, "size": size, "allreduce": total, "host": socket.gethostname(), "python": sys.executable,
    "label": json.load(open("/etc/hpcvod-image.json")) if os.path.exists("/etc/hpcvod-image.json") else None,
    "os": open("/etc/os-release").read().split("PRETTY_NAME=", 1)[1].split("\n", 1)[0].strip('"'),
    "data": open(data).read() if data else None,
    "first_loss": losses[0], "last_loss": losses[-1], "weights": hashlib.sha256(weights).hexdigest()}), flush=True)
