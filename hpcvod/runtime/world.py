"""The MPI world as hvd.init() finds it, and the check against what the launcher promised.

A wrong ``srun --mpi=`` plugin (or a forgotten launcher) starts N independent MPI worlds of size 1 without
any error: every process believes it is rank 0 of 1 and trains alone (docs/measured.md). ``init()`` compares
the size it sees with every promise it can find in the environment and refuses to go on when they differ.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Mapping

from .config import WORLD_SIZE
from .errors import HpcvodWorldSizeError

# Launcher-specific variables, most authoritative first. When an mpirun/mpiexec runs inside a Slurm
# allocation its ranks also inherit SLURM_STEP_NUM_TASKS of the *daemon* step (one task per node), so the
# MPI launchers' own variables must win over Slurm's.
_LAUNCHER_SIZE_VARS = (
    ("OMPI_COMM_WORLD_SIZE", "Open MPI mpirun"),
    ("PMI_SIZE", "PMI (MPICH/Intel MPI mpiexec.hydra, or srun --mpi=pmi2)"),
    ("PMIX_SIZE", "PMIx"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH2"),
)


@dataclass(frozen=True)
class SizePromise:
    variable: str
    value: int
    source: str


def launcher_promises(env: Mapping[str, str] | None = None) -> list[SizePromise]:
    """Every world size the environment promises, in the order they are checked."""
    env = os.environ if env is None else env
    promises: list[SizePromise] = []

    def add(var: str, source: str) -> None:
        raw = env.get(var)
        if raw is None or raw.strip() == "":
            return
        try:
            promises.append(SizePromise(var, int(raw), source))
        except ValueError:
            pass  # not ours to validate; a garbled launcher variable is no promise

    size = WORLD_SIZE.read(None, env)   # ours: a malformed value is an error, never "no promise"
    if size is not None:
        promises.append(SizePromise("HPCVOD_WORLD_SIZE", size, "the hpcvod job script"))
    found_launcher = False
    for var, source in _LAUNCHER_SIZE_VARS:
        if var in env:
            add(var, source)
            found_launcher = True
            break
    if not found_launcher:
        # Only srun sets SLURM_STEP_NUM_TASKS in a task's environment; SLURM_NTASKS alone describes the
        # allocation, which a deliberate `mpirun -n 1` inside a batch script may legitimately differ from.
        add("SLURM_STEP_NUM_TASKS", "srun")
    return promises


# Where each launcher puts a process's rank before MPI_Init: MPI's own variables first (under `mpirun` inside
# Slurm, SLURM_PROCID is 0 on every rank of the batch step).
_LAUNCHER_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def launcher_rank(env: Mapping[str, str] | None = None) -> int | None:
    """This process's rank as the launcher announced it (no MPI call), or None when none did."""
    env = os.environ if env is None else env
    return next((int(env[var]) for var in _LAUNCHER_RANK_VARS if env.get(var, "").isdigit()), None)


def mpi_flavour(library_version: str) -> str:
    """'openmpi', 'intelmpi', 'mpich', 'mvapich' or 'unknown' from MPI_Get_library_version()."""
    text = library_version.lower()
    if "open mpi" in text:
        return "openmpi"
    if "intel(r) mpi" in text or "intel mpi" in text:
        return "intelmpi"
    if "mvapich" in text:
        return "mvapich"
    if "mpich" in text:
        return "mpich"
    return "unknown"


_FIX_BY_FLAVOUR = {
    "openmpi": "Open MPI needs `srun --mpi=pmix` (check `srun --mpi=list`)",
    "mpich": "MPICH needs `srun --mpi=pmi2`",
    "mvapich": "MVAPICH needs `srun --mpi=pmi2`",
    "intelmpi": "Intel MPI needs `srun --mpi=pmi2` with I_MPI_PMI_LIBRARY=<path to libpmi2.so>",
}


def check_world_size(actual: int, library_version: str,
                     env: Mapping[str, str] | None = None) -> None:
    """Raise HpcvodWorldSizeError when the MPI world size differs from a launcher's promise."""
    env = os.environ if env is None else env
    promises = launcher_promises(env)
    broken = [p for p in promises if p.value != actual]
    if not broken:
        return
    flavour = mpi_flavour(library_version)
    said = ", ".join(f"{p.variable}={p.value} ({p.source})" for p in broken)
    if actual == 1:
        under_srun = "SLURM_STEP_NUM_TASKS" in env or "SLURM_PROCID" in env
        fix = _FIX_BY_FLAVOUR.get(flavour, "use the srun --mpi= plugin your MPI library was built for")
        how = (f"Under srun the PMI plugin must match the MPI library: {fix}; or start the ranks with "
               f"the MPI library's own mpirun/mpiexec." if under_srun else
               "Start the ranks with the MPI library's mpirun/mpiexec (or srun with the right --mpi= plugin).")
        raise HpcvodWorldSizeError(
            f"hpcvod.init(): this process is alone in an MPI world of size 1 but the launcher promised "
            f"{said}: every process started its own 1-rank world (the silent 'N singletons' failure) and "
            f"would train alone. {how} MPI library: {flavour}."
        )
    raise HpcvodWorldSizeError(
        f"hpcvod.init(): the MPI world has {actual} ranks but the launcher promised {said}. "
        f"Check the launch line (-n/--ntasks) and that every rank uses the same MPI library ({flavour})."
    )


@dataclass(frozen=True)
class WorldInfo:
    """What init() learned about this process's place in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    is_homogeneous: bool
    hostname: str
    thread_level: int
    library_version: str


def hostname() -> str:
    return socket.gethostname()
