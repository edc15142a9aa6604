"""``broadcast_parameters`` for Gluon parameters and Module params, and the object collectives."""

from __future__ import annotations

import types
from typing import Any

import hpcvod.runtime as rt
from hpcvod.frameworks.mxnet import mpi_ops
from hpcvod.frameworks.mxnet._mx import mx


def _broadcast_into(tensors: list[mx.nd.NDArray], names: list[str], root_rank: int, process_set: Any) -> None:
    """In-place broadcasts of every NDArray, submitted together (the runtime fuses them)."""
    pending = []
    for tensor, name in zip(tensors, names):
        array, staged = mpi_ops._view(tensor, writable=True)
        pending.append((rt.broadcast_async_(array, root_rank, name=name, process_set=process_set), tensor, staged))
    for handle, tensor, staged in pending:
        rt.synchronize(handle)
        mpi_ops._write_back(tensor, staged)


def _broadcast_after_init(root_rank: int, name: str, process_set: Any) -> Any:
    """A replacement ``Parameter._init_impl`` that broadcasts the freshly initialised value (deferred init)."""
    def init_impl(self: Any, *args: Any, **kwargs: Any) -> None:
        type(self)._init_impl(self, *args, **kwargs)
        data = self.data()
        _broadcast_into([data], [name], root_rank, process_set)
        for ctx_data in self.list_data()[1:]:
            data.copyto(ctx_data)
    return init_impl


def broadcast_parameters(params: Any, root_rank: int = 0, prefix: str | None = None,
                         process_set: Any = rt.global_process_set) -> None:
    """Overwrites ``params`` with their values on ``root_rank``: a Gluon ``ParameterDict``
    (``net.collect_params()``; parameters still waiting for deferred initialisation are broadcast right after it)
    or a dict of NDArrays (Module API ``arg_params`` / ``aux_params``)."""
    prefix = prefix or ""
    tensors, names = [], []
    if isinstance(params, dict):
        for key, value in sorted(params.items()):
            if not isinstance(value, mx.nd.NDArray):
                raise ValueError(f"cannot broadcast {key!r}: expected an NDArray, got {type(value).__name__}")
            tensors.append(value)
            names.append(f"{prefix}broadcast.{key}")
    elif isinstance(params, mx.gluon.ParameterDict):
        for key, param in sorted(params.items()):
            name = f"{prefix}broadcast.{key}"
            try:
                data = param.data()
            except mx.gluon.parameter.DeferredInitializationError:
                param._init_impl = types.MethodType(_broadcast_after_init(root_rank, name, process_set), param)
                continue
            tensors.append(data)
            names.append(name)
    else:
        raise ValueError(f"invalid params of type {type(params).__name__}: expected a gluon ParameterDict "
                         f"(net.collect_params()) or a dict of NDArrays")
    _broadcast_into(tensors, names, root_rank, process_set)
    if isinstance(params, mx.gluon.ParameterDict):
        for _, param in sorted(params.items()):
            if param._data is not None:
                for ctx_data in param.list_data()[1:]:
                    param.data().copyto(ctx_data)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: Any = rt.global_process_set) -> Any:
    """Returns ``root_rank``'s ``obj`` (any picklable object) on every rank."""
    return rt.broadcast_object(obj, root_rank=root_rank, name=name, process_set=process_set)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = rt.global_process_set) -> list[Any]:
    """Returns the list of every rank's ``obj``, in rank order."""
    return rt.allgather_object(obj, name=name, process_set=process_set)
