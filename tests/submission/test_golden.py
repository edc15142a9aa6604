"""Golden files: every shipped profile at (1 node, 0 GPU) and (4 nodes, 4 GPUs), rendered on fixed host facts.

Regenerate after an intended change with:  HPCVOD_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/submission
and review the diff of tests/submission/golden/ like code.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess

import pytest

from submission_helpers import GOLDEN, NO_USER_CONFIG, golden_host, load_site
from hpcvod.jobs.plan import resolve
from hpcvod.jobs.render import render
from hpcvod.jobs.spec import JobSpec
from hpcvod.schedulers import scheduler_for
from hpcvod.sites import UserError, site_files
from hpcvod.sites.joboptions import JobOptions, job_options

SHIPPED = sorted(site_files(environ=NO_USER_CONFIG))
LAYOUTS = [(1, 0), (4, 4)]
REGEN = os.environ.get("HPCVOD_REGEN_GOLDEN") == "1"


def _spec(nodes: int, gpus: int) -> JobSpec:
    return JobSpec(program="train.py", args=("--epochs", "3", "--note", "it's a $(test); `x` \"y\""), nodes=nodes,
                   gpus_per_node=gpus, env=(("MY_SETTING", "a b;c"),))


def _command(nodes: int, gpus: int, site: str) -> list[str]:
    return ["hpcvod", "submit", "--site", site, "--nodes", str(nodes), "--gpus-per-node", str(gpus),
            "--env", "MY_SETTING=a b;c", "train.py", "--epochs", "3", "--note", "it's a $(test); `x` \"y\""]


def rendered(site_name: str, nodes: int, gpus: int, flavour: str = "mpich", is_root: bool = False,
             options: JobOptions | None = None) -> str:
    site = load_site(site_name, environ=NO_USER_CONFIG)
    host = golden_host(flavour, gpus=gpus, is_root=is_root)
    spec = dataclasses.replace(_spec(nodes, gpus), options=options or JobOptions())
    plan = resolve(spec, site, host, _command(nodes, gpus, site_name))
    return render(plan, scheduler_for(site).template)


# Every per-job option a scheduler writes, in one script per scheduler (an array job: the index variable, the
# per-task log and exit file show too); the options it refuses are tested in test_directives.py.
OPTIONS = {
    "slurm-ib-openmpi": dict(exclusive=True, mem="64G", constraint="a100&ib", qos="high", reservation="maint",
                             nodelist="n[01-04]", exclude="n07", begin="2026-12-01T10:00", mail_type="BEGIN,END,FAIL",
                             mail_user="ada@example.org", dependency="afterok:123:456,afterany:789",
                             array="0-15%4", sched_opt=["gres-flags=enforce-binding", "comment=\"sweep;1\""]),
    "pbs-ib-openmpi": dict(exclusive=True, mem="64G", begin="2026-12-01T10:00:30", mail_type="BEGIN,FAIL",
                           mail_user="ada@example.org", dependency="afterok:123.server:124.server", array="0-9",
                           sched_opt=["l=software=matlab"]),
    "sge-sandbox": dict(exclusive=True, reservation="42", begin="2026-12-01T10:00", mail_type="END",
                        mail_user="ada", dependency="afterany:77:78", array="1-9:2%3", sched_opt=["l=h_vmem=4G"]),
}


LAYOUT = {"sge-sandbox": (1, 0)}  # one host, no GPUs; the others: 2 nodes x 4 GPUs


def options_golden_name(site: str) -> str:
    nodes, gpus = LAYOUT.get(site, (2, 4))
    return f"options-{site}-{nodes}n{gpus}g.sh"


@pytest.mark.parametrize("site", sorted(OPTIONS))
def test_golden_job_options(golden_workdir, site):
    text = rendered(site, *LAYOUT.get(site, (2, 4)), options=job_options(OPTIONS[site]))
    path = GOLDEN / options_golden_name(site)
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with HPCVOD_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} changed; if intended, regenerate with HPCVOD_REGEN_GOLDEN=1"
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def feasible(name: str, nodes: int, gpus: int) -> bool:
    """Whether the profile's default partition has the nodes and GPUs (read from the profile, not by trying)."""
    profile = load_site(name, environ=NO_USER_CONFIG).profile
    part = profile.partitions[profile.default_partition or next(iter(profile.partitions))]
    node_gpus = golden_host(gpus=gpus).gpu_count if part.gpus_per_node == "auto" else part.gpus_per_node
    return gpus <= node_gpus and (part.max_nodes is None or nodes <= part.max_nodes)


