"""Site profiles: the schema generated from the one definition, precise errors, extends, discovery order."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from hpcvod.sites import ProfileError, UserError, shipped_dir, site_files
from hpcvod.sites.spec import field_docs
from hpcvod.sites.profile import SiteProfile, choices
from submission_helpers import NO_USER_CONFIG, SCHEDULER_OPTIONS, discover_site, load_site
from submission_helpers import site_schema as schema

MINIMAL = ("scheduler: slurm\nlauncher:\n  kind: srun\n  mpi_plugin: pmix\nmpi:\n  flavour: openmpi\n"
           "partitions:\n  gpu:\n    cpus_per_node: 8\n    gpus_per_node: 2\n")  # a partition last: tests append to it


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(tmp_path, text: str, name: str = "site.yaml") -> str:
    path = _write(tmp_path, name, text)
    with pytest.raises(UserError) as info:
        load_site(str(path), environ=NO_USER_CONFIG)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_schema_is_valid_and_accepts_every_shipped_profile():
    published = schema()
    jsonschema.Draft202012Validator.check_schema(published)
    validator = jsonschema.Draft202012Validator(published)
    for path in sorted(shipped_dir().glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if path.stem.startswith("_"):
            continue  # a base: only complete after a profile extends it
        errors = [e.message for e in validator.iter_errors(data)]
        assert errors == [], (path.name, errors)


BAD_PROFILES = [
    ("unknown key", "interconect:\n  kind: roce\n" + MINIMAL, "interconect: unknown key; did you mean 'interconnect'?"),
    ("nested unknown key", MINIMAL.replace("gpus_per_node", "gpus_per_nod"),
     "partitions.gpu.gpus_per_nod: unknown key; did you mean 'gpus_per_node'?"),
    ("wrong type", MINIMAL.replace("cpus_per_node: 8", "cpus_per_node: eight"),
     "partitions.gpu.cpus_per_node: expected an integer >= 1 or 'auto', got 'eight' (str)"),
    ("bad enum", MINIMAL.replace("kind: srun", "kind: ssh"), "launcher.kind: expected one of 'mpiexec', 'mpirun', 'srun'"),
    ("bad scheduler", MINIMAL.replace("scheduler: slurm", "scheduler: slurmm"), "did you mean 'slurm'?"),
    ("bad time", MINIMAL + "    max_time: 'two days'\n", "partitions.gpu.max_time: expected a time as [D-]HH:MM:SS"),
    ("missing key", MINIMAL.replace("mpi:\n  flavour: openmpi\n", ""), "mpi: missing required key"),
    ("bad option", "scheduler_options:\n  gpu_request: cards\n" + MINIMAL,
     "scheduler_options.gpu_request: expected one of 'gres', 'gpus-per-node'"),
    ("bad env name", "env:\n  1BAD: x\n" + MINIMAL, "env.1BAD: expected an environment variable name"),
]


@pytest.mark.parametrize("label,text,expected", BAD_PROFILES, ids=[b[0] for b in BAD_PROFILES])
def test_bad_profiles_rejected_by_loader_and_schema(tmp_path, label, text, expected):
    message = _error(tmp_path, text)
    assert expected in message
    assert message.startswith(str(tmp_path / "site.yaml"))
    validator = jsonschema.Draft202012Validator(schema())
    assert list(validator.iter_errors(yaml.safe_load(text))), f"the published schema accepts: {label}"


def test_errors_name_the_line(tmp_path):
    message = _error(tmp_path, MINIMAL.replace("gpus_per_node", "gpus_per_nod"))
    assert message.startswith(f"{tmp_path / 'site.yaml'}:10: ")


def test_cross_field_rules(tmp_path):
    assert "launcher.mpi_plugin: missing" in _error(tmp_path, MINIMAL.replace("  mpi_plugin: pmix\n", ""))
    intel = MINIMAL.replace("flavour: openmpi", "flavour: intelmpi").replace("pmix", "pmi2")
    assert "mpi.pmi_library: missing" in _error(tmp_path, intel)
    assert "interconnect.gid_index: only applies to kind 'roce'" in _error(
        tmp_path, MINIMAL + "interconnect:\n  kind: infiniband\n  gid_index: 3\n")
    assert "'auto' counts this machine's resources" in _error(
        tmp_path, MINIMAL.replace("cpus_per_node: 8", "cpus_per_node: auto"))


def test_empty_truncated_and_unquoted_time(tmp_path):
    assert "empty site profile" in _error(tmp_path, "")
    assert "not valid YAML" in _error(tmp_path, MINIMAL[:-30] + "  x: 'unterminated\n")
    assert "expected a mapping" in _error(tmp_path, "- a\n- b\n")
    message = _error(tmp_path, MINIMAL + "    max_time: 48:00:00\n")
    assert "quote the value" in message


def test_extends_merges_and_detects_cycles(tmp_path):
    _write(tmp_path, "_base.yaml", "hostnames: ['login*']\nenv:\n  A: '1'\n  B: '2'\n" + MINIMAL)
    child = _write(tmp_path, "child.yaml", "extends: _base.yaml\nenv:\n  B: '3'\n")
    site = load_site(str(child), environ=NO_USER_CONFIG)
    assert site.profile.env == {"A": "1", "B": "3"}  # mappings merge, the child wins
    assert site.profile.hostnames == []  # hostnames are never inherited
    assert site.profile.scheduler == "slurm"
    _write(tmp_path, "a.yaml", "extends: b.yaml\n")
    _write(tmp_path, "b.yaml", "extends: a.yaml\n")
    assert "extend each other in a circle" in _error(tmp_path, "extends: a.yaml\n", "c.yaml")


def test_extends_a_shipped_profile_by_name(tmp_path):
    path = _write(tmp_path, "mine.yaml", "extends: slurm-ib-openmpi\naccount: proj1\n")
    site = load_site(str(path), environ=NO_USER_CONFIG)
    assert site.profile.account == "proj1" and site.profile.launcher.mpi_plugin == "pmix"


def test_discovery_order(tmp_path):
    admin, user = tmp_path / "admin", tmp_path / "xdg" / "hpcvod" / "sites"
    admin.mkdir()
    user.mkdir(parents=True)
    _write(admin, "cluster.yaml", "description: admin's\nhostnames: ['login*.example.org']\n" + MINIMAL)
    _write(user, "cluster.yaml", "description: user's\n" + MINIMAL)
    _write(user, "mine.yaml", "description: mine\n" + MINIMAL)
    env = {"HPCVOD_SITE_PATH": str(admin), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert discover_site("cluster", "x", env).profile.description == "admin's"  # $HPCVOD_SITE_PATH first
    assert discover_site("mine", "x", env).profile.description == "mine"  # then ~/.config/hpcvod/sites
    assert discover_site("slurm-ib-openmpi", "x", env).name == "slurm-ib-openmpi"  # then shipped
    assert discover_site(None, "x", {**env, "HPCVOD_SITE": "mine"}).name == "mine"  # $HPCVOD_SITE
    assert discover_site("cluster", "x", {**env, "HPCVOD_SITE": "mine"}).name == "cluster"  # --site wins
    assert discover_site(None, "login3.example.org", env).profile.description == "admin's"  # hostname pattern
    assert discover_site(None, "somewhere-else", env).name == "local"  # the fallback
    path = _write(tmp_path, "direct.yaml", MINIMAL)
    assert discover_site(str(path), "x", env).source == str(path)  # a path works anywhere


def test_unknown_site_suggests(tmp_path):
    with pytest.raises(UserError, match=r"unknown site 'slurm-ib-opnmpi' \(--site\).*did you mean 'slurm-ib-openmpi'"):
        load_site("slurm-ib-opnmpi", environ={"XDG_CONFIG_HOME": str(tmp_path)})


def test_base_files_are_hidden_but_extendable():
    names = site_files(environ=NO_USER_CONFIG)
    assert "_pbs-base" not in names
    assert {"local", "slurm-ib-openmpi", "slurm-roce-intelmpi", "pbs-ib-openmpi", "pbs-roce-intelmpi"} <= set(names)


def test_field_docs_cover_every_key():
    rows = field_docs(SiteProfile, choices=choices(SCHEDULER_OPTIONS))
    keys = {r[0] for r in rows}
    assert {"scheduler", "partitions.<name>.gpus_per_node", "interconnect.gid_index", "container.runtime"} <= keys
    assert all(doc for _, _, doc in rows)


def test_profile_error_format():
    err = ProfileError(("partitions", "gpu", "max_time"), "expected a time", "f.yaml:3")
    assert str(err) == "f.yaml:3: partitions.gpu.max_time: expected a time"
    assert json.dumps(str(err))
