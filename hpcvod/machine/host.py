"""Facts about the machine hpcvod runs on, gathered in one place so a plan can be resolved without them
(tests and golden files pass fixed facts; only the `local` site and `auto` values read them)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from hpcvod.machine.flavour import MpiInstall, MpiNotFound, detect_mpi
from hpcvod.support.errors import UserError


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    cpu_count: int
    gpu_count: int
    python: str  # runs .py scripts when the profile names no python
    is_root: bool
    cwd: str
    mpi: MpiInstall | None = None  # filled in only when a profile needs the local MPI

    def with_mpi(self, launcher: str | None = None) -> "HostFacts":
        """The same facts plus the installed MPI (raises UserError when there is none)."""
        if self.mpi is not None and (launcher is None or launcher == self.mpi.launcher):
            return self
        try:
            return replace(self, mpi=detect_mpi(launcher))
        except MpiNotFound as err:
            raise UserError(str(err)) from None


def _gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return sum(1 for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        return 0


def detect_host() -> HostFacts:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return HostFacts(hostname=os.uname().nodename, cpu_count=cpus, gpu_count=_gpu_count(),
                     python=sys.executable, is_root=hasattr(os, "geteuid") and os.geteuid() == 0,
                     cwd=str(Path.cwd()))
