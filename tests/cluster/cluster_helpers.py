"""Driving the real Slurm test cluster of scripts/slurm-sandbox.sh from tests: start/reuse, submit, watch.

Kept apart from conftest.py so test modules can import the helpers by name.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
SANDBOX_SCRIPT = REPO / "scripts" / "slurm-sandbox.sh"
WORKERS = Path(__file__).resolve().parent / "workers"
NODES_WANTED = 2

# Variables a test process may carry (from an enclosing allocation, an MPI launcher or the developer's shell)
# that would change how the ranks of a job start; every job gets an environment without them.
_LAUNCH_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "OMPI_", "PMIX_", "PMI_", "I_MPI_", "MPICH_",
                        "HYDRA_", "FI_", "HPCVOD_", "HOROVOD_", "PRTE_", "MPI4PY_")

# The MPI flavours hpcvod supports under srun: venv, srun --mpi= plugin, extra environment (docs/measured.md).
OPENMPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    # ob1 + tcp between the "nodes" (separate network namespaces), sm inside one; skips a 1 s UCX probe
    "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,sm,tcp",
    "PMIX_MCA_psec": "native",   # silences PMIx's munge warning under srun
}


@dataclass(frozen=True)
class Flavour:
    name: str
    venv: Path
    srun_mpi: str
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def libpmi2_path() -> Optional[str]:
    """Slurm's PMI-2 client library (Debian package libpmi2-0), which Intel MPI loads under srun."""
    for pattern in ("/usr/lib/*/libpmi2.so", "/usr/lib/*/libpmi2.so.0", "/usr/lib64/libpmi2.so*",
                    "/usr/lib/libpmi2.so*"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def flavours() -> dict[str, Flavour]:
    impi_env = {"I_MPI_PMI_LIBRARY": libpmi2_path() or "/nonexistent/libpmi2.so"}
    return {
        "mpich": Flavour("mpich", REPO / ".venv", "pmi2"),
        "openmpi": Flavour("openmpi", REPO / ".venvs" / "openmpi", "pmix", OPENMPI_ENV),
        "impi": Flavour("impi", REPO / ".venvs" / "impi", "pmi2", impi_env),
    }


def require_flavour(flavour: Flavour) -> None:
    """Skip (or, with HPCVOD_REQUIRE_ALL_MPI=1, fail) when a flavour's venv is not set up."""
    if flavour.python.exists():
        return
    msg = f"MPI flavour {flavour.name}: {flavour.python} missing (run scripts/setup-venvs.sh all)"
    if os.environ.get("HPCVOD_REQUIRE_ALL_MPI") == "1":
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def job_env(extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """This process's environment without launcher/MPI variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_ENV_PREFIXES)}
    env.update(extra or {})
    return env


def run(argv: Sequence[str], *, timeout: float = 120, env: Optional[Mapping[str, str]] = None,
        cwd: Optional[os.PathLike] = None, check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env=dict(env) if env is not None else job_env(), cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def unavailable_reason(need: str = "slurmctld") -> Optional[str]:
    """Why this machine cannot run a sandbox cluster, or None when it can (or at least may).

    `need`: the program that tells the scheduler is installed (else apt-get must be there to install it)."""
    if not sys.platform.startswith("linux"):
        return "the sandbox clusters need Linux"
    if os.geteuid() != 0:
        return "the sandbox clusters need root (network namespaces, daemons, apt)"
    for tool in ("ip", "nsenter", "unshare", "flock"):
        if shutil.which(tool) is None:
            return f"the sandbox clusters need `{tool}` on PATH"
    if shutil.which(need) is None and shutil.which("apt-get") is None:
        return f"`{need}` is not installed and there is no apt-get to install it"
    probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create network namespaces here: {probe.stderr.strip()}"
    return None


# ---- the cluster ---------------------------------------------------------------------------------------------

TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED"}


@dataclass
class Cluster:
    """A running sandbox cluster: its nodes and helpers to run jobs on it."""

    base: Path
    nodes: list[str]
    accounting: bool
    started_here: bool
    start_seconds: float

    @property
    def conf(self) -> Path:
        return self.base / "slurm.conf"

    @property
    def jobcomp_log(self) -> Path:
        return self.base / "log" / "jobcomp.txt"

    def srun(self, args: Sequence[str], *, env: Optional[Mapping[str, str]] = None, timeout: float = 120,
             cwd: Optional[os.PathLike] = None) -> subprocess.CompletedProcess:
        """srun ARGS, from outside any allocation, with a clean job environment plus `env`."""
        return run(["srun", *args], env=job_env(env), timeout=timeout, cwd=cwd)

    def sbatch(self, script: os.PathLike, args: Sequence[str] = (), *, env: Optional[Mapping[str, str]] = None,
               cwd: Optional[os.PathLike] = None) -> str:
        """Submit a batch script; returns the job id."""
        proc = run(["sbatch", "--parsable", *args, str(script)], env=job_env(env), cwd=cwd, timeout=60, check=True)
        return parse_job_id(proc.stdout)

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o` as a dict ({} once the job has left slurmctld's memory)."""
        proc = run(["scontrol", "show", "job", "-o", job_id], timeout=30)
        if proc.returncode != 0:
            return {}
        return parse_scontrol(proc.stdout)

    def state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "")

    def wait_state(self, job_id: str, wanted: Iterable[str], timeout: float = 60) -> str:
        """Poll until the job is in one of `wanted` (or terminal); returns the state reached."""
        wanted = set(wanted)
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state in wanted:
                return state
            if state in TERMINAL_STATES and not (wanted & TERMINAL_STATES):
                raise AssertionError(f"job {job_id} ended {state} while waiting for {sorted(wanted)}: "
                                     f"{self.job(job_id)}")
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not in {sorted(wanted)} after {timeout} s (last: {state!r}): "
                             f"{self.job(job_id)}")

    def wait_done(self, job_id: str, timeout: float = 120) -> dict[str, str]:
        """Wait for a terminal state; returns the final scontrol record."""
        self.wait_state(job_id, TERMINAL_STATES, timeout)
        return self.job(job_id)

    def cancel(self, job_id: str) -> None:
        run(["scancel", job_id], timeout=30)