def cases() -> list[tuple[str, int, int, str, bool]]:
    out = [(name, nodes, gpus, "mpich", False) for name in SHIPPED for nodes, gpus in LAYOUTS
           if feasible(name, nodes, gpus)]
    # the local site on other MPI flavours, and with GPUs (it has one node: (4 nodes, 4 GPUs) is refused below)
    out += [("local", 1, 4, "mpich", False), ("local", 1, 0, "openmpi", True), ("local", 1, 0, "intelmpi", False)]
    return out


INFEASIBLE = [(name, nodes, gpus) for name in SHIPPED for nodes, gpus in LAYOUTS if not feasible(name, nodes, gpus)]


def golden_name(name: str, nodes: int, gpus: int, flavour: str, root: bool) -> str:
    extra = "" if flavour == "mpich" and not root else f"-{flavour}{'-root' if root else ''}"
    return f"{name}-{nodes}n{gpus}g{extra}.sh"


@pytest.mark.parametrize("name,nodes,gpus,flavour,root", cases(), ids=lambda v: str(v))
def test_golden(golden_workdir, name, nodes, gpus, flavour, root):
    text = rendered(name, nodes, gpus, flavour, root)
    path = GOLDEN / golden_name(name, nodes, gpus, flavour, root)
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with HPCVOD_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} changed; if intended, regenerate with HPCVOD_REGEN_GOLDEN=1"


def test_every_shipped_profile_has_golden_files():
    names = {p.name for p in GOLDEN.glob("*.sh")}
    for site in SHIPPED:
        for nodes, gpus in LAYOUTS:
            assert f"{site}-{nodes}n{gpus}g.sh" in names or (site, nodes, gpus) in INFEASIBLE
    expected = {golden_name(*c) for c in cases()} | {options_golden_name(site) for site in OPTIONS}
    assert names == expected, f"stale golden files: {sorted(names - expected)}"


@pytest.mark.parametrize("name,nodes,gpus", INFEASIBLE, ids=lambda v: str(v))
def test_layouts_a_profile_cannot_hold_are_refused(golden_workdir, name, nodes, gpus):
    """(4 nodes, 4 GPUs) on a one-machine or CPU-only profile: one clear line, no script."""
    with pytest.raises(UserError, match=r"^--(nodes|gpus-per-node) \d+: partition '[^']+' of site '[^']+' "
                                        r"(allows at most \d+ nodes?|has \d+ GPUs? per node)$"):
        rendered(name, nodes, gpus)


@pytest.mark.parametrize("name,nodes,gpus,flavour,root", cases(), ids=lambda v: str(v))
def test_bash_syntax(golden_workdir, tmp_path, name, nodes, gpus, flavour, root):
    script = tmp_path / "job.sh"
    script.write_text(rendered(name, nodes, gpus, flavour, root))
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", SHIPPED)
def test_deterministic(golden_workdir, name):
    nodes, gpus = (4, 4) if feasible(name, 4, 4) else (1, 0)
    assert rendered(name, nodes, gpus) == rendered(name, nodes, gpus)


def test_local_rejects_several_nodes(golden_workdir):
    assert ("local", 4, 4) in INFEASIBLE
    with pytest.raises(UserError, match=r"--nodes 4: partition 'local' of site 'local' allows at most 1 node"):
        rendered("local", 4, 0)


def test_header_names_version_site_and_command(golden_workdir):
    from hpcvod import __version__

    text = rendered("slurm-ib-openmpi", 4, 4)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert lines[1] == f"# Generated by hpcvod {__version__} for site slurm-ib-openmpi (scheduler: slurm)."
    assert lines[2].startswith("# Command: hpcvod submit --site slurm-ib-openmpi --nodes 4 --gpus-per-node 4 ")
    assert not re.search(r"20\d\d-\d\d-\d\d|\d\d:\d\d:\d\d \w", "\n".join(lines[:4])), "no timestamps in a script"


def test_contract_variables_exported(golden_workdir):
    for name in SHIPPED:
        text = rendered(name, 1, 0)
        for var in ("HPCVOD_WORLD_SIZE", "HPCVOD_JOB_DIR", "HPCVOD_SITE"):
            assert re.search(rf"^export {var}=", text, re.M), (name, var)
    assert "export HPCVOD_WORLD_SIZE=16\n" in rendered("slurm-ib-openmpi", 4, 4)
