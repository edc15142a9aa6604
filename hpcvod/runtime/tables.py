"""The op and dtype tables of the runtime, defined once for both executors (host over MPI, device over NCCL).

Horovod's reduction-op numbering, the dtypes the collectives accept, their MPI datatypes and reductions, NCCL's
names for the same, the neutral values a joined rank contributes, scaling in Horovod's precision, and the
human description of a request's signature used by mismatch errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from . import handles as K
from .adasum import ADASUM_OP
from .adasum import check_dtype as check_adasum_dtype
from .errors import HpcvodInputError

# Horovod's reduction op numbering.
AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT = 0, 1, 2, 3, 4, 5
OP_NAMES = {AVERAGE: "Average", SUM: "Sum", ADASUM: "Adasum", MIN: "Min", MAX: "Max", PRODUCT: "Product"}

# Timeline activity of each host collective (the MPI call that runs it).
MPI_ACTIVITY = {K.ALLREDUCE: "MPI_ALLREDUCE", K.ALLGATHER: "MPI_ALLGATHERV", K.BROADCAST: "MPI_BCAST",
                K.ALLTOALL: "MPI_ALLTOALLV", K.REDUCESCATTER: "MPI_REDUCE_SCATTER"}

# Horovod's ops -> NCCL op names (Average is Sum followed by the postscale), and NumPy dtypes -> NCCL types.
NCCL_OPS = {AVERAGE: "NCCL_SUM", SUM: "NCCL_SUM", MIN: "NCCL_MIN", MAX: "NCCL_MAX", PRODUCT: "NCCL_PROD"}
NCCL_TYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
              "int64": "NCCL_INT64", "uint64": "NCCL_UINT64", "float16": "NCCL_FLOAT16",
              "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64", "bool": "NCCL_UINT8",
              "bfloat16": "NCCL_BFLOAT16"}
NCCL_BFLOAT16 = 9   # ncclBfloat16 (NCCL >= 2.10): CuPy's enum may lack the name, its calls take the number

# bfloat16: neither NumPy nor CuPy has it. Device buffers of it travel as int16 words (gpu.Bfloat16Words) under
# this element type in their signature, so NCCL reduces them as bfloat16 and scaling or staging widens them to
# float32 (exactly: a bfloat16 is the top half of a float32) and rounds back once.
BFLOAT16 = "bfloat16"

_mpi_types: dict[str, MPI.Datatype] = {}


SUPPORTED_DTYPES = ("bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, float64, "
                    "complex64, complex128")


def check_dtype(dtype: np.dtype, what: str = "tensor") -> None:
    """Refuse what MPI would move as bytes or reduce as integers: dates and durations (a sum of dates is no
    date), Python objects (pointers), strings and structured records."""
    if dtype.hasobject or dtype.kind in "OUSVMm":
        raise HpcvodInputError(f"{what}: dtype {dtype} is not supported by hpcvod's collectives; supported: "
                               f"{SUPPORTED_DTYPES} (convert first, e.g. datetime64 with .astype('int64'))")


def mpi_type(dtype: np.dtype) -> MPI.Datatype:
    """The MPI datatype of a NumPy dtype (cached; raises HpcvodInputError for unsupported dtypes)."""
    key = dtype.str
    t = _mpi_types.get(key)
    if t is None:
        check_dtype(dtype)
        if dtype == np.bool_:
            t = MPI.C_BOOL
        elif not dtype.isnative:
            raise HpcvodInputError(f"dtype {dtype} is not in native byte order; convert with .astype(...) first")
        else:
            # predefined datatypes only: MPI reductions are undefined on derived ones
            t = MPI._typedict.get(dtype.char)
            if t is None or t == MPI.DATATYPE_NULL:
                raise HpcvodInputError(f"dtype {dtype} has no MPI datatype; use a numeric or bool array")
        _mpi_types[key] = t
    return t


def mpi_reduce_op(op: int, dtype: np.dtype) -> MPI.Op:
    """The MPI reduction for a Horovod op on a dtype (raises HpcvodInputError where it is undefined); for Adasum
    the marker ADASUM_OP, on which the host executor runs runtime/adasum.py instead of an MPI reduction."""
    if op == ADASUM:
        check_adasum_dtype(dtype)
        return ADASUM_OP
    if dtype == np.bool_:
        if op == AVERAGE:
            raise HpcvodInputError("op=Average is undefined for bool arrays; use Sum (logical or) or Min/Max")
        return MPI.LOR if op in (SUM, MAX) else MPI.LAND
    if dtype.kind == "c" and op in (MIN, MAX):
        raise HpcvodInputError(f"op={OP_NAMES[op]} is undefined for complex arrays")
    if op in (AVERAGE, SUM):
        return MPI.SUM
    if op == MIN:
        return MPI.MIN
    if op == MAX:
        return MPI.MAX
    if op == PRODUCT:
        return MPI.PROD
    raise HpcvodInputError(f"unknown reduction op {op!r}; expected Average, Sum, Min, Max or Product")


def element_name(elem: Any) -> str:
    """The name of a signature's element type (a NumPy dtype, or BFLOAT16)."""
    return elem if isinstance(elem, str) else np.dtype(elem).name


