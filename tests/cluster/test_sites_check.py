"""`hpcvod sites check` on the real 2-node Slurm test cluster: every shipped sandbox profile passes (one job each,
messages up to 4 MiB), the report lands in the job folder with a valid PNG and is compared with the previous one,
and deliberately broken copies of the profile fail with their own reason each."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from cluster_helpers import REPO, Cluster, flavours, hpcvod, require_flavour, run

sys.path.insert(0, str(REPO / "tests" / "submission"))
from test_sites_check_units import decode_png  # noqa: E402 - the one PNG reader of the tests

pytestmark = [pytest.mark.cluster, pytest.mark.mpi, pytest.mark.timeout(300)]

SANDBOX = REPO / "hpcvod" / "site_configs" / "slurm-sandbox.yaml"


def check(tmp_path: Path, site: object, *more: str, venv: Path = REPO / ".venv") -> tuple[int, dict]:
    done = hpcvod("sites", "check", site, "--quick", "--json", "--output-dir", tmp_path / "jobs", *more,
                  cwd=tmp_path, venv=venv, timeout=240)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["exit_status"] == done.returncode
    return done.returncode, report


def statuses(report: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def evidence(report: dict, name: str) -> str:
    return next(c["evidence"] for c in report["checks"] if c["name"] == name)


def test_main_profile_passes_keeps_report_and_plot_and_compares_with_the_last_one(slurm_cluster: Cluster,
                                                                                   tmp_path: Path) -> None:
    # an earlier report of this site whose links were 10x faster: this run must say which link got slower
    earlier = tmp_path / "jobs" / "sites-check-earlier"
    earlier.mkdir(parents=True)
    (earlier / "report.json").write_text(json.dumps({"site": "slurm-sandbox", "finished": "2026-01-01T00:00:00",
                                                     "figures": {"inter_node.gbps": 1000.0}}))
    status, report = check(tmp_path, "slurm-sandbox")
    got = statuses(report)
    assert status == 0, report["checks"]
    for name in ("world.size", "world.layout", "world.nodes", "world.thread_level", "world.mpi_flavour",
                 "env.setup", "env.profile_env", "env.python", "interconnect.mpi_transport", "links.intra_node",
                 "links.inter_node", "links.allreduce"):
        assert got[name] == "pass", (name, report["checks"])
    assert "2 node(s): n1, n2" in evidence(report, "world.nodes")
    # read from the MPI's own report (MPICH's OFI netmod), the settings quoted beside it
    assert "between nodes: tcp, as the MPI reported: 'libfabric provider: tcp" in evidence(
        report, "interconnect.mpi_transport")
    assert got["interconnect.interfaces"] == got["env.container"] == "skip"
    assert got["interconnect.nccl"] == "skip"
    assert got["links.vs_previous"] == "warn" and "inter_node.gbps 1000.00 ->" in evidence(report, "links.vs_previous")
    job_dir = Path(report["job_dir"])
    assert "srun --mpi=pmi2" in (job_dir / "job.sbatch").read_text()   # the launcher line a user's job gets
    links = json.loads((job_dir / "links.json").read_text())           # written by rank 0 inside the job
    assert links["nodes"] == 2 and links["world_size"] == 4
    assert [p["bytes"] for p in links["allreduce"]][-1] == 4 << 20
    assert all(p["bus_gbps"] > 0 for p in links["allreduce"])
    assert "libfabric provider: tcp" in (job_dir / "sitecheck" / "0.mpi.log").read_text()
    width, height, _ = decode_png((job_dir / "bandwidth.png").read_bytes())
    assert width > 100 and height > 100
    md = (job_dir / "report.md").read_text()
    assert "| world.size | PASS | one world of 4 ranks" in md and "bandwidth.png" in md


@pytest.mark.parametrize("site,flavour_name", [("slurm-sandbox-openmpi", "openmpi"),
                                               ("slurm-sandbox-intelmpi", "impi"),
                                               ("slurm-sandbox-mpirun", "mpich")])
def test_every_other_sandbox_profile_passes(slurm_cluster: Cluster, tmp_path: Path, site: str,
                                            flavour_name: str) -> None:
    flavour = flavours()[flavour_name]
    require_flavour(flavour)
    status, report = check(tmp_path, site, venv=flavour.venv)
    assert status == 0, report["checks"]
    assert statuses(report)["world.size"] == "pass"
    # each wheel named its transport between the nodes itself (Open MPI: its tcp btl to a rank on n2 or n1)
    said = evidence(report, "interconnect.mpi_transport")
    assert said.startswith("between nodes: tcp, as the MPI reported: ") and "source: the MPI's own report" in said


def broken(tmp_path: Path, body: str, base: Path = SANDBOX) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text(f"extends: {base}\ndescription: a broken copy of {base.stem}\n{body}")
    return path


def test_wrong_mpi_plugin_is_refused_before_any_job(slurm_cluster: Cluster, tmp_path: Path) -> None:
    # srun --mpi=none starts every MPICH rank as a world of size 1. The profile's cross-checks (issue 25 item 3)
    # now refuse that pairing before a job is submitted; the one-rank worlds a job may still meet (a plugin the
    # profile cannot know about) are judged by world.size, covered in test_sites_check_units and test_world.
    done = hpcvod("sites", "check", broken(tmp_path, "launcher:\n  kind: srun\n  mpi_plugin: none\n"), "--quick",
                  "--json", "--output-dir", tmp_path / "jobs", cwd=tmp_path, timeout=240)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "launcher.mpi_plugin: 'none'" in lines[0] and "'pmi2'" in lines[0], done.stderr
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_flavour_that_does_not_match_the_venv_fails_world_mpi_flavour(slurm_cluster: Cluster,
                                                                        tmp_path: Path) -> None:
    status, report = check(tmp_path, broken(tmp_path, "mpi:\n  flavour: openmpi\nlauncher:\n  kind: srun\n"
                                                      "  mpi_plugin: pmix\n"))
    assert status == 1
    assert statuses(report)["world.mpi_flavour"] == "fail"
    assert "Open MPI" in evidence(report, "world.mpi_flavour") and "MPICH" in evidence(report, "world.mpi_flavour")


@pytest.mark.parametrize("body, said", [
    ("setup:\n  - source /nonexistent/site-env.sh\n", "/nonexistent/site-env.sh: No such file or directory"),
    # the sandbox nodes have no environment modules: `module load` is the line that stops the job
    ("modules:\n  - nosuch/1.0\n", "module"),
], ids=["setup", "module"])
def test_setup_or_module_line_that_fails_is_named(slurm_cluster: Cluster, tmp_path: Path, body: str,
                                                  said: str) -> None:
    status, report = check(tmp_path, broken(tmp_path, body))
    assert status == 1
    assert statuses(report)["env.setup"] == "fail"
    assert said in evidence(report, "env.setup").split("last output:")[1]


def test_a_profile_saying_infiniband_while_the_mpi_reports_tcp_fails(slurm_cluster: Cluster, tmp_path: Path) -> None:
    # Intel MPI on the sandbox: no setting names a transport; the library itself picks libfabric's tcp provider
    flavour = flavours()["impi"]
    require_flavour(flavour)
    base = SANDBOX.with_name("slurm-sandbox-intelmpi.yaml")
    status, report = check(tmp_path, broken(tmp_path, "interconnect:\n  kind: infiniband\n", base=base),
                           venv=flavour.venv)
    assert status == 1
    assert statuses(report)["world.size"] == "pass"
    assert statuses(report)["interconnect.mpi_transport"] == "fail"
    said = evidence(report, "interconnect.mpi_transport")
    assert "says infiniband but the MPI reported TCP for traffic between nodes: 'libfabric provider: tcp'" in said
    assert "settings: no transport variables set" in said


def test_a_socket_ifname_that_no_node_has_fails_naming_it_and_the_nodes(slurm_cluster: Cluster,
                                                                          tmp_path: Path) -> None:
    status, report = check(tmp_path, broken(tmp_path, "interconnect:\n  kind: ethernet\n  socket_ifname: ib0\n"))
    assert status == 1
    got = statuses(report)
    assert got["world.size"] == got["interconnect.mpi_transport"] == "pass"   # NCCL's setting: MPI runs anyway
    assert got["interconnect.interfaces"] == "fail"
    said = evidence(report, "interconnect.interfaces")
    assert said.startswith("NCCL_SOCKET_IFNAME=ib0 (interconnect.socket_ifname): no ib0 on n1, n2 (n1 has "
                           "interfaces: "), said
    assert "eth0" in said.split("n1 has interfaces:")[1] or "lo" in said.split("n1 has interfaces:")[1]


def test_a_job_that_does_not_end_within_timeout_is_cancelled_and_fails(slurm_cluster: Cluster,
                                                                        tmp_path: Path) -> None:
    # held by Slurm for an hour: it cannot start within the 5 s given
    status, report = check(tmp_path, broken(tmp_path, "directives:\n  extra:\n    - --begin=now+1hour\n"),
                           "--timeout", "5")
    assert status == 1
    assert statuses(report) == {"job.time": "fail"}
    assert "did not end within --timeout 5 s (it was PENDING); cancelled" in evidence(report, "job.time")
    job_dir = Path(report["job_dir"])
    assert json.loads((job_dir / "report.json").read_text())["state"] == "CANCELLED"
    assert "| job.time | FAIL |" in (job_dir / "report.md").read_text()
    queued = run(["squeue", "-h", "-j", report["job_id"], "-o", "%T"], timeout=30).stdout.strip()
    assert queued in ("", "CANCELLED"), queued


def test_an_mpi_interface_no_node_has_is_named_though_the_mpi_aborts_the_ranks(slurm_cluster: Cluster,
                                                                                 tmp_path: Path) -> None:
    # MPICH's OFI tcp provider told to use ib0: MPI_Init aborts each process (no Python exception); the early
    # record each rank wrote before starting MPI and its MPI log are the evidence
    status, report = check(tmp_path, broken(tmp_path, "mpi:\n  env:\n    FI_TCP_IFACE: ib0\n"), "--timeout", "150")
    assert status == 1
    got = statuses(report)
    assert got["world.size"] == got["interconnect.interfaces"] == "fail"
    # each node either said it has no ib0 or its rank was ended (srun kills the step once one rank aborts) before
    # it looked: both are named, none is passed off as checked
    said = evidence(report, "interconnect.interfaces")
    named = re.match(r"FI_TCP_IFACE=ib0: no ib0 on ((?:n\d, )*n\d) \((n\d) has interfaces: ", said)
    assert named, said
    nodes = named.group(1).split(", ")
    unseen = re.search(r"; ranks? ([\d, ]+) ended before recording (?:its|their) interfaces$", said)
    per_node = report["request"]["tasks_per_node"]   # srun's block layout: rank r on node r // per_node
    unseen_nodes = {f"n{int(rank) // per_node + 1}" for rank in (unseen.group(1).split(", ") if unseen else [])}
    assert set(nodes) <= {"n1", "n2"} and set(nodes) | unseen_nodes == {"n1", "n2"}, said
    said = evidence(report, "world.size")
    assert "ended inside the MPI without a Python error; " in said and ".mpi.log ends: " in said
    assert "OFI" in said, said
