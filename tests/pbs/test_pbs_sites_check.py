"""`hpcvod sites check` on PBS and Grid Engine without their servers (none in Debian or on PyPI for PBS; the SGE
sandbox's jobs sat in state `t` for minutes on this busy machine): the acceptance job the check renders for each
is read (its directives, its launcher line over the scheduler's host list, the check's worker and request), then its
body runs the way the scheduler would start it -- `bash job.pbs` with PBS_NODEFILE/PBS_O_WORKDIR, `bash job.sge` with
PE_HOSTFILE/SGE_O_WORKDIR -- and the check judges what the ranks wrote into a report as after a real job.

Not tested here, as in test_pbs_script_body.py: qsub/qstat against a server, more than one host."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvod.jobs import sitecheck
from hpcvod.schedulers import profile_options
from hpcvod.sites import load_site
from test_pbs_script_body import PROFILE, clean_env, run_like_pbs_mom, venv_or_skip

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "submission"))
from test_sites_check_units import decode_png  # noqa: E402 - the one PNG reader of the tests

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]


def write_check_job(tmp_path: Path, site_name_or_path: str, tasks: int, queue: str | None = None) -> tuple:
    """The check's job for one node x ``tasks`` ranks, written into a job folder as submit would."""
    site = load_site(site_name_or_path, schedulers=profile_options())
    request = dataclasses.replace(sitecheck.default_request(site, 1, None, queue, True, ()), tasks_per_node=tasks)
    prepared = sitecheck.prepare_check(site, request)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / prepared.script_name).write_text(prepared.script)
    return site, request, prepared, job_dir


def judged(site, request, job_dir: Path, tmp_path: Path, done: subprocess.CompletedProcess) -> dict:
    records, tail = sitecheck.read_records(job_dir, request.world_size, job_dir / "output.log")
    report = sitecheck.judge(site, request, tmp_path, job_dir, "4242", records,
                             "COMPLETED" if done.returncode == 0 else "FAILED", tail)
    got = {c["name"]: c["status"] for c in report["checks"]}
    for name in ("world.size", "world.layout", "world.nodes", "world.mpi_flavour", "env.setup", "env.profile_env",
                 "interconnect.mpi_transport", "links.intra_node", "links.allreduce"):
        assert got[name] == "pass", (name, report["checks"], done.stdout + done.stderr)
    assert report["exit_status"] == 0
    assert json.loads((job_dir / "report.json").read_text())["checks"] == report["checks"]
    assert "| world.size | PASS |" in (job_dir / "report.md").read_text()
    decode_png((job_dir / "bandwidth.png").read_bytes())
    return report


def test_pbs_check_job_renders_and_its_body_runs_as_pbs_would_start_it(tmp_path: Path) -> None:
    venv_or_skip("mpich")
    (tmp_path / "site.yaml").write_text(PROFILE)
    site, request, prepared, job_dir = write_check_job(tmp_path, str(tmp_path / "site.yaml"), tasks=4, queue="cpu")
    script = prepared.script
    assert prepared.script_name == "job.pbs"
    assert "#PBS -N sites-check\n#PBS -l select=1:ncpus=4:mpiprocs=4:ompthreads=1\n" in script
    assert "#PBS -l walltime=00:15:00\n#PBS -q cpu\n" in script
    assert 'export HPCVOD_JOB_DIR="${PBS_O_WORKDIR:-$PWD}"' in script
    launch = script.rstrip().splitlines()[-2:]
    assert launch[0].endswith('mpiexec -n 4 -ppn 4 -f "$PBS_NODEFILE" '
                              f'{sys.executable} -m hpcvod.launchers.label -- \\'), launch
    assert launch[1].strip().startswith(f"{sys.executable} {sitecheck.WORKER} '{{\"env_expect\": "), launch
    done = run_like_pbs_mom(job_dir, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = judged(site, request, job_dir, tmp_path, done)
    assert f"1 node(s): {socket.gethostname()}" in next(c["evidence"] for c in report["checks"]
                                                         if c["name"] == "world.nodes")
    assert report["links"]["world_size"] == 4 and [p["bytes"] for p in report["links"]["allreduce"]][-1] == 4 << 20


def test_sge_check_job_renders_and_its_body_runs_as_grid_engine_would_start_it(tmp_path: Path) -> None:
    venv_or_skip("mpich")
    site, request, prepared, job_dir = write_check_job(tmp_path, "sge-sandbox", tasks=2)
    script = prepared.script
    assert prepared.script_name == "job.sge"
    assert "#$ -N sites-check\n#$ -pe mpi 2\n#$ -l h_rt=00:15:00\n" in script
    assert "awk '{ for (i = 0; i < $2; i++) print $1 }' \"$PE_HOSTFILE\" > \"$HPCVOD_JOB_DIR/hostfile\"" in script
    assert f"mpiexec -n 2 -ppn 2 -f \"$HPCVOD_JOB_DIR/hostfile\" {sys.executable}" in script
    assert str(sitecheck.WORKER) in script
    # what sge_execd hands the job: the PE's host file ("host slots queue processors") and the submit folder
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_text(f"{socket.gethostname()} 2 all.q@{socket.gethostname()} UNDEFINED\n")
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(["bash", str(job_dir / "job.sge")], cwd=home, capture_output=True, text=True, timeout=150,
                          env=clean_env(PE_HOSTFILE=str(hostfile), SGE_O_WORKDIR=str(job_dir), JOB_ID="4242",
                                        JOB_NAME="sites-check", NSLOTS="2", HOME=str(home)))
    assert done.returncode == 0, done.stdout + done.stderr
    report = judged(site, request, job_dir, tmp_path, done)
    assert report["links"]["world_size"] == 2
