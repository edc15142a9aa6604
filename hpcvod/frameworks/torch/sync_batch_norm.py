"""``SyncBatchNorm``: batch normalization whose training statistics cover the whole global batch.

The mean and variance come from sums allreduced over the ranks with the differentiable ``allreduce``, so autograd
derives the synchronized backward pass itself (the gradient of a summed statistic is the summed gradient). Two
small reductions per layer and step: the per-channel sum with the element count, then the centred sum of squares
(numerically safer than E[x^2] - E[x]^2). Uneven local batch sizes are fine.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

import hpcvod.runtime as rt
from hpcvod.frameworks._common import set_rank_size
from hpcvod.frameworks.torch import mpi_ops


class SyncBatchNorm(_BatchNorm):
    """Drop-in for ``torch.nn.BatchNorm1d/2d/3d`` (any input of shape ``(N, C, ...)``) synchronized over the ranks
    of ``process_set``. In eval mode, or on a single rank, it is plain batch normalization."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_set: Any = rt.global_process_set) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _momentum(self) -> float:
        if self.momentum is not None:
            return self.momentum
        return 1.0 / float(self.num_batches_tracked)  # cumulative moving average, as in torch's BatchNorm

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        single = set_rank_size(self.process_set)[1] == 1
        use_batch_stats = self.training or not self.track_running_stats
        if single or not use_batch_stats:
            return super().forward(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)

        channels = input.shape[1]
        reduce_dims = [0] + list(range(2, input.dim()))
        view = [1, channels] + [1] * (input.dim() - 2)
        local_count = input.numel() // channels
        stats = torch.cat([input.sum(reduce_dims),
                           torch.tensor([float(local_count)], dtype=input.dtype, device=input.device)])
        stats = mpi_ops.allreduce(stats, op=rt.Sum, process_set=self.process_set)
        count = stats[channels].detach()
        mean = stats[:channels] / count
        centred = input - mean.view(view)
        sq_sum = mpi_ops.allreduce((centred * centred).sum(reduce_dims), op=rt.Sum, process_set=self.process_set)
        var = sq_sum / count

        if self.training and self.track_running_stats:
            with torch.no_grad():
                m = self._momentum()
                unbiased = var * (count / max(float(count) - 1.0, 1.0))
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(unbiased.detach(), alpha=m)

        out = centred * torch.rsqrt(var + self.eps).view(view)
        if self.affine:
            out = out * self.weight.view(view) + self.bias.view(view)
        return out

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module,
                               process_set: Any = rt.global_process_set) -> torch.nn.Module:
        """Returns ``module`` with every ``torch.nn.BatchNorm*d`` replaced by a ``SyncBatchNorm`` (state kept)."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_set)
            if module.affine:
                with torch.no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            if module.track_running_stats:
                converted.running_mean = module.running_mean
                converted.running_var = module.running_var
                converted.num_batches_tracked = module.num_batches_tracked
            converted.train(module.training)
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return converted
