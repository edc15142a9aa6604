"""Every registered launcher, found by the registry (not a list kept here), renders a launch line for a plan.

As ReFrame's unittests/test_launchers.py does for its registry: the cases are parametrized over
``hpcvod.launchers.all_launchers()``, so a launcher module dropped into hpcvod/launchers/ is tested without
touching this file, and a launcher the registry does not find fails the count check below.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpcvod.jobs.plan import resolve
from hpcvod.jobs.spec import JobSpec
from hpcvod.launchers import NOT_LAUNCHERS, LaunchLine, LaunchRequest, all_launchers, launcher_for, launcher_kinds
from hpcvod.launchers.base import _REGISTRY, Launcher, register
from hpcvod.sites import UserError
from submission_helpers import SCHEDULER_OPTIONS, golden_host, load_site

LAUNCHERS = all_launchers()


def _cases() -> list[tuple[str, str, str]]:
    """(launcher name, kind, flavour): every kind and flavour each registered launcher declares."""
    return [(name, kind, flavour) for name, cls in sorted(LAUNCHERS.items())
            for kind in cls.kinds for flavour in sorted(cls.flavours)]


def test_the_registry_finds_every_launcher_module() -> None:
    modules = {p.stem for p in Path(__import__("hpcvod.launchers").launchers.__file__).parent.glob("*.py")}
    assert {cls.__module__.rpartition(".")[2] for cls in LAUNCHERS.values()} == modules - {"__init__"} - NOT_LAUNCHERS
    assert NOT_LAUNCHERS == {"base", "label", "run", "elastic_driver", "elastic_batch"}   # a new module is a launcher unless listed
    assert {"srun", "openmpi", "hydra"} <= set(LAUNCHERS)


@pytest.mark.parametrize("name,kind,flavour", _cases())
def test_each_launcher_is_picked_for_its_kind_and_flavour(name: str, kind: str, flavour: str) -> None:
    launcher = launcher_for(kind, flavour)
    assert type(launcher) is LAUNCHERS[name] and launcher.flavour == flavour
    line = launcher.line(LaunchRequest(executable=f"/x/{kind}", world_size=6, nodes=2, tasks_per_node=3,
                                       hostfile="hosts", forward_env=("NCCL_DEBUG",)))
    assert isinstance(line, LaunchLine) and line.argv[0] == f"/x/{kind}"
    assert any("6" in word for word in line.argv), line.argv  # the world's size is on the line
    assert any("3" in word for word in line.argv), line.argv  # and the ranks per node


def _site_for(tmp_path: Path, kind: str, flavour: str):
    """A cluster profile whose launcher is ``kind`` under the first multi-node batch scheduler that can run it (not
    one that runs the ranks in its own image, kubernetes: its profile needs an image)."""
    scheduler = next((name for name, cls in sorted(SCHEDULER_OPTIONS.items())
                      if kind in cls.launcher_kinds() and not cls.single_host and not cls.runs_in_image), "pbs")
    srun = kind == "srun"
    plugin = "pmix" if flavour == "openmpi" else "pmi2"  # the PMI each MPI speaks to srun (docs/sites.md)
    text = (f"scheduler: {scheduler}\npartitions:\n  gpu:\n    cpus_per_node: 32\n    gpus_per_node: 4\n"
            f"launcher:\n  kind: {kind}\n" + (f"  mpi_plugin: {plugin}\n" if srun else "")
            + f"mpi:\n  flavour: {flavour}\n" + ("  pmi_library: /usr/lib64/libpmi2.so\n"
                                                   if srun and flavour == "intelmpi" else ""))
    path = tmp_path / f"{kind}-{flavour}.yaml"
    path.write_text(text)
    return load_site(str(path))


@pytest.mark.parametrize("name,kind,flavour", _cases())
def test_each_launcher_renders_the_launch_line_of_a_plan(tmp_path: Path, name: str, kind: str, flavour: str) -> None:
    site = _site_for(tmp_path, kind, flavour)
    (tmp_path / "train.py").write_text("")
    host = dataclasses.replace(golden_host(flavour="openmpi" if flavour == "openmpi" else "mpich"),
                               cwd=str(tmp_path))
    plan = resolve(JobSpec(program="train.py", nodes=2, gpus_per_node=4), site, host)
    assert plan.launcher == name
    assert plan.launch_argv[0] == kind  # the profile names no executable: the kind's own program
    assert plan.launch_argv[-4:] == ("/opt/venv/bin/python", "-m", "hpcvod.launchers.label", "--")
    assert plan.world_size == 8 and any("8" in word for word in plan.launch_argv)


def test_a_registered_launcher_becomes_a_profile_choice(tmp_path: Path) -> None:
    """A new launcher is one class: once registered, its kind is a valid launcher.kind and plans use it."""

    class EchoLauncher(Launcher):
        name = "echo-test"
        kinds = ("echo-launch",)

        def line(self, req: LaunchRequest) -> LaunchLine:
            return LaunchLine([req.executable, f"--ranks={req.world_size}"], {"ECHO_LAUNCH": "1"})

    with pytest.raises(UserError, match="launcher.kind: expected one of"):
        _site_for(tmp_path, "echo-launch", "mpich")
    register(EchoLauncher)
    try:
        assert "echo-launch" in launcher_kinds()
        site = _site_for(tmp_path, "echo-launch", "mpich")
        (tmp_path / "train.py").write_text("")
        plan = resolve(JobSpec(program="train.py", nodes=2), site,
                       dataclasses.replace(golden_host(), cwd=str(tmp_path)))
        assert plan.launcher == "echo-test" and plan.launch_argv[:2] == ("echo-launch", "--ranks=8")  # 2 x 4 GPUs
        assert ("ECHO_LAUNCH", "1") in dict(plan.env_groups)["launcher"]
    finally:
        del _REGISTRY["echo-test"]
    assert "echo-launch" not in launcher_kinds()


def test_a_launcher_name_registered_twice_is_refused() -> None:
    class Other(Launcher):
        name = "srun"
        kinds = ("srun",)

        def line(self, req: LaunchRequest) -> LaunchLine:
            return LaunchLine([])

    with pytest.raises(TypeError, match="two launchers named 'srun'"):
        register(Other)
