"""``DistributedOptimizer``: averages gradients over all ranks while ``loss.backward()`` is still running.

A post-accumulate-grad hook on every parameter marks its gradient final; when every gradient of a bucket (25 MiB
of parameters in reverse registration order, or the user's ``groups``) is final, the hook starts that bucket's
grouped in-place allreduce, so the runtime's background engine reduces early buckets while later layers are
still being differentiated, with one negotiation per bucket instead of one per tensor. ``step()`` (or ``synchronize()``) waits for the outstanding reductions, then runs the wrapped
optimizer's own update.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

import hpcvod.runtime as rt
from hpcvod.frameworks._common import average_as_prescale, set_rank_size
from hpcvod.frameworks.torch import mpi_ops
from hpcvod.frameworks.torch.compression import Compression, Compressor
from hpcvod.frameworks.torch.optimizer_state import common_setup, remove_hooks, set_backward_passes_per_step

_INSTANCE_OVERRIDES = ("step", "zero_grad", "synchronize")
BUCKET_BYTES = 25 * 1024 * 1024  # default reduction bucket (DDP's default too)


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixin body of the classes ``DistributedOptimizer`` builds; ``_hvd_*`` attributes are its own state."""

    def _hvd_setup(self, named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                   compression: type[Compressor], backward_passes_per_step: int, op: Any,
                   gradient_predivide_factor: float, groups: Any, sparse_as_dense: bool,
                   process_set: Any) -> None:
        common_setup(self, named_parameters, compression, backward_passes_per_step, process_set)
        self._hvd_op, self._hvd_prescale, self._hvd_postscale = average_as_prescale(op, gradient_predivide_factor)
        self._hvd_sparse_as_dense = sparse_as_dense
        self._hvd_buckets = self._hvd_make_buckets(groups)
        self._hvd_bucket_of = {p: b for b, bucket in enumerate(self._hvd_buckets) for p in bucket}
        self._hvd_ready_count = [0] * len(self._hvd_buckets)
        self._hvd_marked: set[torch.Tensor] = set()       # parameters whose gradient is final for this step
        self._hvd_densified: set[torch.Tensor] = set()    # sparse gradients reduced dense (sparse_as_dense)
        self._hvd_inflight: dict[int, list[tuple[int, Any, str]]] = {}  # bucket -> its started reductions
        self._hvd_hooks: list[Any] = []
        self._hvd_synchronized = False
        self._hvd_should_synchronize = True

        included = process_set.included() if hasattr(process_set, "included") else True
        set_size = set_rank_size(process_set)[1] if included else 1
        self._hvd_active = included and set_size > 1
        if self._hvd_active:
            for p in self._hvd_requires_update:
                self._hvd_hooks.append(p.register_post_accumulate_grad_hook(self._hvd_on_grad_ready))

    def _hvd_make_buckets(self, groups: Any) -> list[list[torch.Tensor]]:
        """Parameters reduced together, as one grouped (fused) reduction started once all their gradients are
        ready: ``groups`` buckets of consecutive parameters, the given lists (other parameters alone), or by
        default buckets of up to ``BUCKET_BYTES`` in reverse registration order (roughly the order backward
        produces gradients in, as DDP does): few negotiations per step, early buckets overlap the backward."""
        params = self._hvd_requires_update
        if groups is None:
            buckets: list[list[torch.Tensor]] = []
            size = 0
            for p in reversed(params):
                nbytes = p.numel() * p.element_size()
                if not buckets or (size + nbytes > BUCKET_BYTES and buckets[-1]):
                    buckets.append([])
                    size = 0
                buckets[-1].append(p)
                size += nbytes
            return buckets
        if isinstance(groups, int) and not isinstance(groups, bool):
            if groups < 1:
                raise ValueError(f"groups must be a positive number or a list of parameter lists, got {groups}")
            chunk = -(-len(params) // groups)
            return [params[i:i + chunk] for i in range(0, len(params), chunk)]
        if isinstance(groups, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in groups):
            lists = [list(g) for g in groups]
            known = {id(p) for p in params}
            listed = {id(p) for g in lists for p in g}
            if not listed <= known:
                raise ValueError("groups contains a parameter that is not a trainable parameter of the optimizer")
            return [g for g in lists if g] + [[p] for p in params if id(p) not in listed]
        raise ValueError("groups must be a number of groups or a list of lists of parameters")

    # ------------------------------------------------------------------------------------------ reductions
    def _hvd_on_grad_ready(self, p: torch.Tensor) -> None:
        if p in self._hvd_marked:
            raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                                 "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
        self._hvd_delay[p] -= 1
        if self._hvd_delay[p] > 0:
            return  # accumulating locally: reduce after the last backward pass of this step
        self._hvd_marked.add(p)
        b = self._hvd_bucket_of[p]
        self._hvd_ready_count[b] += 1
        if self._hvd_ready_count[b] == len(self._hvd_buckets[b]):
            self._hvd_start(b)

    def _hvd_start(self, b: int) -> None:
        """Starts the reductions of bucket ``b``: its dense gradients as one grouped in-place allreduce, sparse
        ones by allgather (or densified, with ``sparse_as_dense``)."""
        started: list[tuple[int, Any, str]] = []
        dense, entries = [], []
        for p in self._hvd_buckets[b]:
            if p.grad is None:
                # This rank never used p, other ranks may have: every rank must submit the same tensors.
                p.grad = torch.zeros_like(p)
            if p.grad.is_sparse:
                if not self._hvd_sparse_as_dense:
                    handle = mpi_ops.sparse_allreduce_async(p.grad, self._hvd_names[p], self._hvd_op,
                                                            self._hvd_process_set)
                    started.append((handle, p, "sparse"))
                    continue
                p.grad = p.grad.to_dense()
                self._hvd_densified.add(p)
            compressed, ctx = self._hvd_compression.compress(p.grad)
            dense.append(compressed)
            entries.append((p, compressed, ctx))
        if dense:
            handle = mpi_ops.grouped_allreduce_async_(dense, name=f"allreduce.bucket{b}", op=self._hvd_op,
                                                      prescale_factor=self._hvd_prescale,
                                                      postscale_factor=self._hvd_postscale,
                                                      process_set=self._hvd_process_set)
            started.append((handle, entries, "dense"))
        self._hvd_inflight[b] = started

    def synchronize(self) -> None:
        """Waits until every gradient has been reduced (starting the ones no hook started) and writes them back."""
        if not self._hvd_active:
            self._hvd_synchronized = True
            return
        for b in range(len(self._hvd_buckets)):
            if b not in self._hvd_inflight:
                self._hvd_start(b)
        for started in self._hvd_inflight.values():
            for handle, what, kind in started:
                output = mpi_ops.synchronize(handle)
                if kind == "sparse":
                    what.grad = output
                    continue
                for p, compressed, ctx in what:
                    if compressed is not p.grad:
                        with torch.no_grad():
                            p.grad.copy_(self._hvd_compression.decompress(compressed, ctx))
        for p in self._hvd_densified:
            p.grad = p.grad.to_sparse()   # as Horovod: reduced dense, applied sparse (SparseAdam needs that)
        self._hvd_forget_step()
        self._hvd_synchronized = True

    def _hvd_forget_step(self) -> None:
        """No reduction in flight, no gradient counted: the state at the start of a step."""
        self._hvd_densified.clear()
        self._hvd_inflight.clear()
        self._hvd_marked.clear()
        self._hvd_ready_count = [0] * len(self._hvd_buckets)
        for p in self._hvd_delay:
            self._hvd_delay[p] = self.backward_passes_per_step

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As Horovod's: also forgets the reductions of a step cut short, so that an elastic reset (which
        restores the optimizer through this) can train on after a collective failed inside ``step()``."""
        self._hvd_forget_step()
        self._hvd_synchronized = False
        self._hvd_should_synchronize = True
        super(self._hvd_base, self).load_state_dict(state_dict)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Makes ``step()`` skip its ``synchronize()``, after an explicit one (gradient clipping, AMP unscaling)."""
        self._hvd_should_synchronize = False
        try:
            yield
        finally:
            self._hvd_should_synchronize = True

    set_backward_passes_per_step = set_backward_passes_per_step

    def step(self, closure: Any = None) -> Any:
        if self._hvd_should_synchronize:
            if self._hvd_synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to "
                              "consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.", stacklevel=2)
            self.synchronize()
        self._hvd_synchronized = False
        # What an LR scheduler's step-order check looks for, also on the optimizer it was created with.
        self._opt_called = True
        if self._hvd_original is not None:
            self._hvd_original._opt_called = True
        return super(self._hvd_base, self).step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._hvd_inflight or self._hvd_marked:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can cause "
                                 "a race condition.")
        return super(self._hvd_base, self).zero_grad(set_to_none)

    _hvd_remove_hooks = remove_hooks


