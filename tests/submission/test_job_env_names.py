"""Names --env and --secret-env may not set (issue 23, item 5): bash's own, the scheduler's and the launcher's,
hpcvod's contract; refused in one line, exit 2, before anything is written. What stays allowed, too."""

from __future__ import annotations

import pytest

from submission_helpers import NO_USER_CONFIG, golden_host, load_site
from hpcvod.jobs.plan import resolve
from hpcvod.jobs.spec import JobSpec
from hpcvod.sites import UserError

# (name, a piece of the reason)
REFUSED = [(name, "bash's own variable") for name in
           ("UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "BASH_ENV", "BASH_XTRACEFD", "IFS", "PS4", "ENV",
            "POSIXLY_CORRECT", "RANDOM", "SECONDS")] + \
          [(name, "the scheduler's or the MPI launcher's own variable") for name in
           ("SLURM_JOB_ID", "SLURM_NTASKS", "SRUN_CPUS_PER_TASK", "SBATCH_EXPORT", "PBS_NODEFILE", "PBS_O_WORKDIR",
            "SGE_TASK_ID", "JOB_ID", "PE_HOSTFILE", "NSLOTS", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
            "OMPI_COMM_WORLD_SIZE")] + \
          [(name, "set by hpcvod itself (docs/contract.md)") for name in
           ("HPCVOD_WORLD_SIZE", "HPCVOD_JOB_DIR", "HPCVOD_MPI_FLAVOUR", "HPCVOD_DATA_SERVICE_CONFIG")]
ALLOWED = ["PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "HOME", "TMPDIR", "OMP_NUM_THREADS",
           "PMIX_MCA_gds", "OMPI_MCA_btl", "HPCVOD_CYCLE_TIME", "HPCVOD_CHECKPOINT_DIR", "SLURMISH", "MY_UID"]


@pytest.fixture
def train(tmp_path):
    (tmp_path / "train.py").write_text("print('train')\n")


@pytest.mark.parametrize("name,why", REFUSED, ids=[n for n, _ in REFUSED])
@pytest.mark.parametrize("form", ["--env KEY=VALUE", "--env KEY", "--secret-env KEY"])
def test_a_reserved_name_is_refused_in_one_line(cli, train, tmp_path, monkeypatch, name, why, form):
    monkeypatch.setenv(name, "1")  # a bare KEY takes its value from here: set, so that only the name can be wrong
    flag = form.split()[0]
    given = f"{name}=1" if "=" in form else name
    code, out, err = cli("submit", "--site", "slurm-ib-openmpi", "--dry-run", flag, given, "train.py")
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{flag} {name}: {why}" in err and "choose another name" in err, err
    assert not (tmp_path / "hpcvod-jobs").exists()


@pytest.mark.parametrize("name", ["UID", "SLURM_JOB_ID", "PMIX_NAMESPACE", "HPCVOD_SITE"])
def test_the_python_api_refuses_them_too(name):
    site = load_site("slurm-ib-openmpi", environ=NO_USER_CONFIG)
    for spec in (JobSpec(program="train.py", env=((name, "1"),)), JobSpec(program="train.py", secret_env=(name,))):
        with pytest.raises(UserError, match=rf"^--(secret-)?env {name}: .*choose another name"):
            resolve(spec, site, golden_host())


@pytest.mark.parametrize("name", ALLOWED)
def test_the_user_s_own_names_pass(name):
    site = load_site("slurm-ib-openmpi", environ=NO_USER_CONFIG)
    plan = resolve(JobSpec(program="train.py", env=((name, "x"),)), site, golden_host())
    assert (name, "x") in dict(plan.env_groups)["--env"]
