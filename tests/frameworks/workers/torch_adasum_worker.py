"""op=hvd.Adasum through hpcvod.torch, check by check, under ``mpiexec -n N`` (N = 2, 4; 3 for the refusals).

The first four checks are Horovod's test/parallel/test_adasum_pytorch.py in hpcvod's words, on CPU tensors:
Horovod's criterion ``|expected - got| / |expected| / 100 < eps(dtype)``, for float32 and float16. Horovod runs
the orthogonal and parallel cases on GPUs only; hpcvod reduces CPU tensors the same way, so they run here.
The optimizer checks are Horovod's _DistributedAdasumOptimizer semantics (horovod/torch/optimizer.py).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from _harness import Checks, output_path

import hpcvod.torch as hvd

torch.set_num_threads(1)
hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
DTYPES = (np.float32, np.float16)
check = Checks()


def horovod_close(dtype: type, expected: np.ndarray, got: torch.Tensor) -> None:
    """test_adasum_pytorch.py's are_close: the relative error / 100 below the dtype's machine epsilon."""
    ratio = np.linalg.norm(expected - got.numpy().astype(np.float64)) / np.linalg.norm(expected) / 100.0
    assert ratio < np.finfo(dtype).eps, f"{np.dtype(dtype).name}: off by {ratio:.3g} (eps {np.finfo(dtype).eps})"


def columns(q: np.ndarray, dtype: type) -> tuple[np.ndarray, torch.Tensor]:
    """(every rank's vectors as float64 columns, this rank's column as a torch tensor of ``dtype``)."""
    q = q.astype(dtype)
    return q.astype(np.float64), torch.from_numpy(np.ascontiguousarray(q[:, RANK]))


def lengths() -> list[int]:
    return [SIZE * 20 - 17, SIZE * 2 + 1, SIZE + 2, 2 ** 16]


if SIZE & (SIZE - 1) == 0:
    @check
    def horovod_orthogonal_vectors_add_up():
        rng = np.random.default_rng(2)
        for dtype in DTYPES:
            cases = [columns(np.linalg.qr(rng.normal(0, 1, (n, SIZE)))[0], dtype) for n in lengths()]
            handles = [hvd.allreduce_async(mine, op=hvd.Adasum) for _, mine in cases]
            for (q, _), handle in zip(cases, handles):
                horovod_close(dtype, q.sum(axis=1), hvd.synchronize(handle))

    @check
    def horovod_parallel_vectors_average():
        rng = np.random.default_rng(3)
        for dtype in DTYPES:
            cases = [columns(rng.normal(0, 1, (n, 1)) @ rng.normal(0, 1, (SIZE, 1)).T, dtype) for n in lengths()]
            handles = [hvd.allreduce_async(mine, op=hvd.Adasum) for _, mine in cases]
            for (q, _), handle in zip(cases, handles):
                horovod_close(dtype, q.sum(axis=1) / SIZE, hvd.synchronize(handle))

    @check
    def horovod_stability_with_tiny_values():
        rng = np.random.default_rng(4)
        for dtype in DTYPES:
            tiny = np.random.default_rng(5).normal(0, np.finfo(dtype).tiny, (1024, 1))
            q, mine = columns(tiny @ rng.normal(0, 1, (SIZE, 1)).T, dtype)
            hvd.allreduce_(mine, op=hvd.Adasum)
            horovod_close(dtype, q.sum(axis=1) / SIZE, mine)

    @check
    def horovod_stability_with_scales_from_tiny_to_huge():
        rng = np.random.default_rng(6)
        for dtype in DTYPES:
            low, high = float(np.finfo(dtype).tiny), float(np.sqrt(np.finfo(dtype).max))
            scales = np.array([high ** ((i + 1) / SIZE) * low ** ((SIZE - i - 1) / SIZE) for i in range(SIZE)])
            rng.shuffle(scales)
            q, mine = columns(rng.normal(0, 1, (1024, 1)) @ scales.reshape(1, SIZE), dtype)
            hvd.allreduce_(mine, op=hvd.Adasum)
            horovod_close(dtype, q.sum(axis=1) / SIZE, mine)

    def regression(seed: int) -> tuple[torch.nn.Module, torch.Generator, torch.Tensor]:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model, torch.Generator().manual_seed(100 + RANK), torch.randn(8, 1, generator=torch.Generator()
                                                                             .manual_seed(seed + 1))

    def parameters_identical(model: torch.nn.Module) -> bool:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).reshape(1, -1)
        everyone = hvd.allgather(flat)
        return all(torch.equal(everyone[0], row) for row in everyone)

    @check
    def distributed_optimizer_steps_by_the_adasum_of_the_ranks_deltas():
        # Horovod: each rank steps on its own gradients; the parameter becomes start + Adasum(new - start). With
        # Adam the deltas are not proportional to the gradients, so reducing gradients instead would differ.
        model, gen, w = regression(10)
        alone = copy.deepcopy(model)
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters(), op=hvd.Adasum)
        assert isinstance(opt, torch.optim.Adam) and type(opt).__name__ == "Adam"
        opt_alone = torch.optim.Adam(alone.parameters(), lr=0.01)
        starts = [p.detach().clone() for p in model.parameters()]
        for _ in range(2):
            x = torch.randn(16, 8, generator=gen)
            for m, o in ((model, opt), (alone, opt_alone)):
                o.zero_grad()
                torch.nn.functional.mse_loss(m(x), x @ w).backward()
                o.step()
            wrong = []
            for i, (p, start, q) in enumerate(zip(model.parameters(), starts, alone.parameters())):
                want = start + hvd.allreduce(q.detach() - start, op=hvd.Adasum, name=f"adasum.reference.{i}")
                if not torch.allclose(p.detach(), want, rtol=1e-6, atol=1e-7):
                    wrong.append(f"parameter {i}: max difference {(p.detach() - want).abs().max().item():.3g}")
            identical = parameters_identical(model)
            assert not wrong, f"not start + Adasum(deltas): {wrong}"
            assert identical
            with torch.no_grad():                     # the next step starts where the distributed one ended
                for q, p in zip(alone.parameters(), model.parameters()):
                    q.copy_(p)
            starts = [p.detach().clone() for p in model.parameters()]
        return f"{len(starts)} parameters, 2 steps"

    @check
    def distributed_optimizer_trains_and_ranks_stay_identical():
        model, gen, w = regression(20)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),
                                       named_parameters=model.named_parameters(), op=hvd.Adasum,
                                       backward_passes_per_step=2)
        held_out = torch.randn(256, 8, generator=torch.Generator().manual_seed(21))   # the same on every rank

        def held_out_loss() -> float:
            with torch.no_grad():
                return torch.nn.functional.mse_loss(model(held_out), held_out @ w).item()

        before = held_out_loss()
        for _ in range(40):
            opt.zero_grad()
            for _ in range(2):
                x = torch.randn(16, 8, generator=gen)
                torch.nn.functional.mse_loss(model(x), x @ w).backward()
            opt.step()
        after = held_out_loss()
        identical = parameters_identical(model)      # communicate before asserting: every rank gets here
        assert identical, "the ranks' parameters differ"
        assert after < 0.2 * before, f"held-out loss {before:.4f} -> {after:.4f}"
        return f"held-out loss {before:.4f} -> {after:.4f}"

    @check
    def distributed_optimizer_misuse_is_refused_as_in_horovod():
        model, gen, w = regression(30)
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), op=hvd.Adasum)
        try:
            with opt.skip_synchronize():
                pass
            raise RuntimeError("skip_synchronize() was accepted")
        except AssertionError as exc:
            assert "not supported when using Adasum" in str(exc)
        x = torch.randn(4, 8, generator=gen)
        torch.nn.functional.mse_loss(model(x), x @ w).backward()
        try:
            opt.zero_grad()
            raise RuntimeError("zero_grad() between backward() and step() was accepted")
        except AssertionError as exc:
            assert "before optimizer.step()" in str(exc)
        opt.step()
        assert parameters_identical(model)
else:
    @check
    def non_power_of_two_ranks_refused_as_in_horovod():
        for what, call in (
            ("allreduce", lambda: hvd.allreduce(torch.ones(4), op=hvd.Adasum)),
            ("DistributedOptimizer", lambda: hvd.DistributedOptimizer(
                torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1), op=hvd.Adasum)),
        ):
            try:
                call()
                raise RuntimeError(f"{what} with op=Adasum on {SIZE} ranks was accepted")
            except NotImplementedError as exc:
                assert "non-power of 2 ranks is not supported" in str(exc), str(exc)
        total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.refusal")
        assert torch.equal(total, torch.full((2,), float(SIZE))), "the runtime works on after the refusal"


check.report(output_path())
