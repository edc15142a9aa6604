"""The container tests' image and profiles (docs/containers.md).

`container_image` builds, once per machine, the folder image that `hpcvod image --build` makes for the site of the
tests (debootstrap + ch-run, the MPICH wheel, mpi4py, torch from this machine's pip sources, hpcvod): no image
registry. It lives under ~/.cache/hpcvod-tests/container-image (HPCVOD_TEST_IMAGE_DIR): a later session rebuilds
only hpcvod's own layer (seconds). debootstrap and ch-run come from Debian's packages, installed here when missing
and root with apt-get (as scripts/slurm-sandbox.sh does its own); without them the tests skip, or fail in CI
(HPCVOD_REQUIRE_CLUSTER=1). The Slurm cluster is tests/cluster's `slurm_cluster`, shared with those tests.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CLUSTER_TESTS = Path(__file__).resolve().parents[1] / "cluster"
sys.path.insert(0, str(CLUSTER_TESTS))

from cluster_helpers import hpcvod  # noqa: E402
from container_helpers import MOUNT_TARGET, container_profile  # noqa: E402

_cluster_conftest_spec = importlib.util.spec_from_file_location("cluster_conftest_for_containers",
                                                                CLUSTER_TESTS / "conftest.py")
_cluster_conftest = importlib.util.module_from_spec(_cluster_conftest_spec)
_cluster_conftest_spec.loader.exec_module(_cluster_conftest)
slurm_cluster = _cluster_conftest.slurm_cluster
cancel_leftover_jobs = _cluster_conftest.cancel_leftover_jobs

PACKAGES = {"ch-run": "charliecloud-runtime", "debootstrap": "debootstrap"}


def _tools_missing() -> str | None:
    """Why ch-run/debootstrap cannot be had here, after installing them with apt-get where possible."""
    missing = [tool for tool in PACKAGES if shutil.which(tool) is None]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        packages = [PACKAGES[t] for t in missing]
        done = subprocess.run(["apt-get", "install", "-y", "-qq", *packages], capture_output=True, text=True,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=600)
        if done.returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=300)
            subprocess.run(["apt-get", "install", "-y", "-qq", *packages], capture_output=True, timeout=600,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        missing = [tool for tool in PACKAGES if shutil.which(tool) is None]
    return f"no {', '.join(missing)} (Debian: apt-get install {' '.join(PACKAGES[t] for t in missing)})" \
        if missing else None


@pytest.fixture(scope="session")
def container_image() -> Path:
    reason = _tools_missing()
    if reason is not None:
        if os.environ.get("HPCVOD_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"HPCVOD_REQUIRE_CLUSTER=1 but the container tests cannot run here: {reason}", pytrace=False)
        pytest.skip(f"container image cannot be built here: {reason}")
    cache = Path(os.environ.get("HPCVOD_TEST_IMAGE_DIR", Path.home() / ".cache" / "hpcvod-tests" / "container-image"))
    cache.mkdir(parents=True, exist_ok=True)
    # the image's site: the sandbox's MPICH + srun --mpi=pmi2 (the local site's mpiexec is the same MPICH wheel)
    profile = container_profile(cache, "containers-test", "slurm-sandbox", mounts=[f"/tmp:{MOUNT_TARGET}"])
    built = hpcvod("image", "--site", profile, "-o", cache, "--framework", "torch", "--download", "--build",
                   cwd=cache, timeout=1500, env={"USER": os.environ.get("USER") or "root"})
    assert built.returncode == 0, f"hpcvod image --build failed:\n{built.stdout}\n{built.stderr}"
    image = cache / "image"
    assert (image / "etc" / "hpcvod-image.json").is_file(), built.stderr
    return image


@pytest.fixture
def user_env() -> dict[str, str]:
    """ch-run needs $USER, which a CI container may lack."""
    return {"USER": os.environ.get("USER") or "root"}


__all__ = ["slurm_cluster", "cancel_leftover_jobs"]
