"""What every launcher module provides: the request it reads, the line it answers, and the registry.

A launcher module (``hpcvod/launchers/<name>.py``) defines one ``Launcher`` subclass decorated with
``@register``: that is all it takes to add one. ``hpcvod.launchers`` finds every module of the package, the
profile's ``launcher.kind`` choices are the kinds the registered launchers answer to, and the launch line reaches
the script through the one shared template partial (hpcvod/templates/partials/launch.j2).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import ClassVar, Mapping, Sequence

from hpcvod.machine.flavour import FLAVOURS


# Variables of an enclosing MPI launch: a launch started from inside an MPI rank must not inherit them, or its
# own mpiexec would join the outer world instead of starting a new one.
_OUTER_LAUNCH_VARS = frozenset({
    "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "PMI_ID", "PMI_HOSTNAME", "PMI_JOBID", "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS", "PMIX_RANK", "PMIX_NAMESPACE", "PMIX_SERVER_URI", "PMIX_SERVER_URI2", "PMIX_SERVER_URI3",
    "PMIX_SERVER_URI4", "PMIX_SERVER_URI21", "PMIX_SERVER_URI41", "PMIX_SERVER_TMPDIR", "PMIX_SYSTEM_TMPDIR",
    "PMIX_ID"})
_OUTER_LAUNCH_PREFIXES = ("OMPI_COMM_WORLD_", "OMPI_UNIVERSE_SIZE", "HYDI_", "HYDRA_")
MPI_FLAVOURS = frozenset(FLAVOURS)


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
    """The launcher's words (before the program's) and the variables the launcher itself needs."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


class Launcher(abc.ABC):
    """How ranks start inside an allocation, for one family of launch programs."""

    name: ClassVar[str]
    # the profile's launcher.kind values this launcher answers to
    kinds: ClassVar[tuple[str, ...]]
    # the MPI libraries whose ranks it starts (a kind shared by several launchers is split by flavour)
    flavours: ClassVar[frozenset[str]] = MPI_FLAVOURS
    # the MPI library's own launcher: a profile's 'auto' finds the MPI installed here (else: the batch system's)
    local_mpi: ClassVar[bool] = True
    # a batch system's own program (srun): only a scheduler that names it as its own_launcher runs it
    scheduler_own: ClassVar[bool] = False
    # starts one component of a heterogeneous job (a data service beside the training, in one allocation)
    het_groups: ClassVar[bool] = False

    def __init__(self, flavour: str) -> None:
        self.flavour = flavour

    @abc.abstractmethod
    def line(self, req: LaunchRequest) -> LaunchLine:
        """The launch line that starts ``req.world_size`` ranks as ``req`` asks.

        Args:
            req: the ranks, nodes, hosts and environment to forward.
        Returns:
            the launcher's words (the program's follow) and the environment the launcher needs.
        """


_REGISTRY: dict[str, type[Launcher]] = {}


def register(cls: type[Launcher]) -> type[Launcher]:
    """Class decorator: make ``cls`` one of the launchers hpcvod knows (by its ``name``)."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise TypeError(f"two launchers named {cls.name!r}: {_REGISTRY[cls.name].__module__}, {cls.__module__}")
    _REGISTRY[cls.name] = cls
    return cls


def registered() -> dict[str, type[Launcher]]:
    """The launchers registered so far, by name (``hpcvod.launchers.all_launchers()`` finds them all first)."""
    return dict(_REGISTRY)


def label_argv(python: str, output_dir: str | None = None, world_size: int = 0) -> list[str]:
    """The words that run a rank's program through the line labeller (hpcvod.launchers.label), by ``python``,
    which must import hpcvod: every line the program prints reaches the launcher as ``[RANK]<stdout>: ...`` or
    ``[RANK]<stderr>: ...``. They go between the launcher's words and the program's. ``output_dir``: each rank's
    output is also written to output_dir/rank.R/{stdout,stderr} (hpcvod run --output-filename)."""
    copies = ["--output-dir", output_dir, "--world-size", str(world_size)] if output_dir else []
    return [python, "-m", "hpcvod.launchers.label", *copies, "--"]
