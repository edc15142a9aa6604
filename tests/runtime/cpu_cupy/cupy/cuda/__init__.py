"""cupy.cuda for the CPU stand-in: one "device", streams that are no-ops."""

from __future__ import annotations

import os
from typing import Any

from . import nccl, runtime  # noqa: F401


class Stream:
    null: "Stream"

    def __init__(self, ptr: int = 0) -> None:
        self.ptr = ptr

    def synchronize(self) -> None:
        pass                    # host memory: every operation has finished when it returns

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


Stream.null = Stream(0)


class ExternalStream(Stream):
    pass


def get_current_stream() -> Stream:
    return Stream.null


class Device:
    def __init__(self, index: int = 0) -> None:
        self.id = index

    def use(self) -> None:
        pass

    @property
    def pci_bus_id(self) -> str:
        # one "GPU" per process, unless the test wants ranks to share one
        return "0000:00:00.0" if os.environ.get("CPU_CUPY_SHARED_GPU") == "1" else f"cpu-stand-in:{os.getpid()}"
