"""What both distributed optimizers (averaging, ``optimizer.py``; Adasum, ``adasum_optimizer.py``) keep and do
alike: parameter names, the per-step state, changing the backward passes, removing the hooks. Its own module so
that ``optimizer.py`` can choose the Adasum optimizer without the two importing each other."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hpcvod.frameworks.torch.compression import Compressor


def parameter_names(optimizer: torch.optim.Optimizer,
                    named_parameters: Iterable[tuple[str, torch.Tensor]] | None) -> dict[int, str]:
    """id(parameter) -> the name its reductions use (Horovod's checks and its names for unnamed parameters); sets
    Horovod's ``_parameter_names`` attribute on ``optimizer``."""
    all_params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is not None:
        named = list(named_parameters)
        if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
            raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, usually "
                             "model.named_parameters()")
        seen: set[str] = set()
        duplicates = sorted({name for name, _ in named if name in seen or seen.add(name)})
        if duplicates:
            raise ValueError(f"Parameter names in named_parameters must be unique; duplicates: "
                             f"{', '.join(duplicates)}")
        names = {id(p): name for name, p in named}
        unnamed = [i for i, p in enumerate(all_params) if id(p) not in names]
        if unnamed:
            raise ValueError(f"named_parameters was given, but {len(unnamed)} optimizer parameter(s) are not "
                             f"in it (positions {unnamed[:10]} in the param groups)")
        # Horovod's attribute, read by Horovod code and tests: parameter -> its name
        optimizer._parameter_names = {p: name for name, p in sorted(named, key=lambda item: item[0])}
    else:
        # Horovod's names for unnamed parameters: group and position in it, unique over several groups
        names = {id(p): f"noname.{i}.{j}" for i, group in enumerate(optimizer.param_groups)
                 for j, p in enumerate(group["params"])}
        optimizer._parameter_names = {p: f"allreduce.{names[id(p)]}" for p in all_params}
    return names


def common_setup(optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                 compression: type[Compressor], backward_passes_per_step: int, process_set: Any) -> None:
    """The state both distributed optimizers (averaging and Adasum) keep: names, compression, the process set,
    the backward passes per step and the parameters to update."""
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    all_params = [p for group in optimizer.param_groups for p in group["params"]]
    names = parameter_names(optimizer, named_parameters)
    optimizer._hvd_names = {p: f"allreduce.{names[id(p)]}" for p in all_params}
    optimizer._hvd_compression = compression
    optimizer._hvd_process_set = process_set
    optimizer.backward_passes_per_step = backward_passes_per_step
    optimizer._hvd_delay = {p: backward_passes_per_step for p in all_params}
    optimizer._hvd_requires_update = [p for p in all_params if p.requires_grad]


def set_backward_passes_per_step(optimizer: torch.optim.Optimizer, passes: int) -> None:
    """Horovod's ``optimizer.set_backward_passes_per_step(passes)``: reduce after that many backward passes."""
    if passes < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
    optimizer.backward_passes_per_step = passes
    for p in optimizer._hvd_delay:
        optimizer._hvd_delay[p] = passes


def remove_hooks(optimizer: torch.optim.Optimizer) -> None:
    """Removes the gradient hooks the distributed optimizer registered."""
    for hook in optimizer._hvd_hooks:
        hook.remove()
    optimizer._hvd_hooks.clear()
