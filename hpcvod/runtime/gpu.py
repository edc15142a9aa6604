"""GPU buffers: recognising them, whether CuPy/NCCL can be used here, and pinning each rank to its GPU.

Nothing here imports CuPy, torch or TensorFlow unless a device buffer appears or the framework is already
imported by the training script: a CPU job never pays for the GPU path. Every probe is guarded, because on a
machine without a driver CuPy imports fine and then *raises* from ``cupy.cuda.is_available()`` or
``getDeviceCount()`` instead of returning False (docs/measured.md).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .config import PIN_GPU

# DLPack device types (dlpack.h): what ``__dlpack_device__()[0]`` says about where the memory lives.
DLPACK_CPU, DLPACK_CUDA, DLPACK_CUDA_HOST, DLPACK_CUDA_MANAGED = 1, 2, 3, 13
_DEVICE_TYPES = (DLPACK_CUDA, DLPACK_CUDA_MANAGED)

_lock = threading.Lock()
_probe: tuple[Any, Any, str] | None = None   # (cupy module or None, nccl module or None, why not)


class Bfloat16Words:
    """A GPU buffer of bfloat16 values handed to the runtime as its 16-bit words (CuPy, NumPy and DLPack
    consumers have no bfloat16): a framework wraps its bfloat16 device tensor's int16 view (``t.view(torch.int16)``,
    ``tf.bitcast(t, tf.int16)``) so that NCCL reduces it as bfloat16 on the device. Results come back as int16
    words for the framework to view as bfloat16 again."""

    __slots__ = ("words",)

    def __init__(self, words: Any) -> None:
        self.words = words


def is_device_buffer(x: Any) -> bool:
    """True when ``x`` lives in GPU memory (CuPy array, torch CUDA tensor, anything with DLPack on CUDA).

    Looks only at the type's attributes first, so NumPy arrays and CPU tensors cost two lookups.
    """
    kind = type(x)
    if kind is Bfloat16Words:
        return True
    dev = getattr(kind, "__dlpack_device__", None)
    if dev is not None:
        try:
            return int(dev(x)[0]) in _DEVICE_TYPES
        except Exception:          # a framework refusing to say (e.g. a deleted buffer): not ours to judge
            return False
    return getattr(kind, "__cuda_array_interface__", None) is not None


def probe() -> tuple[Any, Any, str]:
    """(cupy, cupy.cuda.nccl, "") when both work and a GPU is visible, else (cupy or None, None, why not)."""
    global _probe
    with _lock:
        if _probe is None:
            _probe = _probe_now()
        return _probe


def _probe_now() -> tuple[Any, Any, str]:
    try:
        import cupy
    except Exception as exc:   # ImportError, or a CUDA runtime that fails to load
        return None, None, f"CuPy is not importable ({_first_line(exc)}); install hpcvod[gpu]"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:   # no driver: CuPy raises instead of returning 0
        return cupy, None, f"CuPy sees no CUDA driver ({_first_line(exc)})"
    if count < 1:
        return cupy, None, "CuPy sees no GPU"
    try:
        from cupy.cuda import nccl
        nccl.get_version()
    except Exception as exc:
        return cupy, None, f"NCCL is not available through CuPy ({_first_line(exc)})"
    return cupy, nccl, ""


def device_count() -> int:
    """GPUs CuPy can see (0 without CuPy or without a driver)."""
    cupy = probe()[0]
    try:
        return int(cupy.cuda.runtime.getDeviceCount()) if cupy is not None else 0
    except Exception:
        return 0


def nccl_available() -> bool:
    """Whether device collectives can run over NCCL on this rank."""
    return probe()[1] is not None


def device_array(x: Any) -> Any:
    """A CuPy view (no copy) of a device buffer: CuPy arrays as they are, others through DLPack or CAI."""
    cupy = probe()[0]
    if cupy is None:
        raise RuntimeError(probe()[2])
    if isinstance(x, cupy.ndarray):
        return x
    if isinstance(x, Bfloat16Words):
        return device_array(x.words)
    if hasattr(x, "__dlpack__"):
        return cupy.from_dlpack(x)
    return cupy.asarray(x)      # __cuda_array_interface__: zero-copy


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:120]}" if text else type(exc).__name__


# ------------------------------------------------------------------------------------------- pinning
def pin_enabled(env: dict | None = None) -> bool:
    """HPCVOD_PIN_GPU / HOROVOD_PIN_GPU (default on): whether init() selects the GPU from local_rank."""
    return PIN_GPU.read(True, env)


def device_index(local_rank: int, visible: int) -> int:
    """The GPU a rank uses: its local rank among the visible ones.

    Under ``srun --gpus-per-task=1`` / ``--gpu-bind`` each task sees one GPU (index 0); when every task sees
    all of the node's GPUs, local rank i takes GPU i. More ranks than GPUs share them round-robin.
    """
    return local_rank % visible if visible > 0 else 0


def pin(local_rank: int) -> list[str]:
    """Select this rank's GPU in every GPU framework the script has imported; returns what was pinned.

    Frameworks that are not imported yet are left alone (importing one just to pin it would cost seconds);
    the framework wrappers call this again after importing theirs.
    """
    done: list[str] = []
    if not pin_enabled():
        return done
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                index = device_index(local_rank, torch.cuda.device_count())
                torch.cuda.set_device(index)
                done.append(f"torch cuda:{index}")
        except Exception:
            pass
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            index = device_index(local_rank, cupy.cuda.runtime.getDeviceCount())
            cupy.cuda.Device(index).use()
            done.append(f"cupy device {index}")
        except Exception:          # no driver: nothing to pin
            pass
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        try:
            gpus = tf.config.list_physical_devices("GPU")
            if gpus:
                chosen = gpus[device_index(local_rank, len(gpus))]
                tf.config.experimental.set_memory_growth(chosen, True)
                tf.config.set_visible_devices(chosen, "GPU")
                done.append(f"tensorflow {chosen.name}")
        except (RuntimeError, ValueError):
            pass                   # TF already initialised its GPUs: the script chose for itself
    return done
