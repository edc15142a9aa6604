"""Ranks in real containers (issue 26 part 1): `hpcvod submit` with container.runtime charliecloud starts each
rank in `ch-run` with the launcher on the host (mpiexec on the local site, `srun --mpi=pmi2` on the 2-node Slurm
sandbox), the launcher's PMI reaching the rank inside; the image is the one `hpcvod image --build` makes
(conftest.py). Each rank reports the world it joined, an allreduce, a torch model it trained, the bind mount."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cluster_helpers import Cluster, hpcvod, submitted
from container_helpers import MOUNT_TARGET, container_profile

WORKER = Path(__file__).resolve().parent / "workers" / "container_train.py"
pytestmark = [pytest.mark.mpi, pytest.mark.frameworks, pytest.mark.timeout(1800)]


def _results(output: str) -> list[dict]:
    return sorted((json.loads(m.group(1)) for m in re.finditer(r"RESULT (\{.*\})", output)), key=lambda r: r["rank"])


def _check_world(results: list[dict], size: int, data: str) -> None:
    assert [r["rank"] for r in results] == list(range(size)), results
    for r in results:
        assert r["size"] == size
        assert r["allreduce"] == size * (size + 1) / 2
        assert r["python"] == "/opt/hpcvod/bin/python"  # the image's Python, not this machine's venv
        assert r["label"]["mpi_flavour"] == "mpich" and r["label"]["mpi_wheel"].startswith("mpich==")
        assert r["os"].startswith("Debian GNU/Linux 12"), r["os"]
        assert r["data"] == data  # the site's bind mount reached the rank
        assert r["last_loss"] < r["first_loss"] / 4, (r["first_loss"], r["last_loss"])
    assert len({r["weights"] for r in results}) == 1, "the ranks' models differ after training"


def _prepare(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "data").mkdir()
    secret = f"bound into the container from {tmp_path}"
    (tmp_path / "data" / "note.txt").write_text(secret)
    (tmp_path / "train.py").write_text(WORKER.read_text())
    return tmp_path / "data", secret


def test_two_ranks_in_charliecloud_on_the_local_site(container_image: Path, tmp_path: Path,
                                                      user_env: dict[str, str]) -> None:
    data, secret = _prepare(tmp_path)
    profile = container_profile(tmp_path, "local-ch", "local", mounts=[f"{data}:{MOUNT_TARGET}"])
    done = hpcvod("submit", "--site", profile, "--container", container_image, "--tasks-per-node", "2",
                  "--env", f"CONTAINER_TEST_DATA={MOUNT_TARGET}/note.txt", "--wait", "train.py",
                  cwd=tmp_path, timeout=600, env=user_env)
    _, job_dir = submitted(done)
    output = (job_dir / "output.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr + output
    assert f"ch-run -c {tmp_path} -b {data}:{MOUNT_TARGET} {container_image} -- " in (job_dir / "job.sh").read_text()
    _check_world(_results(output), 2, secret)


@pytest.mark.cluster
def test_four_ranks_in_charliecloud_under_srun_on_two_nodes(container_image: Path, slurm_cluster: Cluster,
                                                             tmp_path: Path, user_env: dict[str, str]) -> None:
    data, secret = _prepare(tmp_path)
    profile = container_profile(tmp_path, "sandbox-ch", "slurm-sandbox", mounts=[f"{data}:{MOUNT_TARGET}"])
    done = hpcvod("submit", "--site", profile, "--container", container_image, "--nodes", "2",
                  "--tasks-per-node", "2", "--env", f"CONTAINER_TEST_DATA={MOUNT_TARGET}/note.txt", "--wait",
                  "train.py", cwd=tmp_path, timeout=900, env=user_env)
    _, job_dir = submitted(done)
    output = (job_dir / "output.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr + output
    results = _results(output)
    _check_world(results, 4, secret)
    assert sorted({r["host"] for r in results}) == ["n1", "n2"], results  # two nodes, one world
