"""`hpcvod doctor` reports the real MPI, mpi4py and frameworks of the venv it runs from."""

from __future__ import annotations

import re

import pytest

from submission_helpers import hpcvod

pytestmark = pytest.mark.timeout(400)


def test_doctor_in_the_main_venv(tmp_path):
    done = hpcvod("doctor", cwd=tmp_path, timeout=380)
    assert done.returncode == 0, done.stderr + done.stdout
    out = done.stdout
    assert re.search(r"^MPI launcher\s+ok\s+\S+/mpiexec: mpich \(", out, re.M), out
    assert re.search(r"^mpi4py\s+ok\s+mpi4py \d+\.\d+.*MPICH.*thread level multiple", out, re.M), out
    assert re.search(r"^torch\s+ok\s+torch 2\.13", out, re.M), out
    assert re.search(r"^tensorflow\s+ok\s+tensorflow 2\.21", out, re.M), out
    assert re.search(r"^mxnet\s+ok\s+mxnet 1\.9\.1", out, re.M), out
    assert re.search(r"^NCCL \(CuPy\)\s+(ok|--)\s+", out, re.M), out  # optional: no GPU on most test machines
    assert re.search(r"^site\s+ok\s+local ", out, re.M), out
    # the comparison `submit` makes (tests/submission/test_job_mpi.py has the failing one)
    assert re.search(r"^job's MPI\s+ok\s+site local launches MPICH; the job's Python \S+ loads MPICH", out, re.M), out


def test_doctor_says_ok_only_for_what_it_checked(tmp_path):
    """The job's-MPI row: "ok" when the job Python's MPI was seen and agrees, "--" with the reason when it could
    not be compared here (modules or setup lines decide it on the nodes, or the Python loads no MPI)."""
    from hpcvod.cli.doctor import site_job_mpi
    from hpcvod.schedulers import profile_options
    from hpcvod.sites import load_site

    local = load_site("local", schedulers=profile_options())
    state, text = site_job_mpi(local)
    assert state == "ok" and "the job's Python" in text and "loads MPICH" in text, text
    (tmp_path / "modules.yaml").write_text("extends: local\nmodules: [mpi/openmpi-5]\n")
    state, text = site_job_mpi(load_site(str(tmp_path / "modules.yaml"), schedulers=profile_options()))
    assert (state, text.split("; ", 1)[1]) == ("--", "not checked here: the site's modules/setup lines decide it "
                                                      "on the nodes")
    (tmp_path / "nompi.yaml").write_text("extends: local\nenv:\n  MPI4PY_LIBMPI: /nonexistent/libmpi.so\n")
    state, text = site_job_mpi(load_site(str(tmp_path / "nompi.yaml"), schedulers=profile_options()))
    assert state == "--" and "loads no MPI" in text, (state, text)
