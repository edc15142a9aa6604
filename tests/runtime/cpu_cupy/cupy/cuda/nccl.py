"""cupy.cuda.nccl for the CPU stand-in: each NCCL call is the matching MPI call on the same (host) memory.

A communicator is made like NCCL's, from a unique id and a rank, by every member: the members find each other
through a rendezvous folder named by the id, then form an MPI communicator of exactly those processes.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import time
import uuid
from typing import Any

import numpy as np

NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 6, 7, 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
# Like CuPy 13's enum, no NCCL_BFLOAT16 name: callers pass ncclBfloat16's number, 9. Its buffers are 16-bit words.
_BFLOAT16 = 9
_DTYPES = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32, NCCL_UINT32: np.uint32,
           NCCL_INT64: np.int64, NCCL_UINT64: np.uint64, NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32,
           NCCL_FLOAT64: np.float64, _BFLOAT16: np.int16}


def MPI_IN_PLACE() -> Any:
    from mpi4py import MPI
    return MPI.IN_PLACE


def get_version() -> int:
    return 0


def get_unique_id() -> tuple:
    return (uuid.uuid4().hex,)


def _view(ptr: int, count: int, dtype: int) -> np.ndarray:
    dt = np.dtype(_DTYPES[dtype])
    raw = (ctypes.c_char * (count * dt.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dt, count=count)


_group: list = []          # point-to-point calls between groupStart and groupEnd (run together at groupEnd)
_group_depth = [0]


def groupStart() -> None:
    _group_depth[0] += 1


def groupEnd() -> None:
    """NCCL starts a group's sends and receives together; MPI's non-blocking calls do the same here."""
    _group_depth[0] -= 1
    if _group_depth[0] == 0 and _group:
        from mpi4py import MPI
        requests = [start() for start in _group]
        _group.clear()
        MPI.Request.Waitall(requests)


_bfloat16_ops: dict = {}


def _mpi_op(op: int, datatype: int = NCCL_FLOAT32) -> Any:
    from mpi4py import MPI
    if datatype == _BFLOAT16:
        return _bfloat16_op(op)
    return {NCCL_SUM: MPI.SUM, NCCL_PROD: MPI.PROD, NCCL_MAX: MPI.MAX, NCCL_MIN: MPI.MIN}[op]


def _bfloat16_op(op: int) -> Any:
    """NCCL's bfloat16 reduction: each combining step in float32, rounded to bfloat16 (torch does the
    conversions here, independently of hpcvod's own)."""
    if op not in _bfloat16_ops:
        import torch
        from mpi4py import MPI
        combine = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum}[op]

        def reduce_words(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
            a = torch.from_numpy(np.frombuffer(inbuf, np.int16).copy()).view(torch.bfloat16).float().numpy()
            out = np.frombuffer(inoutbuf, np.int16)
            b = torch.from_numpy(out.copy()).view(torch.bfloat16).float().numpy()
            out[...] = torch.from_numpy(combine(a, b)).to(torch.bfloat16).view(torch.int16).numpy()

        _bfloat16_ops[op] = MPI.Op.Create(reduce_words, commute=True)
    return _bfloat16_ops[op]


class NcclCommunicator:
    def __init__(self, ndev: int, commId: tuple, rank: int) -> None:
        from mpi4py import MPI
        folder = os.path.join(tempfile.gettempdir(), f"cpu-nccl-{commId[0]}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{rank}.tmp"), "w") as f:
            f.write(str(MPI.COMM_WORLD.Get_rank()))
        os.replace(os.path.join(folder, f"{rank}.tmp"), os.path.join(folder, str(rank)))
        deadline = time.monotonic() + 60
        while len([n for n in os.listdir(folder) if n.isdigit()]) < ndev:
            if time.monotonic() > deadline:
                raise RuntimeError("stand-in NCCL: members never arrived")
            time.sleep(0.001)
        world = [int(open(os.path.join(folder, str(r))).read()) for r in range(ndev)]
        group = MPI.COMM_WORLD.Get_group().Incl(world)
        self._comm = MPI.COMM_WORLD.Create_group(group, tag=int(commId[0][:6], 16) % 32000)
        assert self._comm.Get_rank() == rank
        self._comm.Barrier()            # everyone has read the folder
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int) -> None:
        from mpi4py import MPI
        recv = _view(recvbuf, count, datatype)
        send = MPI.IN_PLACE if sendbuf == recvbuf else _view(sendbuf, count, datatype)
        self._comm.Allreduce(send, recv, _mpi_op(op, datatype))

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self._comm.Bcast(_view(buff, count, datatype), root)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int, op: int,
                      stream: int) -> None:
        n = self._comm.Get_size()
        self._comm.Reduce_scatter_block(_view(sendbuf, recvcount * n, datatype),
                                        _view(recvbuf, recvcount, datatype), _mpi_op(op, datatype))

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int) -> None:
        n = self._comm.Get_size()
        self._comm.Allgather(_view(sendbuf, count, datatype), _view(recvbuf, count * n, datatype))

    def broadcast(self, sendbuf: int, recvbuf: int, count: int, datatype: int, root: int, stream: int) -> None:
        recv = _view(recvbuf, count, datatype)
        if self._comm.Get_rank() == root and sendbuf != recvbuf:
            recv[...] = _view(sendbuf, count, datatype)
        self._comm.Bcast(recv, root)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, root: int,
               stream: int) -> None:
        send = _view(sendbuf, count, datatype)
        if self._comm.Get_rank() == root:
            self._comm.Reduce(MPI_IN_PLACE() if sendbuf == recvbuf else send, _view(recvbuf, count, datatype),
                              _mpi_op(op, datatype), root)
        else:
            self._comm.Reduce(send, None, _mpi_op(op, datatype), root)

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        buf = _view(sendbuf, count, datatype)
        self._p2p(lambda: self._comm.Isend(buf, peer, tag=77))

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        buf = _view(recvbuf, count, datatype)
        self._p2p(lambda: self._comm.Irecv(buf, peer, tag=77))

    def _p2p(self, start: Any) -> None:
        if _group_depth[0]:
            _group.append(start)
        else:
            start().Wait()

    def destroy(self) -> None:
        self._comm.Free()