_class_cache: dict[tuple[type, type], type] = {}


def _distributed_class(base: type, mixin: type = _DistributedOptimizer) -> type:
    """A subclass of the user's optimizer class with the mixin's methods (so isinstance checks, LR schedulers and
    state_dict keep working)."""
    cls = _class_cache.get((base, mixin))
    if cls is None:
        body = {k: v for k, v in mixin.__dict__.items()
                if k not in ("__dict__", "__weakref__", "__doc__")}
        body["_hvd_base"] = None  # set below, once the class exists
        cls = type(base.__name__, (base,), body)
        # Marks step as already profiled: Optimizer.load_state_dict would otherwise wrap it in torch's profiling
        # hook, and step hooks would run twice (once around this step, once around the base class's).
        cls.step.hooked = True
        cls._hvd_base = cls
        cls.__module__ = __name__
        _class_cache[(base, mixin)] = cls
    return cls


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: type[Compressor] = Compression.none, backward_passes_per_step: int = 1,
                         op: Any = None, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: Any = rt.global_process_set) -> torch.optim.Optimizer:
    """Wraps ``optimizer`` so that ``step()`` applies gradients averaged (``op``) over the ranks of ``process_set``.

    The returned optimizer shares ``optimizer``'s parameter groups and state (anything loaded into it before
    wrapping is kept) and is an instance of a subclass of ``optimizer``'s class. Gradient reductions start from
    backward hooks; ``synchronize()`` waits for them, ``skip_synchronize()`` lets ``step()`` skip that wait after an
    explicit ``synchronize()``. ``backward_passes_per_step`` accumulates that many backward passes locally before
    reducing; ``groups`` (a count, or lists of parameters) reduces parameters in fused groups; ``compression``
    (``Compression.fp16``) halves the bytes sent; sparse gradients are allgathered unless ``sparse_as_dense``.
    """
    if hasattr(optimizer, "_hvd_setup"):
        raise ValueError("optimizer is already a hpcvod DistributedOptimizer")
    if num_groups:
        # Horovod's positional order has num_groups before groups; like Horovod, it stands for groups=N
        warnings.warn("num_groups is deprecated (as in Horovod): use groups=N", DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    # Horovod's Adasum optimizer (on more than one rank): each rank steps on its own gradients and the parameter
    # deltas are combined by Adasum (frameworks/torch/adasum_optimizer.py)
    mixin: type = _DistributedOptimizer
    if op == rt.Adasum and rt.size() > 1:
        from hpcvod.frameworks.torch.adasum_optimizer import DistributedAdasumOptimizer as mixin
    cls = _distributed_class(type(optimizer), mixin)
    wrapped = cls.__new__(cls)
    # Share the optimizer's state, param groups, hooks and defaults; drop instance-level method patches (an LR
    # scheduler created before wrapping replaces ``step`` on the instance) so the distributed methods win.
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k not in _INSTANCE_OVERRIDES})
    wrapped._hvd_original = optimizer
    wrapped._hvd_setup(named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor,
                       groups, sparse_as_dense, process_set)
    return wrapped
