"""Model and optimizer state helpers: make every rank start from (or resume to) the root rank's state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

import hpcvod.runtime as rt
from hpcvod.frameworks.torch import mpi_ops


def _named_tensors(params: Any) -> list[tuple[str | None, torch.Tensor]]:
    if isinstance(params, Mapping):
        items = sorted(params.items(), key=lambda kv: kv[0])
    elif isinstance(params, Iterable) and not isinstance(params, torch.Tensor):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type {type(params).__name__}: expected a state_dict, "
                         f"named_parameters() or parameters()")
    for name, value in items:
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"cannot broadcast {name or 'a parameter'}: expected a tensor, got "
                             f"{type(value).__name__}")
    return items


def broadcast_parameters(params: Any, root_rank: int, process_set: Any = rt.global_process_set) -> None:
    """Overwrites, in place, every tensor of ``params`` (``model.state_dict()``, ``model.named_parameters()`` or
    ``model.parameters()``) with its value on ``root_rank``."""
    handles = [mpi_ops.broadcast_async_(tensor, root_rank, name=None if name is None else f"broadcast.{name}",
                                        process_set=process_set)
               for name, tensor in _named_tensors(params)]
    for handle in handles:
        mpi_ops.synchronize(handle)


class _TensorSlot:
    """Stands for a tensor in the pickled skeleton of a state dict: its bytes travel by an in-place broadcast
    (on the device for CUDA state: each rank receives into its current CUDA device, no host copy)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.shape, self.dtype, self.cuda = tuple(tensor.shape), tensor.dtype, tensor.is_cuda


def _skeleton(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """``obj`` with each tensor replaced by a ``_TensorSlot`` (collected, in order, into ``tensors``)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach().contiguous())
        return _TensorSlot(obj)
    if isinstance(obj, dict):
        return {k: _skeleton(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_skeleton(v, tensors) for v in obj)
    return obj


def _fill(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """The inverse of ``_skeleton``: allocates a tensor per slot (in order) and appends it to ``tensors``."""
    if isinstance(skeleton, _TensorSlot):
        device = torch.device("cuda", torch.cuda.current_device()) if skeleton.cuda else None
        tensor = torch.empty(skeleton.shape, dtype=skeleton.dtype, device=device)
        tensors.append(tensor)
        return tensor
    if isinstance(skeleton, dict):
        return {k: _fill(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_fill(v, tensors) for v in skeleton)
    return skeleton


def _zero_missing_grads(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> None:
    """What Horovod leaves behind when an optimizer has no state yet: a zero gradient on every trainable
    parameter that has none (sparse for SparseAdam, and for SGD on a ``model``'s sparse embeddings), which code
    after the broadcast may read. Horovod then runs a dummy ``step()`` to create the state; hpcvod does not (it
    would move parameters by weight decay)."""
    sparse_params = {id(p) for m in (model.modules() if model is not None else ())
                     if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
    all_sparse = isinstance(optimizer, torch.optim.SparseAdam)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                sparse = all_sparse or (isinstance(optimizer, torch.optim.SGD) and id(p) in sparse_params)
                p.grad = torch.zeros_like(p).to_sparse() if sparse else torch.zeros_like(p)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None,
                              process_set: Any = rt.global_process_set) -> None:
    """Gives every rank ``root_rank``'s optimizer state and hyper-parameters (learning rates, momenta...).

    The state dict's structure travels as one pickled object and its tensors by in-place broadcasts, so a fresh
    optimizer (empty state) on the other ranks receives a restored one's state without a dummy step.
    """
    if not optimizer.state_dict()["state"]:
        _zero_missing_grads(optimizer, model)
    is_root = rt.rank() == root_rank  # root_rank is a global rank, also in a process set
    tensors: list[torch.Tensor] = []
    skeleton = _skeleton(optimizer.state_dict(), tensors) if is_root else None
    skeleton = rt.broadcast_object(skeleton, root_rank=root_rank, name="broadcast_optimizer_state.skeleton",
                                   process_set=process_set)
    state_dict = None
    if not is_root:
        state_dict = _fill(skeleton, tensors)
    handles = [mpi_ops.broadcast_async_(t, root_rank, name=f"broadcast_optimizer_state.{i}", process_set=process_set)
               for i, t in enumerate(tensors)]
    for handle in handles:
        mpi_ops.synchronize(handle)
    if state_dict is not None:
        optimizer.load_state_dict(state_dict)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: Any = rt.global_process_set) -> Any:
    """Returns ``root_rank``'s ``obj`` (any picklable object, tensors included) on every rank."""
    return rt.broadcast_object(obj, root_rank=root_rank, name=name, process_set=process_set)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = rt.global_process_set) -> list[Any]:
    """Returns the list of every rank's ``obj``, in rank order.

    Named even when ``name`` is not given (Horovod names it too): an unnamed collective would take the next
    position among this rank's unnamed ones, and a rank that skipped one (it had joined while the others'
    allgather failed) would then pair with the wrong call. One fixed default rather than Horovod's type name,
    so that ranks gathering objects of different types (a value here, None there) still pair.
    """
    return rt.allgather_object(obj, name="allgather_object" if name is None else name, process_set=process_set)
