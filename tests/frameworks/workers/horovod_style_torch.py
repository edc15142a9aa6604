"""A Horovod user's PyTorch script, spelled for Horovod (``import horovod.torch as hvd``): run unchanged by
``hpcvod run --as-horovod`` (tests/frameworks/test_as_horovod.py). Prints what the test checks."""

import torch

import horovod
import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError
from horovod.torch.mpi_ops import synchronize

hvd.init()
torch.manual_seed(hvd.rank())   # different starting weights: the broadcast must make them equal
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
generator = torch.Generator().manual_seed(100 + hvd.rank())   # each rank its own data
for _ in range(3):
    x = torch.randn(8, 4, generator=generator)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
    optimizer.step()
handle = hvd.allreduce_async(model.weight.detach(), name="weights", op=hvd.Average)
spread = (synchronize(handle) - model.weight.detach()).abs().max().item()
print(f"RANK {hvd.rank()} OF {hvd.size()} hvd={hvd.__name__} error={HorovodInternalError.__name__} "
      f"run={horovod.run.__module__} spread={spread}")
