"""Helpers for the submission-side tests: the real CLI in a subprocess, fixed host facts for golden files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from hpcvod import sites
from hpcvod.machine.flavour import MpiInstall
from hpcvod.machine.host import HostFacts
from hpcvod.schedulers import profile_options

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
# A fixed, absolute working directory so golden scripts do not depend on where the tests run.
GOLDEN_WORKDIR = Path("/tmp/hpcvod-golden-workdir")
# Site lookups that see only the shipped profiles (no $HPCVOD_SITE_PATH, no user's ~/.config/hpcvod/sites).
NO_USER_CONFIG = {"XDG_CONFIG_HOME": "/nonexistent/hpcvod-tests-config"}
# hpcvod.sites validates a profile against the scheduler modules it is handed: the shipped ones here.
SCHEDULER_OPTIONS = profile_options()
load_site = partial(sites.load_site, schedulers=SCHEDULER_OPTIONS)
discover_site = partial(sites.discover_site, schedulers=SCHEDULER_OPTIONS)
site_schema = partial(sites.schema, SCHEDULER_OPTIONS)
reference_markdown = partial(sites.reference_markdown, SCHEDULER_OPTIONS)


def golden_host(flavour: str = "mpich", gpus: int = 0, is_root: bool = False) -> HostFacts:
    """The same machine every time: golden files must not change with the machine they are made on."""
    launcher = {"mpich": "/opt/mpich/bin/mpiexec", "openmpi": "/opt/openmpi/bin/mpiexec",
                "intelmpi": "/opt/intel/mpi/bin/mpiexec"}[flavour]
    return HostFacts(hostname="login1", cpu_count=8, gpu_count=gpus, python="/opt/venv/bin/python",
                     is_root=is_root, cwd=str(GOLDEN_WORKDIR), mpi=MpiInstall(flavour, launcher, "fixed for tests"))


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without hpcvod settings, with an empty user config folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCVOD_")}
    env["XDG_CONFIG_HOME"] = str(tmp / "xdg-config")
    env.update(extra)
    return env


def hpcvod(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120,
           input: str | None = None) -> subprocess.CompletedProcess:
    """The real `hpcvod` command (python -m hpcvod.cli) in a subprocess."""
    return subprocess.run([sys.executable, "-m", "hpcvod.cli", *args], cwd=cwd, env=env or clean_env(cwd),
                          capture_output=True, text=True, timeout=timeout, input=input)


def submit_local(workdir: Path, *args: str) -> tuple[str, Path]:
    """`hpcvod submit --json --site local --tasks-per-node 2 ARGS` in ``workdir``: (job id, job folder)."""
    done = hpcvod("submit", "--json", "--site", "local", "--tasks-per-node", "2", *args, cwd=workdir,
                  env=clean_env(workdir))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    return out["job_id"], Path(out["job_dir"])


def wait_until_finished(job: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        done = hpcvod("status", "--json", job, cwd=cwd, env=env)
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        if status["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def one_error_line(code: int, err: str, *pieces: str) -> str:
    """The contract for bad input: exit status 2, one `hpcvod: error:` line holding each piece, no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hpcvod: error: ")
    for piece in pieces:
        assert piece in lines[0], lines[0]
    return lines[0]
