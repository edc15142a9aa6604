"""The GPU path (runtime/gpu.py, runtime/nccl.py).

On a CPU machine (CI): device buffers are recognised, CuPy's "no driver" exception never escapes, NCCL is refused
with a reason, pinning does nothing, host collectives are unaffected. With a GPU (marker ``gpu``; skipped
without one): NCCL collectives on CuPy arrays and torch CUDA tensors, 1 rank and 2 ranks sharing the GPU.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from hpcvod.runtime import gpu

ROOT = Path(__file__).resolve().parents[2]


class _Dlpack:
    def __init__(self, device_type: int) -> None:
        self.device_type = device_type

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device_type, 0)


class _CudaArrayInterface:
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


class _Broken:
    def __dlpack_device__(self) -> tuple[int, int]:
        raise RuntimeError("freed")


def test_device_buffers_are_recognised_by_dlpack_device_or_cuda_array_interface() -> None:
    assert not gpu.is_device_buffer(np.zeros(3))
    assert not gpu.is_device_buffer(memoryview(b"abc"))
    assert not gpu.is_device_buffer(_Dlpack(gpu.DLPACK_CPU))
    assert not gpu.is_device_buffer(_Dlpack(gpu.DLPACK_CUDA_HOST))      # pinned host memory is host memory
    assert gpu.is_device_buffer(_Dlpack(gpu.DLPACK_CUDA))
    assert gpu.is_device_buffer(_Dlpack(gpu.DLPACK_CUDA_MANAGED))
    assert gpu.is_device_buffer(_CudaArrayInterface())
    assert not gpu.is_device_buffer(_Broken())


def test_torch_cpu_tensors_are_host_buffers() -> None:
    torch = pytest.importorskip("torch")
    assert not gpu.is_device_buffer(torch.zeros(3))
    assert not gpu.is_device_buffer(torch.zeros(3, requires_grad=True))


def test_device_index_is_the_local_rank_among_visible_gpus() -> None:
    assert [gpu.device_index(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    assert gpu.device_index(3, 1) == 0          # srun --gpus-per-task=1: each task sees its own GPU as 0
    assert gpu.device_index(2, 0) == 0
    assert gpu.pin_enabled({}) and not gpu.pin_enabled({"HOROVOD_PIN_GPU": "0"})
    assert gpu.pin_enabled({"HPCVOD_PIN_GPU": "1", "HOROVOD_PIN_GPU": "0"})


def test_without_a_gpu_everything_falls_back_and_says_why(mpich) -> None:
    if gpu.device_count() > 0:
        pytest.skip("a GPU is visible: the fallback is not what runs here")
    run = mpich.run_single("w_gpu_fallback.py")
    assert run.returncode == 0, run.explain()
    found = re.search(r"GPU FALLBACK (\{.*\})", run.stdout)
    assert found, run.explain()
    report = json.loads(found.group(1))
    assert report["nccl_built"] is False and report["cuda_built"] is False, report
    # CuPy missing or present without a driver: either way a reason, never an exception
    assert ("hpcvod[gpu]" in report["why"]) != report["cupy_imported"], report
    assert report["auto"][0] == "mpi" and report["auto"][1].startswith("rank 0: "), report
    assert report["nccl"].startswith("HPCVOD_GPU_OPERATIONS=nccl, but NCCL cannot be used: rank 0: "), report
    assert report["pinned"] == [] and report["host_allreduce"] == [0.0, 1.0, 2.0, 3.0], report


needs_gpu = pytest.mark.skipif(gpu.device_count() == 0, reason="no CUDA GPU visible to CuPy")


@pytest.mark.gpu
@needs_gpu
def test_one_rank_nccl_collectives_on_cupy_and_torch(mpich) -> None:
    run = mpich.run(1, "w_gpu.py", "--torch", timeout=300)
    assert run.returncode == 0, run.explain()
    assert re.search(r"GPU OK nccl \d+ checks rank 0", run.stdout), run.explain()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("mode", ["auto", "mpi"])
def test_two_ranks_sharing_one_gpu_go_through_mpi(mpich, mode: str) -> None:
    run = mpich.run(2, "w_gpu.py", "--torch", env={"HPCVOD_GPU_OPERATIONS": mode, "CUDA_VISIBLE_DEVICES": "0"},
                    timeout=300)
    assert run.returncode == 0, run.explain()
    assert len(re.findall(r"GPU OK mpi \d+ checks", run.stdout)) == 2, run.explain()
    if mode == "auto":
        assert "share GPU" in run.stderr, run.explain()


# ---- the device path on CPU, through a stand-in for CuPy and NCCL (tests/runtime/cpu_cupy/README.md) ----------
STAND_IN = Path(__file__).resolve().parent / "cpu_cupy"


def _stand_in_env(**extra: str) -> dict[str, str]:
    return {"PYTHONPATH": f"{STAND_IN}{os.pathsep}{ROOT}", **extra}


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_device_path_runs_end_to_end_on_the_cpu_stand_in(mpich, ranks: int) -> None:
    """Routing, negotiation, device fusion buffer, NCCL calls (as MPI), broadcast, host copies, mismatches."""
    run = mpich.run(ranks, "w_gpu.py", env=_stand_in_env(), timeout=180)
    assert run.returncode == 0, run.explain()
    assert len(re.findall(r"GPU OK nccl \d+ checks", run.stdout)) == ranks, run.explain()


@pytest.mark.parametrize("mode", ["auto", "mpi"])
def test_ranks_sharing_a_gpu_are_staged_through_mpi_on_the_cpu_stand_in(mpich, mode: str) -> None:
    run = mpich.run(2, "w_gpu.py", env=_stand_in_env(HPCVOD_GPU_OPERATIONS=mode, CPU_CUPY_SHARED_GPU="1"),
                    timeout=180)
    assert run.returncode == 0, run.explain()
    assert len(re.findall(r"GPU OK mpi \d+ checks", run.stdout)) == 2, run.explain()
    assert ("share GPU" in run.stderr) == (mode == "auto"), run.explain()


def test_nccl_forced_where_ranks_share_a_gpu_fails_naming_them(mpich) -> None:
    run = mpich.run(2, "w_gpu.py", env=_stand_in_env(HPCVOD_GPU_OPERATIONS="nccl", CPU_CUPY_SHARED_GPU="1"),
                    timeout=180)
    assert run.returncode != 0, run.explain()
    assert "HPCVOD_GPU_OPERATIONS=nccl, but NCCL cannot be used: ranks 0 and 1 share GPU" in run.stderr, \
        run.explain()


def test_hierarchical_allreduce_over_the_nccl_primitives_on_the_cpu_stand_in(mpich) -> None:
    """runtime/nccl.py's reduce-scatter / allreduce / allgather calls (pointers, counts) in the hierarchical
    algorithm, 4 ranks as two "nodes" two ways, against a flat MPI Allreduce."""
    run = mpich.run(4, "w_hierarchical.py", "--nccl", env=_stand_in_env(), timeout=180)
    assert run.returncode == 0, run.explain()
    assert "HIERARCHICAL OK 448" in run.stdout, run.explain()
