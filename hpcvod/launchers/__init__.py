"""How ranks start inside an allocation, kept apart from how the allocation is requested (the scheduler).

A launcher turns a ``LaunchRequest`` into the words of the launch line and the environment the launcher
itself needs: ``srun`` (Slurm, with its --mpi= plugin), Open MPI's ``mpirun``, and the Hydra ``mpiexec`` of
MPICH and Intel MPI. ``launcher_for(kind, flavour)`` picks one; ``flavour.detect_mpi()`` finds the local MPI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from hpcvod.launchers.shell import Verbatim


# Variables of an enclosing MPI launch: a launch started from inside an MPI rank must not inherit them, or its
# own mpiexec would join the outer world instead of starting a new one.
_OUTER_LAUNCH_VARS = frozenset({
    "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "PMI_ID", "PMI_HOSTNAME", "PMI_JOBID", "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS", "PMIX_RANK", "PMIX_NAMESPACE", "PMIX_SERVER_URI", "PMIX_SERVER_URI2", "PMIX_SERVER_URI3",
    "PMIX_SERVER_URI4", "PMIX_SERVER_URI21", "PMIX_SERVER_URI41", "PMIX_SERVER_TMPDIR", "PMIX_SYSTEM_TMPDIR",
    "PMIX_ID"})
_OUTER_LAUNCH_PREFIXES = ("OMPI_COMM_WORLD_", "OMPI_UNIVERSE_SIZE", "HYDI_", "HYDRA_")


def without_outer_launch(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment minus the variables of an MPI launch we might be running inside of."""
    return {k: v for k, v in environ.items() if k not in _OUTER_LAUNCH_VARS and not k.startswith(_OUTER_LAUNCH_PREFIXES)}


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a launcher needs to know, whoever asks (a rendered script or ``hpcvod run``)."""

    executable: str  # srun, or the path/name of mpirun/mpiexec
    world_size: int
    nodes: int = 1
    tasks_per_node: int = 1  # 0: as the host list's slots say (hpcvod run -H h1:2,h2:4)
    cpus_per_task: int = 1
    mpi_plugin: str | None = None  # srun --mpi=
    pmi_library: str | None = None  # Intel MPI under srun: I_MPI_PMI_LIBRARY
    hostfile: str | None = None  # a path, or Verbatim('"$PBS_NODEFILE"')
    hosts: str | None = None  # h1:2,h2:2 (hpcvod run -H)
    single_host: bool = False  # everything on this machine (local site, hpcvod run without hosts)
    forward_env: Sequence[str] = ()  # variables the ranks must see on every node
    is_root: bool = False
    extra_args: Sequence[str] = ()
    srun_container_args: Sequence[str] = ()  # pyxis options (srun only)
    het_group: int | None = None  # srun --het-group=N: the component of a Slurm heterogeneous job (srun only)


@dataclass(frozen=True)
class LaunchLine:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


class Launcher:
    name: str = ""

    def line(self, req: LaunchRequest) -> LaunchLine:
        raise NotImplementedError


def label_argv(python: str) -> list[str]:
    """The words that run a rank's program through the line labeller (hpcvod.launchers.label), by ``python``,
    which must import hpcvod: every line the program prints reaches the launcher as ``[RANK]<stdout>: ...`` or
    ``[RANK]<stderr>: ...``. They go between the launcher's words and the program's."""
    return [python, "-m", "hpcvod.launchers.label", "--"]


def launcher_for(kind: str, flavour: str) -> Launcher:
    """srun for kind 'srun'; otherwise the MPI's own launcher (mpirun and mpiexec are the same program)."""
    if kind == "srun":
        from hpcvod.launchers.srun import SrunLauncher

        return SrunLauncher(flavour)
    if flavour == "openmpi":
        from hpcvod.launchers.openmpi import OpenMpiLauncher

        return OpenMpiLauncher()
    from hpcvod.launchers.hydra import HydraLauncher

    return HydraLauncher(flavour)


__all__ = ["LaunchRequest", "LaunchLine", "Launcher", "label_argv", "launcher_for", "without_outer_launch", "Verbatim"]