def parse_job_id(sbatch_out: str) -> str:
    """The job id from `sbatch --parsable` ("123" or "123;cluster") or plain sbatch output."""
    m = re.search(r"^(\d+)(?:;\S+)?\s*$", sbatch_out.strip(), re.M) or re.search(r"Submitted batch job (\d+)",
                                                                               sbatch_out)
    if not m:
        raise AssertionError(f"no job id in sbatch output: {sbatch_out!r}")
    return m.group(1)


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o` output (KEY=VALUE pairs; values may contain spaces only in Command/Reason...)."""
    out: dict[str, str] = {}
    # keys are CamelCase words followed by '='; a value runs until the next ' Key=' token
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(.*?)(?=\s[A-Za-z][A-Za-z0-9_:/]*=|\s*$)", text.strip()):
        out.setdefault(m.group(1), m.group(2))
    return out


def parse_probe_lines(text: str, tag: str = "PROBE") -> list[dict]:
    """Records 'TAG {flat json}' printed by the worker scripts, as dicts (other output ignored).

    Matched anywhere, not per line: an MPI launcher's output forwarding may glue two ranks' lines together.
    """
    return [json.loads(m.group(1)) for m in re.finditer(re.escape(tag) + r" (\{[^{}]*\})", text)]


# ---- the real hpcvod CLI -------------------------------------------------------------------------------------

def cli_env(tmp: Path, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """A job environment for `hpcvod`, with an empty user config folder (the user's profiles stay out)."""
    env = job_env(extra)
    env["XDG_CONFIG_HOME"] = str(tmp / "xdg-config")
    return env


def hpcvod(*args: object, cwd: Path, venv: Path = REPO / ".venv", timeout: float = 180,
           env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """`hpcvod ARGS` as a user types it, under the given venv's Python (= the ranks' Python for .py scripts)."""
    return run([venv / "bin" / "python", "-m", "hpcvod.cli", *map(str, args)], cwd=cwd, timeout=timeout,
               env=cli_env(cwd, env))


def submitted(proc: subprocess.CompletedProcess) -> tuple[str, Path]:
    """(job id, job folder) from `hpcvod submit`'s first line."""
    m = re.search(r"submitted job (\S+) to site \S+ \(\w+\); folder: (\S+)", proc.stdout + proc.stderr)
    if not m:
        raise AssertionError(f"no 'submitted job' line:\n{proc.stdout}\n{proc.stderr}")
    return m.group(1), Path(m.group(2))


def hpcvod_status(job: str, cwd: Path) -> dict:
    proc = hpcvod("status", "--json", job, cwd=cwd, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def wait_for_status(job: str, cwd: Path, wanted: Iterable[str], timeout: float = 90) -> dict:
    """Poll `hpcvod status` until the state is one of `wanted`; returns that status."""
    wanted = set(wanted)
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        status = hpcvod_status(job, cwd)
        if status["state"] in wanted:
            return status
        time.sleep(0.3)
    raise AssertionError(f"job {job} not in {sorted(wanted)} after {timeout} s: {status}")


def wait_for_file(path: Path, timeout: float = 60, predicate=None) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text()
            if predicate is None or predicate(text):
                return text
        time.sleep(0.1)
    raise AssertionError(f"{path} not there (or not as expected) after {timeout} s")
