"""Horovod's ``horovod.common.basics``: ``HorovodBasics``, the object each framework's ``mpi_ops`` keeps as
``_basics`` (Horovod's tests call it, e.g. ``hvd.mpi_ops._basics._get_process_set_ids_and_ranks()``)."""

from __future__ import annotations

from typing import Any

from hpcvod.frameworks._common import runtime_basics
from hpcvod.runtime.context import process_set_ids_and_ranks


class HorovodBasics:
    """The runtime's basics (``init``, ``size``, ``rank``, ``mpi_built``...) as attributes, plus the process-set
    table. Horovod builds one per framework over its compiled library; here every framework shares the runtime,
    so the arguments Horovod passes (library path, name) are accepted and ignored."""

    def __init__(self, *_library: Any) -> None:
        self.__dict__.update(runtime_basics())

    @staticmethod
    def _get_process_set_ids_and_ranks() -> dict[int, list[int]]:
        """{process set id: its global ranks} for every registered set, 0 being the whole job."""
        return process_set_ids_and_ranks()


__all__ = ["HorovodBasics"]
