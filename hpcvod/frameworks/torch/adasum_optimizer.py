"""``DistributedOptimizer(op=hvd.Adasum)``: Horovod's Adasum optimizer for PyTorch.

Adasum combines what each rank would do alone, so every rank first applies the wrapped optimizer to its own
gradients: as soon as a parameter's gradient is final (after ``backward_passes_per_step`` backward passes), the
optimizer steps on that parameter alone, the change it made (``delta = new - start``) replaces the parameter's
values, and an in-place Adasum allreduce of the delta starts in the background. ``step()`` waits for the deltas and
sets every parameter to ``start + adasum(deltas)``, the same on every rank. As in Horovod, ``synchronize()`` does
nothing and ``skip_synchronize()`` is refused. Unlike Horovod, a process set other than the global one is allowed
(Adasum runs over the set's ranks; a power-of-two count, as always).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

import hpcvod.runtime as rt
from hpcvod.frameworks._common import set_rank_size
from hpcvod.frameworks.torch import mpi_ops
from hpcvod.frameworks.torch.compression import Compressor
from hpcvod.frameworks.torch.optimizer_state import common_setup, remove_hooks, set_backward_passes_per_step
from hpcvod.runtime.adasum import check_size


class DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Mixin body of the classes ``DistributedOptimizer(op=Adasum)`` builds (frameworks/torch/optimizer.py)."""

    def _hvd_setup(self, named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                   compression: type[Compressor], backward_passes_per_step: int, op: Any,
                   gradient_predivide_factor: float, groups: Any, sparse_as_dense: bool,
                   process_set: Any) -> None:
        if gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        common_setup(self, named_parameters, compression, backward_passes_per_step, process_set)
        self._hvd_starts = {p: torch.zeros_like(p, requires_grad=False) for p in self._hvd_requires_update}
        self._hvd_handles: dict[torch.Tensor, tuple[Any, Any]] = {}   # parameter -> (handle or None, ctx)
        self._hvd_hooks: list[Any] = []
        included = process_set.included() if hasattr(process_set, "included") else True
        if included:
            check_size(set_rank_size(process_set)[1])    # Horovod's error, at construction
        for p in self._hvd_requires_update if included else ():
            self._hvd_hooks.append(p.register_post_accumulate_grad_hook(self._hvd_on_grad_ready))

    def _hvd_on_grad_ready(self, p: torch.Tensor) -> None:
        if self._hvd_delay[p] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                                 "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
        self._hvd_delay[p] -= 1
        self._hvd_handles[p] = self._hvd_reduce_delta(p) if self._hvd_delay[p] == 0 else (None, None)

    def _hvd_reduce_delta(self, p: torch.Tensor) -> tuple[Any, Any]:
        """Steps the wrapped optimizer on ``p`` alone, turns ``p`` into the change that made, starts its Adasum."""
        start = self._hvd_starts[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            with torch.no_grad():
                start.copy_(p)
            super(self._hvd_base, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        with torch.no_grad():
            p.sub_(start)
        compressed, ctx = self._hvd_compression.compress(p.data)
        handle = mpi_ops.allreduce_async_(compressed, name=self._hvd_names[p], op=rt.Adasum,
                                          process_set=self._hvd_process_set)
        return handle, ctx

    def synchronize(self) -> None:
        """Nothing to do: ``step()`` waits for the deltas (Horovod's Adasum optimizer does the same)."""

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover - makes this a generator, as contextmanager needs

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        if not self._hvd_hooks:          # not a member of the process set
            return loss
        for p in self._hvd_requires_update:
            # not differentiated on this rank, or step() before backward_passes_per_step passes: reduce now
            if self._hvd_handles.get(p, (None, None))[0] is None:
                self._hvd_handles[p] = self._hvd_reduce_delta(p)
        for p, (handle, ctx) in self._hvd_handles.items():
            delta = self._hvd_compression.decompress(mpi_ops.synchronize(handle), ctx)
            with torch.no_grad():
                start = self._hvd_starts[p]
                start.add_(delta)
                p.copy_(start)
            self._hvd_delay[p] = self.backward_passes_per_step
        self._hvd_handles.clear()
        self._opt_called = True          # what an LR scheduler's step-order check looks for
        if self._hvd_original is not None:
            self._hvd_original._opt_called = True
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._hvd_handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can cause "
                                 "a race condition.")
        return super(self._hvd_base, self).zero_grad(set_to_none)

    # the same as the averaging optimizer's
    set_backward_passes_per_step = set_backward_passes_per_step
    _hvd_remove_hooks = remove_hooks
