"""How ranks start inside an allocation, kept apart from how the allocation is requested (the scheduler).

A launcher turns a ``LaunchRequest`` into the words of the launch line and the environment the launcher
itself needs: ``srun`` (Slurm, with its --mpi= plugin), Open MPI's ``mpirun``, and the Hydra ``mpiexec`` of
MPICH and Intel MPI. Each is one module of this package registered with ``base.register`` and found here
(``all_launchers()``); ``launcher_for(kind, flavour)`` picks the one a profile's ``launcher.kind`` and MPI
flavour name, and ``launcher_kinds()`` are the choices of that key. ``label`` is the rank's line labeller that
every launch line runs (``python -m hpcvod.launchers.label``), not a launcher.
"""

from __future__ import annotations

import importlib
import pkgutil

from hpcvod.launchers.base import LaunchLine, Launcher, LaunchRequest, label_argv, registered, without_outer_launch

# not launchers: run (`hpcvod run`, a command, moved to the CLI); elastic_driver (`hpcvod run`'s elastic mode: it
# supervises a launch, it does not render one); elastic_batch (its batch-job form)
NOT_LAUNCHERS = {"base", "label", "run", "elastic_driver", "elastic_batch"}


def all_launchers() -> dict[str, type[Launcher]]:
    """Every launcher of this package, by name: each module of the folder is imported once and registers its own."""
    for module in pkgutil.iter_modules(__path__):
        if module.name not in NOT_LAUNCHERS:
            importlib.import_module(f"{__name__}.{module.name}")
    return registered()


def launcher_kinds() -> list[str]:
    """The values a profile's ``launcher.kind`` may take: the kinds the registered launchers answer to."""
    return sorted({kind for cls in all_launchers().values() for kind in cls.kinds})


def launchers_of_kind(kind: str) -> list[type[Launcher]]:
    """The registered launchers that answer to ``kind`` (several where the MPI flavour decides)."""
    return [cls for _, cls in sorted(all_launchers().items()) if kind in cls.kinds]


def launcher_for(kind: str, flavour: str) -> Launcher:
    """The launcher of ``kind`` that starts ``flavour``'s ranks (srun for any; mpirun and mpiexec are the MPI's
    own program: Open MPI's, or Hydra's for MPICH and Intel MPI)."""
    for cls in launchers_of_kind(kind):
        if flavour in cls.flavours:
            return cls(flavour)
    raise KeyError(f"no launcher of kind {kind!r} for MPI flavour {flavour!r}")  # the profile schema lets none through


__all__ = ["LaunchRequest", "LaunchLine", "Launcher", "all_launchers", "label_argv", "launcher_for", "launcher_kinds",
           "launchers_of_kind", "without_outer_launch"]
