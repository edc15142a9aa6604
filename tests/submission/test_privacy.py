"""Issue 16, "Let no one in": job folders are private whatever the umask, shared with the group only when asked,
and secrets given as `--env KEY` / `--secret-env KEY` reach the job without ever being written."""

from __future__ import annotations

import grp
import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from hpcvod.jobs.jobdir import REQUEST_FILE
from hpcvod.jobs.plan import resolve
from hpcvod.jobs.render import render
from hpcvod.jobs.spec import JobSpec
from hpcvod.machine.host import detect_host
from hpcvod.schedulers import scheduler_for
from hpcvod.schedulers.base import EXIT_FILE, OUTPUT_FILE
from submission_helpers import NO_USER_CONFIG, clean_env, golden_host, hpcvod, load_site, one_error_line

pytestmark = pytest.mark.timeout(300)

PEER, MATE, GROUP = "hpcvodpeer", "hpcvodmate", "hpcvodshare"  # a stranger, and a member of the job's group

SECRET_JOB = """
import os, sys
value = os.environ.get("MY_TOKEN", "")
ok = len(value) == int(sys.argv[1]) and value.startswith("s3cr3t-")  # the length is no secret: the value is
print("token length", len(value), "OK" if ok else "MISMATCH", flush=True)
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode) & 0o777


@pytest.fixture
def umask022():
    old = os.umask(0o022)  # the usual login umask: without the fix, everything would be world-readable
    yield
    os.umask(old)


@pytest.fixture
def workdir(umask022):
    """A folder every user can enter (not pytest's tmp_path, which is private to root): what keeps others out
    must be the job folder itself."""
    path = Path(tempfile.mkdtemp(prefix="hpcvod-privacy-"))
    path.chmod(0o755)
    (path / "secret_job.py").write_text(SECRET_JOB)
    (path / "hello.py").write_text("print('hello', flush=True)\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _ensure_user(name: str, groups: str = "") -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        argv = ["useradd", "--no-create-home", "--shell", "/bin/sh", *(["-G", groups] if groups else []), name]
        try:
            done = subprocess.run(argv, capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip("useradd is not installed: cannot create a second user to check what others can read")
        if done.returncode != 0:
            pytest.skip(f"useradd {name} failed ({done.stderr.strip()}): cannot check what another user can read")


@pytest.fixture(scope="module")
def users():
    if os.geteuid() != 0:
        pytest.skip("creating a second user needs root (useradd)")
    if shutil.which("runuser") is None:
        pytest.skip("runuser is not installed: cannot run commands as a second user")
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        done = subprocess.run(["groupadd", GROUP], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"groupadd {GROUP} failed ({done.stderr.strip()})")
    _ensure_user(PEER)
    _ensure_user(MATE, GROUP)
    return PEER, MATE


def _as(user: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True)


def _denied(user: str, *argv: str) -> None:
    done = _as(user, *argv)
    assert done.returncode != 0 and "Permission denied" in done.stderr, (argv, done.stdout, done.stderr)


def _submit(workdir: Path, *args: str, env: dict | None = None) -> Path:
    done = hpcvod("submit", "--site", "local", "--tasks-per-node", "1", "--wait", "--json", "--output-dir",
                  str(workdir / "jobs"), *args, cwd=workdir, env=env or clean_env(workdir))
    assert done.returncode == 0, done.stderr
    return Path(json.loads(done.stdout)["job_dir"])


def _files(job_dir: Path) -> dict[str, int]:
    return {p.name: _mode(p) for p in job_dir.iterdir()}


@pytest.mark.mpi
def test_private_by_default_whatever_the_umask(workdir, users):
    job_dir = _submit(workdir, "hello.py")
    root = workdir / "jobs"
    assert _mode(root) == 0o700  # created by this submit
    assert _mode(job_dir) == 0o700
    files = _files(job_dir)
    assert {"job.sh", REQUEST_FILE, "job.json", OUTPUT_FILE, EXIT_FILE} <= set(files), files
    assert files.pop("job.sh") == 0o700
    assert set(files.values()) == {0o600}, files  # output.log and exitcode too (the script's umask 077)
    assert "umask 077" in (job_dir / "job.sh").read_text()
    # the mark cancel leaves (on a job still running: one that has ended keeps its end, and gets none): private too
    (workdir / "sleepy.py").write_text("import time\ntime.sleep(300)\n")
    done = hpcvod("submit", "--site", "local", "--tasks-per-node", "1", "--json", "--output-dir", str(root),
                  "sleepy.py", cwd=workdir, env=clean_env(workdir))
    assert done.returncode == 0, done.stderr
    running = Path(json.loads(done.stdout)["job_dir"])
    done = hpcvod("cancel", str(running), cwd=workdir, env=clean_env(workdir))
    assert done.returncode == 0 and "cancel requested" in done.stdout, done.stdout + done.stderr
    assert _mode(running / "cancelled") == 0o600

    # another user: the root keeps them out; opened up by hand, the job folder still does
    peer = users[0]
    _denied(peer, "ls", str(root))
    root.chmod(0o755)
    _denied(peer, "ls", str(job_dir))
    for name in ("job.sh", REQUEST_FILE, OUTPUT_FILE):
        _denied(peer, "cat", str(job_dir / name))


@pytest.mark.mpi
def test_an_existing_root_keeps_its_mode(workdir, users):
    root = workdir / "jobs"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    job_dir = _submit(workdir, "hello.py")
    assert _mode(root) == 0o755
    assert _mode(job_dir) == 0o700
    _denied(users[0], "ls", str(job_dir))
    _denied(users[0], "cat", str(job_dir / "job.sh"))


@pytest.mark.mpi
def test_shared_job_dir_is_for_the_group_never_for_others(workdir, users):
    peer, mate = users
    root = workdir / "jobs"
    root.mkdir()
    shutil.chown(root, group=GROUP)
    root.chmod(0o2755)  # a group's project folder: what is made inside belongs to the group
    job_dir = _submit(workdir, "--shared-job-dir", "hello.py")
    assert _mode(root) == 0o755 and os.stat(root).st_mode & stat.S_ISGID  # existing: kept as it was
    assert _mode(job_dir) == 0o750
    files = _files(job_dir)
    assert files.pop("job.sh") == 0o750
    assert set(files.values()) == {0o640}, files
    assert "umask 027" in (job_dir / "job.sh").read_text()
    # a member of the group reads the job; anyone else is kept out of the folder
    assert _as(mate, "ls", str(job_dir)).returncode == 0
    for name in ("job.sh", REQUEST_FILE, OUTPUT_FILE):
        done = _as(mate, "cat", str(job_dir / name))
        assert done.returncode == 0, done.stderr
    _denied(peer, "ls", str(job_dir))
    _denied(peer, "cat", str(job_dir / OUTPUT_FILE))


def test_site_profile_shares_job_folders(tmp_path):
    local = (Path(__file__).resolve().parents[2] / "hpcvod" / "site_configs" / "local.yaml").read_text()
    profile = tmp_path / "groupsite.yaml"
    profile.write_text(local + "\njobs:\n  shared_with_group: true\n")
    (tmp_path / "train.py").write_text("")
    site = load_site(str(profile), environ=NO_USER_CONFIG)
    host = detect_host()
    shared = resolve(JobSpec(program=str(tmp_path / "train.py")), site, host)
    assert shared.shared_job_dir and "umask 027" in render(shared, "local.j2")
    private = resolve(JobSpec(program=str(tmp_path / "train.py"), shared_job_dir=False), site, host)
    assert not private.shared_job_dir and "umask 077" in render(private, "local.j2")


# ---- secrets -------------------------------------------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.parametrize("flag", ["--env", "--secret-env"])
def test_secret_reaches_the_job_and_is_written_nowhere(workdir, flag):
    value = f"s3cr3t-{secrets.token_hex(8)}"
    env = clean_env(workdir, MY_TOKEN=value)
    job_dir = _submit(workdir, flag, "MY_TOKEN", "secret_job.py", str(len(value)), env=env)
    output = (job_dir / OUTPUT_FILE).read_text()
    assert f"token length {len(value)} OK" in output, output
    found = subprocess.run(["grep", "-r", "-l", "--", value, str(job_dir)], capture_output=True, text=True)
    assert found.returncode == 1 and not found.stdout, f"the secret was written to {found.stdout}"
    request = json.loads((job_dir / REQUEST_FILE).read_text())
    assert request["secret_env"] == ["MY_TOKEN"]
    assert "MY_TOKEN" in request["command"] and value not in json.dumps(request)
    script = (job_dir / "job.sh").read_text()
    assert "MY_TOKEN" in script and value not in script


def test_secret_not_set_is_one_line_exit_2_nothing_written(cli, tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("")
    monkeypatch.delenv("MY_TOKEN", raising=False)
    for verb in ("--dry-run", None):
        code, _, err = cli("submit", *([verb] if verb else []), "--site", "local", "--output-dir", "jobs",
                           "--secret-env", "MY_TOKEN", "train.py")
        one_error_line(code, err, "--env MY_TOKEN: not set in this environment")
    assert not (tmp_path / "jobs").exists()
    code, _, err = cli("submit", "--dry-run", "--site", "local", "--env", "NOT-A-NAME", "train.py")
    one_error_line(code, err, "--env 'NOT-A-NAME': expected KEY")
    monkeypatch.setenv("MY_TOKEN", "x")
    code, _, err = cli("submit", "--dry-run", "--site", "local", "--env", "MY_TOKEN=1", "--env", "MY_TOKEN",
                       "train.py")
    one_error_line(code, err, "--env MY_TOKEN: given both as KEY=VALUE and as a secret KEY")
    monkeypatch.setenv("NCCL_IB_DISABLE", "x")
    code, _, err = cli("submit", "--dry-run", "--site", "local", "--secret-env", "NCCL_IB_DISABLE", "train.py")
    one_error_line(code, err, "--env NCCL_IB_DISABLE: site 'local' sets it in the script already")


def test_render_and_dry_run_show_the_name_only(cli, tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("")
    value = f"s3cr3t-{secrets.token_hex(8)}"
    monkeypatch.setenv("MY_TOKEN", value)
    for command in (("render",), ("submit", "--dry-run"), ("submit", "--dry-run", "--json")):
        code, out, err = cli(*command, "--site", "slurm-sandbox-openmpi", "--env", "MY_TOKEN", "--env",
                             "PLAIN=visible", "train.py")
        assert code == 0, err
        assert "MY_TOKEN" in out and value not in out and value not in err
        assert "PLAIN" in out and "visible" in out  # KEY=VALUE is the explicit, written form, as before


FAKE = """#!/bin/sh
{ printf '%s\\n' "$0" "$@"; echo "ENV MY_TOKEN=$MY_TOKEN"; } > "$FAKE_RECORD"
echo "{answer}"
"""


@pytest.mark.parametrize("site_name,command,answer,argv_tail", [
    ("slurm-sandbox-openmpi", "sbatch", "4242", ["--parsable", "--export=ALL", "job.sbatch"]),
    ("pbs-ib-openmpi", "qsub", "4242.pbs1", ["-v", "MY_TOKEN", "job.pbs"]),
    ("sge-sandbox", "qsub", "4242", ["-terse", "-v", "MY_TOKEN", "job.sge"]),
])
def test_scheduler_gets_the_name_in_argv_and_the_value_in_its_environment(tmp_path, monkeypatch, golden_workdir,
                                                                            umask022, site_name, command, answer,
                                                                            argv_tail):
    from hpcvod.jobs.submission import prepare, submit_prepared

    value = f"s3cr3t-{secrets.token_hex(8)}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / command
    fake.write_text(FAKE.replace("{answer}", answer))
    fake.chmod(0o755)
    record = tmp_path / "record.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_RECORD", str(record))
    monkeypatch.setenv("MY_TOKEN", value)
    monkeypatch.chdir(tmp_path)
    site = load_site(site_name, environ=NO_USER_CONFIG)
    scheduler = scheduler_for(site)
    assert scheduler.submit_argv(scheduler.script_name, ["MY_TOKEN"]) == [command, *argv_tail]
    prepared = prepare(JobSpec(program="train.py", secret_env=("MY_TOKEN",)), site, golden_host(flavour="openmpi"),
                       command=("hpcvod", "submit", "--env", "MY_TOKEN", "train.py"))
    ref = submit_prepared(prepared, tmp_path / "jobs")
    lines = record.read_text().splitlines()
    assert lines[1:-1] == argv_tail  # the name, never the value, on the command line
    assert lines[-1] == f"ENV MY_TOKEN={value}"  # the value in the scheduler command's environment
    script = (ref.job_dir / scheduler.script_name).read_text()
    assert "MY_TOKEN" in script and value not in script
    plan = prepared.plan
    if plan.launcher == "openmpi" and "-x" in plan.launch_argv:
        assert "MY_TOKEN" in plan.launch_argv  # mpirun forwards it to the ranks by name
    found = subprocess.run(["grep", "-r", "-l", "--", value, str(ref.job_dir)], capture_output=True, text=True)
    assert found.returncode == 1, f"the secret was written to {found.stdout}"
    assert _mode(ref.job_dir) == 0o700 and _mode(ref.job_dir / scheduler.script_name) == 0o700


def test_python_api_takes_secret_env_and_shared_job_dir(tmp_path, monkeypatch):
    from hpcvod.jobs.python_api import HpcvodExecutor

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    executor = HpcvodExecutor(folder=tmp_path / "jobs", site="local", secret_env=["MY_TOKEN"], shared_job_dir=True)
    spec = executor._spec()
    assert spec.secret_env == ("MY_TOKEN",) and spec.shared_job_dir is True
    monkeypatch.setenv("MY_TOKEN", "s3cr3t-api")
    plan = executor._prepared().plan
    assert plan.secret_env == ("MY_TOKEN",) and plan.shared_job_dir
    assert "s3cr3t-api" not in executor._prepared().script
    with pytest.raises(Exception, match="secret_env: expected a list of variable names"):
        HpcvodExecutor(folder=tmp_path / "jobs", site="local", secret_env="MY_TOKEN")._spec()


@pytest.mark.parametrize("directive,expected", [
    (None, "--export=ALL"),
    ("--export=ALL", "--export=ALL"),
    ("--export=ALL,FOO=1", "--export=ALL,FOO=1"),
    ("--export=NONE", "--export=MY_TOKEN"),  # only SLURM_* variables, and the secret
    ("--export=PATH,HOME", "--export=PATH,HOME,MY_TOKEN"),
])
def test_slurm_export_keeps_what_the_script_asks_and_adds_the_secret_names(tmp_path, directive, expected):
    from hpcvod.schedulers.slurm import SlurmScheduler, script_export

    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n# Generated by hpcvod\n#SBATCH --nodes=1\n"
                      + (f"#SBATCH {directive}\n" if directive else "") + "\nexport X=1\n#SBATCH --export=LATE\n")
    argv = SlurmScheduler().submit_argv(script.name, ["MY_TOKEN"], script_export(script))
    assert argv == ["sbatch", "--parsable", expected, "job.sbatch"]
    assert SlurmScheduler().submit_argv(script.name, [], script_export(script)) == ["sbatch", "--parsable",
                                                                                    "job.sbatch"]


@pytest.mark.mpi
def test_python_api_job_folder_and_pickles_are_private(tmp_path, umask022):
    import hpcvod.jobs

    def world_size():  # defined here: pickled by value (the job cannot import this test module)
        import os

        return int(os.environ["HPCVOD_WORLD_SIZE"])

    job = hpcvod.jobs.submit(world_size, site="local", tasks_per_node=1, folder=tmp_path / "jobs")
    assert job.result() == 1
    assert _mode(tmp_path / "jobs") == 0o700 and _mode(job.job_dir) == 0o700
    files = _files(job.job_dir)
    assert f"{job.job_id}_submitted.pkl" in files and f"{job.job_id}_0_result.pkl" in files, files
    assert files.pop("job.sh") == 0o700
    assert set(files.values()) == {0o600}, files
    assert os.umask(0o022) == 0o022  # the caller's umask is back


def test_render_o_writes_an_owner_only_script(cli, tmp_path, umask022):
    (tmp_path / "train.py").write_text("")
    code, _, err = cli("render", "--site", "slurm-sandbox", "-o", "job.sbatch", "train.py")
    assert code == 0, err
    assert _mode(tmp_path / "job.sbatch") == 0o700
    code, _, err = cli("render", "--site", "slurm-sandbox", "--shared-job-dir", "-o", "shared.sbatch", "train.py")
    assert code == 0, err
    assert _mode(tmp_path / "shared.sbatch") == 0o750 and "umask 027" in (tmp_path / "shared.sbatch").read_text()
