"""``DistributedOptimizer`` (wraps an ``mx.optimizer.Optimizer``) and ``DistributedTrainer`` (a Gluon Trainer):
gradients are averaged over the ranks, in place and fused by the runtime, before each update."""

from __future__ import annotations

import warnings
from typing import Any

import hpcvod.runtime as rt
from hpcvod.frameworks._common import average_as_prescale, set_rank_size
from hpcvod.frameworks.mxnet import mpi_ops
from hpcvod.frameworks.mxnet._mx import mx
from hpcvod.frameworks.mxnet.compression import Compression, Compressor


ALONE_BYTES = 1 << 20  # gradients this large are reduced one by one; smaller ones together (fused)


def _reduce_in_place(grads: list[Any], names: list[str], gradient_predivide_factor: float, process_set: Any,
                     compression: type[Compressor] = Compression.none) -> None:
    """Averages NDArray gradients over ``process_set`` in place: small ones submitted together (the engine
    fuses them), large ones reduced one by one straight in their own memory."""
    if set_rank_size(process_set)[1] == 1:
        return
    op, pre, post = average_as_prescale(rt.Average, gradient_predivide_factor)
    pending = []
    for grad, name in zip(grads, names):
        compressed, ctx = compression.compress(grad)
        array, staged = mpi_ops._view(compressed, writable=True)
        if array.nbytes >= ALONE_BYTES:
            # Bandwidth-bound: reduced alone, in the NDArray's memory (fusing it would add two copies).
            rt.allreduce_(array, name=name, op=op, prescale_factor=pre, postscale_factor=post,
                          process_set=process_set)
            handle = None
        else:
            handle = rt.allreduce_async_(array, name=name, op=op, prescale_factor=pre, postscale_factor=post,
                                         process_set=process_set)
        pending.append((handle, grad, compressed, ctx, staged))
    for handle, grad, compressed, ctx, staged in pending:
        if handle is not None:
            rt.synchronize(handle)
        mpi_ops._write_back(compressed, staged)
        if compressed is not grad:
            grad[:] = compression.decompress(compressed, ctx)


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps ``optimizer`` so that ``update()`` first averages the gradient(s) over the ranks of ``process_set``.

    Attributes and methods not defined here go to the wrapped optimizer; setting ``rescale_grad`` (which Gluon's
    Trainer does every step) sets it on the wrapped optimizer. ``num_groups`` is accepted for Horovod
    compatibility: every gradient of one update is submitted together and fused by the runtime anyway.
    """

    def __init__(self, optimizer: mx.optimizer.Optimizer, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, process_set: Any = rt.global_process_set) -> None:
        # No super().__init__: this object only forwards to ``optimizer``, which holds every setting.
        self.__dict__["_optimizer"] = optimizer
        self.__dict__["_gradient_predivide_factor"] = gradient_predivide_factor
        self.__dict__["_process_set"] = process_set
        average_as_prescale(rt.Average, gradient_predivide_factor)  # validates the factor

    def __getattr__(self, item: str) -> Any:
        return getattr(self.__dict__["_optimizer"], item)

    def __setattr__(self, key: str, value: Any) -> None:
        setattr(self._optimizer, key, value)

    def _do_allreduce(self, index: Any, grad: Any) -> None:
        indices = index if isinstance(index, (list, tuple)) else [index]
        grads = grad if isinstance(grad, (list, tuple)) else [grad]
        _reduce_in_place(list(grads), [f"optimizer.{i}" for i in indices], self._gradient_predivide_factor,
                         self._process_set)

    def create_state(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state_multi_precision(index, weight)

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: dict) -> None:
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: dict) -> None:
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """A Gluon ``Trainer`` whose ``step()`` / ``allreduce_grads()`` average the gradients over the ranks of
    ``process_set`` (all submitted at once, reduced in place and fused by the runtime) instead of using a
    kvstore. ``prefix`` names the reductions; ``num_groups`` is accepted for Horovod compatibility."""

    def __init__(self, params: Any, optimizer: Any, optimizer_params: dict | None = None,
                 compression: type[Compressor] = Compression.none, gradient_predivide_factor: float = 1.0,
                 prefix: str | None = None, num_groups: int = 0,
                 process_set: Any = rt.global_process_set) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take a DistributedOptimizer: using its wrapped optimizer",
                          stacklevel=2)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        average_as_prescale(rt.Average, gradient_predivide_factor)  # validates the factor
        self._hvd_compression = compression
        self._hvd_predivide = gradient_predivide_factor
        self._hvd_prefix = prefix or ""
        self._hvd_process_set = process_set

    def _allreduce_grads(self) -> None:
        grads, names = [], []
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                grads.append(param.list_grad()[0])
                names.append(f"{self._hvd_prefix}trainer.{i}")
        _reduce_in_place(grads, names, self._hvd_predivide, self._hvd_process_set, self._hvd_compression)