def is_bfloat16(elem: Any) -> bool:
    return isinstance(elem, str) and elem == BFLOAT16


def arithmetic_dtype(elem: Any) -> np.dtype:
    """The dtype the host's MPI reduction of a signature's element type works in: float32 for bfloat16 words
    (staged: widened first), the element type itself otherwise."""
    return np.dtype(np.float32) if is_bfloat16(elem) else np.dtype(elem)


def bfloat16_widen(xp: Any, words: Any) -> Any:
    """float32 values of bfloat16 ``words`` (int16 or uint16, NumPy or CuPy ``xp``): exact."""
    return (words.view(xp.uint16).astype(xp.uint32) << 16).view(xp.float32)


def bfloat16_narrow(xp: Any, values: Any) -> Any:
    """bfloat16 words (int16) of float32 ``values``, rounded to nearest even; NaN stays a (quiet) NaN."""
    bits = xp.ascontiguousarray(values, dtype=xp.float32).view(xp.uint32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    return xp.where(xp.isnan(values), 0x7FC0, rounded).astype(xp.uint16).view(xp.int16)


def identity_fill(op: int, dtype: Any, shape: tuple) -> np.ndarray:
    """A joined rank's neutral contribution to a reduction."""
    if is_bfloat16(dtype):
        return bfloat16_narrow(np, identity_fill(op, np.dtype(np.float32), shape))
    if op in (AVERAGE, SUM):
        return np.zeros(shape, dtype)
    if op == PRODUCT:
        return np.ones(shape, dtype)
    if dtype == np.bool_:
        return np.full(shape, op == MIN, dtype)
    info = np.finfo(dtype) if dtype.kind in "fc" else np.iinfo(dtype)
    return np.full(shape, info.max if op == MIN else info.min, dtype)


def scale_dtype(dtype: np.dtype) -> Any:
    """Horovod's arithmetic for scaling ``dtype``: float16 and float32 in float32 (the factor rounded to float32,
    float16 values widened, the product rounded once), integers in float64 (truncating toward zero), anything
    else (float64, complex) in its own type (None)."""
    if dtype.kind == "f" and dtype.itemsize <= 4:
        return np.float32
    return np.float64 if dtype.kind in "iu" else None


def scale_into(src: np.ndarray, factor: float, out: np.ndarray) -> None:
    """``out = factor * src`` in Horovod's precision (:func:`scale_dtype`). NumPy alone would round the factor to
    float16 first for float16 arrays: one unit in the last place off."""
    work = scale_dtype(src.dtype)
    if work is None:
        np.multiply(src, factor, out=out, casting="unsafe")
    else:
        # dtype= picks the loop: a float16 array times a float32 scalar still runs NumPy's float16 loop
        np.multiply(src, work(factor), out=out, casting="unsafe", dtype=work)


def scale_on_device(cp: Any, a: Any, factor: float, elem: Any = None) -> Any:
    """``factor * a`` for a CuPy array in Horovod's precision (:func:`scale_dtype`), in ``a``'s dtype; bfloat16
    words (``elem`` BFLOAT16) are scaled in float32, as float16 is."""
    if is_bfloat16(elem):
        return bfloat16_narrow(cp, bfloat16_widen(cp, a) * np.float32(factor))
    work = scale_dtype(a.dtype)
    if work is None:
        return a * factor
    return (a.astype(work) * work(factor)).astype(a.dtype)


def describe_sig(sig: K.Signature) -> str:
    """A short human description of a request signature (for mismatch errors)."""
    kind = sig.kind
    name = K.KIND_NAMES.get(kind, "?")
    if sig.device:
        return describe_sig(sig._replace(device=False)).replace("(", "(device=cuda, ", 1)
    if kind in (K.ALLREDUCE, K.REDUCESCATTER):
        extra = f" prescale={sig.prescale}" if sig.prescale != 1.0 else ""
        extra += f" postscale={sig.postscale}" if sig.postscale != 1.0 else ""
        return f"{name}(dtype={element_name(sig.elem)}, shape={sig.shape}, op={OP_NAMES.get(sig.op, sig.op)}{extra})"
    if kind in (K.ALLGATHER, K.ALLTOALL):
        return f"{name}(dtype={element_name(sig.elem)}, shape=(*, {', '.join(map(str, sig.shape))}))" \
            if sig.shape else f"{name}(dtype={element_name(sig.elem)}, shape=(*,))"
    if kind == K.BROADCAST:
        return f"{name}(dtype={element_name(sig.elem)}, shape={sig.shape}, root_rank={sig.root})"
    return f"{name}()"
