"""torch tensors and the runtime's arrays (mpi_ops.py builds on it).

Contiguous CPU tensors become NumPy views of their own memory; contiguous CUDA tensors go as they are (through
DLPack, bfloat16 ones as their int16 words); anything else goes through one contiguous CPU staging copy each way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hpcvod.runtime import gpu


def as_numpy(tensor: torch.Tensor) -> tuple[np.ndarray, torch.Tensor | None]:
    """A NumPy array over the tensor's memory, or over a contiguous CPU staging copy (returned second, else None)."""
    t = tensor.detach()
    if t.layout != torch.strided:
        raise ValueError(f"hpcvod collectives take dense tensors, got layout {t.layout}")
    if t.device.type == "cpu" and t.dtype != torch.bfloat16 and t.is_contiguous() and not t.is_conj() \
            and not t.is_neg():
        return t.numpy(), None
    if t.device.type == "cuda" and t.is_contiguous() and device_path():
        # the runtime takes it through DLPack (no copy) and runs it on NCCL (runtime/nccl.py); DLPack consumers
        # have no bfloat16: its words go, tagged, and NCCL reduces them as bfloat16
        return (gpu.Bfloat16Words(t.view(torch.int16)) if t.dtype == torch.bfloat16 else t), None
    staged = t.to(device="cpu", dtype=torch.float32 if t.dtype == torch.bfloat16 else t.dtype,
                  memory_format=torch.contiguous_format, copy=True).resolve_conj().resolve_neg()
    return staged.numpy(), staged


def device_path() -> bool:
    """CUDA tensors go to the runtime as they are when CuPy can view them (else: a CPU staging copy)."""
    return gpu.probe()[0] is not None


def to_torch(array: Any, like: torch.Tensor) -> torch.Tensor:
    """Wraps a runtime result as a tensor (no copy on CPU or GPU) with ``like``'s dtype and device."""
    if isinstance(array, np.ndarray):
        out = torch.from_numpy(np.ascontiguousarray(array))
    else:                               # a CuPy array from the device path
        out = torch.from_dlpack(array)
        if like.dtype == torch.bfloat16 and out.dtype == torch.int16:
            out = out.view(torch.bfloat16)  # the words of a bfloat16 result
    if out.dtype != like.dtype or out.device != like.device:
        out = out.to(device=like.device, dtype=like.dtype)
    return out


def write_back(tensor: torch.Tensor, staged: torch.Tensor | None) -> torch.Tensor:
    if staged is not None:
        with torch.no_grad():
            tensor.copy_(staged)
    return tensor


def splits_array(splits: Any) -> np.ndarray | None:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        splits = splits.detach().cpu().numpy()
    return np.asarray(splits, dtype=np.int32)
