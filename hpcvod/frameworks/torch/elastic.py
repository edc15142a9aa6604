"""Horovod's ``horovod.torch.elastic`` on hpcvod (``hvd.elastic``): ``run``, ``TorchState``, ``ElasticSampler``.

The reset itself (shrinking the MPI world to the live ranks) is framework-neutral: hpcvod/runtime/elastic.py.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any, Callable, Iterator

import torch
import torch.utils.data

from hpcvod.frameworks.torch.functions import (broadcast_object, broadcast_optimizer_state,
                                               broadcast_parameters)
from hpcvod.runtime import rank, size
from hpcvod.runtime.elastic import ObjectState, State, run_fn
from hpcvod.runtime.errors import HpcvodConfigError


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator of the training function ``func(state, ...)``: a rank that dies or raises makes the others
    restore ``state``'s last commit, rebuild the world from the ranks still alive and call ``func`` again.
    Collectives belong inside ``func``, not in its arguments (docs/elastic.md)."""
    return run_fn(func)


class ElasticSampler(torch.utils.data.Sampler):
    """Like ``DistributedSampler``, but it repartitions the samples not yet processed this epoch over the ranks
    of the current world after a reset. Put it in the ``TorchState``, call ``record_batch`` after each batch and
    ``set_epoch`` at the end of each epoch (Horovod's ``ElasticSampler``)."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0       # samples of this epoch processed by all ranks together (a prefix of the order)
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (call it at the end of an epoch, so that a partial one is not processed twice)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count a batch of ``batch_size`` samples as processed on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices: Any) -> None:
        """Count ``len(indices)`` samples as processed on every rank (Horovod's older spelling of
        ``record_batch``: the processed samples are always the first ones of the epoch's order)."""
        self.processed_num += len(indices) * self.num_replicas

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def reset(self) -> None:
        """Partition what is left of the epoch over the current world."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:   # the same order on every rank: seeded by the epoch
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        padded = self.remaining_indices + self.remaining_indices[:self.total_size - len(self.remaining_indices)]
        self.indices = padded[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples


class StateHandler:
    """Saves, restores and synchronises one kind of value of a ``TorchState``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """A value with ``state_dict()`` / ``load_state_dict()``: a deep copy of its state dict is the commit."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self._saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        # into the last commit's copies where the structure is the same (every commit but the first): no new
        # allocation, so no page faults on fresh memory for every tensor at every commit
        self._saved = _copy_into(self._saved, self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(_StateDictHandler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


_handler_registry: list[tuple[type, type]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list[tuple[type, type]]:
    """(value type, StateHandler class) pairs, the first match handling a ``TorchState`` keyword."""
    return _handler_registry


def set_handler_registry(registry: list[tuple[type, type]]) -> None:
    global _handler_registry
    _handler_registry = registry


def _split_handled(kwargs: dict[str, Any]) -> tuple[dict[str, StateHandler], dict[str, Any]]:
    handlers: dict[str, StateHandler] = {}
    plain: dict[str, Any] = {}
    for name, value in kwargs.items():
        handler_cls = next((cls for kind, cls in _handler_registry if isinstance(value, kind)), None)
        if handler_cls is not None:
            handlers[name] = handler_cls(value)
        else:
            plain[name] = value
    return handlers, plain


def _copy_into(saved: Any, value: Any) -> Any:
    """A deep copy of ``value`` (a state dict), reusing ``saved``'s tensors (an earlier copy) where they match."""
    if isinstance(value, torch.Tensor):
        if isinstance(saved, torch.Tensor) and saved.shape == value.shape and saved.dtype == value.dtype \
                and saved.device == value.device and not value.requires_grad:
            return saved.copy_(value)
        return copy.deepcopy(value)
    if isinstance(value, dict) and isinstance(saved, dict) and saved.keys() == value.keys():
        return type(value)((key, _copy_into(saved[key], item)) for key, item in value.items())
    if isinstance(value, (list, tuple)) and type(saved) is type(value) and len(saved) == len(value):
        return type(value)(_copy_into(old, item) for old, item in zip(saved, value))
    return copy.deepcopy(value)


class _NumpyTensor:
    """A CPU tensor kept as a NumPy array in a snapshot (turned back into a tensor when loaded)."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __reduce__(self) -> tuple:
        return (_NumpyTensor, (self.array,))


def _to_numpy(tensor: torch.Tensor) -> Any:
    if tensor.device.type != "cpu" or tensor.dtype == torch.bfloat16 or tensor.requires_grad:
        return tensor                      # pickled as torch does it
    return _NumpyTensor(tensor.contiguous().numpy())


def _to_tensor(value: Any) -> Any:
    return torch.from_numpy(value.array.copy()) if isinstance(value, _NumpyTensor) else value


def _tensors_as(value: Any, convert: Callable[[Any], Any]) -> Any:
    """``value`` (state dicts: dicts, lists, tuples) with every tensor (or _NumpyTensor) passed through ``convert``."""
    if isinstance(value, (torch.Tensor, _NumpyTensor)):
        return convert(value)
    if isinstance(value, dict):
        return type(value)((key, _tensors_as(item, convert)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors_as(item, convert) for item in value)
    return value


class TorchState(ObjectState):
    """The state of a PyTorch training loop: ``model``, ``optimizer`` and any keyword (models, optimizers and
    ElasticSamplers by their own handlers, anything else as a plain object), as attributes (Horovod's
    ``TorchState``)."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        self._handlers, kwargs = _split_handled(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def _snapshot(self) -> dict[str, Any]:
        snapshot = super()._snapshot()
        for name, handler in self._handlers.items():
            if not isinstance(handler, _StateDictHandler):
                raise HpcvodConfigError(f"TorchState: {name}'s handler {type(handler).__name__} keeps no state "
                                        f"dict, so it cannot be kept on node-local storage for a restarted world "
                                        f"(docs/elastic.md)")
        # CPU tensors as NumPy views of the committed copies: written out of band, without a copy
        snapshot["handlers"] = {name: _tensors_as(handler._saved, _to_numpy)
                                for name, handler in self._handlers.items()}
        return snapshot

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        super()._load_snapshot(snapshot)
        for name, handler in self._handlers.items():
            handler._saved = _tensors_as(snapshot["handlers"][name], _to_tensor)

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(self, name) and name in self._handlers:
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "StateHandler", "ModelStateHandler",
           "OptimizerStateHandler", "SamplerStateHandler", "get_handler_registry", "set_handler_registry"]
