"""The real Slurm cluster of the test run (scripts/slurm-sandbox.sh), shared by every test in tests/cluster.

The session fixture `slurm_cluster` reuses a sandbox that is already up with >= 2 nodes, or starts one with
2 nodes and stops it at the end of the session (set HPCVOD_SANDBOX_KEEP=1 to leave it running for the next
run). On a machine that cannot run it (not root, no apt, no namespaces) the tests are skipped, or FAIL when
HPCVOD_REQUIRE_CLUSTER=1 (CI sets it: a skipped cluster test must never pass for a green run).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Iterator

import pytest

from cluster_helpers import NODES_WANTED, SANDBOX_SCRIPT, Cluster, run, unavailable_reason


def _sandbox_dir() -> Path:
    return Path(os.environ.get("HPCVOD_SANDBOX_DIR", "/tmp/hpcvod-slurm-sandbox"))


def _running_nodes() -> int:
    """Node count of a healthy running sandbox, 0 when none runs."""
    status = run([SANDBOX_SCRIPT, "status"], env=dict(os.environ), timeout=60)
    if status.returncode != 0:
        return 0
    m = re.search(r"nodes=(\d+)", status.stdout)
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("HPCVOD_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"HPCVOD_REQUIRE_CLUSTER=1 but the Slurm test cluster cannot run here: {reason}",
                        pytrace=False)
        pytest.skip(f"Slurm test cluster unavailable: {reason}")

    t0 = time.monotonic()
    nodes = _running_nodes()
    started_here = False
    if nodes < NODES_WANTED:
        # with slurmdbd unless told otherwise: the tests check hpcvod against real accounting too (+~15 s)
        up = run([SANDBOX_SCRIPT, "up", str(NODES_WANTED)], timeout=900,
                 env={"HPCVOD_SANDBOX_ACCOUNTING": "1", **os.environ})
        if up.returncode != 0:
            pytest.fail(f"scripts/slurm-sandbox.sh up {NODES_WANTED} failed (exit {up.returncode}):\n"
                        f"{up.stdout}\n{up.stderr}", pytrace=False)
        started_here = True
        nodes = NODES_WANTED
    settings = (_sandbox_dir() / "sandbox.settings").read_text()
    cluster = Cluster(base=_sandbox_dir(), nodes=[f"n{i}" for i in range(1, nodes + 1)],
                      accounting="accounting=1" in settings, started_here=started_here,
                      start_seconds=time.monotonic() - t0)
    try:
        yield cluster
    finally:
        if started_here and os.environ.get("HPCVOD_SANDBOX_KEEP") != "1":
            down = run([SANDBOX_SCRIPT, "down"], env=dict(os.environ), timeout=300)
            if down.returncode != 0:
                raise AssertionError(f"scripts/slurm-sandbox.sh down failed:\n{down.stdout}\n{down.stderr}")



@pytest.fixture(autouse=True)
def cancel_leftover_jobs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """A failing test must not leave jobs that hold the nodes for the next ones: after each Slurm test, cancel
    the jobs still queued or running whose working directory is inside that test's tmp_path."""
    yield
    if "slurm_cluster" not in request.fixturenames:
        return
    queued = run(["squeue", "-h", "-o", "%i %Z"], timeout=30).stdout.split("\n")
    mine = [line.split(" ", 1)[0] for line in queued
            if " " in line and Path(line.split(" ", 1)[1]).is_relative_to(tmp_path)]
    if mine:
        run(["scancel", *mine], timeout=30)


SGE_SCRIPT = SANDBOX_SCRIPT.parent / "sge-sandbox.sh"


@pytest.fixture(scope="session")
def sge_cluster() -> Iterator[None]:
    """Grid Engine on this machine (scripts/sge-sandbox.sh): reused when up, else started and stopped at the end."""
    reason = unavailable_reason(need="qsub")
    if reason is not None:
        if os.environ.get("HPCVOD_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"HPCVOD_REQUIRE_CLUSTER=1 but Grid Engine cannot run here: {reason}", pytrace=False)
        pytest.skip(f"Grid Engine sandbox unavailable: {reason}")
    started_here = False
    if run([SGE_SCRIPT, "status"], env=dict(os.environ), timeout=60).returncode != 0:
        up = run([SGE_SCRIPT, "up"], env=dict(os.environ), timeout=900)
        if up.returncode != 0:
            pytest.fail(f"scripts/sge-sandbox.sh up failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}",
                        pytrace=False)
        started_here = True
    try:
        yield
    finally:
        if started_here and os.environ.get("HPCVOD_SANDBOX_KEEP") != "1":
            down = run([SGE_SCRIPT, "down"], env=dict(os.environ), timeout=300)
            if down.returncode != 0:
                raise AssertionError(f"scripts/sge-sandbox.sh down failed:\n{down.stdout}\n{down.stderr}")
