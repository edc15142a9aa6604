"""Site profiles that are not small regular files: FIFOs, huge or deeply nested YAML, alias bombs, long extends
chains. Each is refused in one line, fast and with bounded memory (issue 10, item 5)."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import time
from pathlib import Path

import pytest

from hpcvod.sites import UserError
from hpcvod.sites.loader import MAX_DEPTH, MAX_EXTENDS, MAX_PROFILE_BYTES
from submission_helpers import NO_USER_CONFIG, hpcvod, load_site

MINIMAL = ("scheduler: slurm\nlauncher:\n  kind: srun\n  mpi_plugin: pmix\nmpi:\n  flavour: openmpi\n"
           "partitions:\n  gpu:\n    cpus_per_node: 8\n    gpus_per_node: 2\n")


def _one_line_error(done: subprocess.CompletedProcess, *pieces: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    for piece in pieces:
        assert piece in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return path


def test_fifo_site_file_is_refused_not_waited_on(tmp_path, fifo):
    """Every way a profile file is named: --site PATH, sites validate, sites show, and extends."""
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "child.yaml").write_text("extends: ./fifo.yaml\n")
    for args in (["submit", "--dry-run", "--site", str(fifo), "train.py"], ["render", "--site", str(fifo), "train.py"],
                 ["sites", "validate", str(fifo)], ["sites", "show", str(fifo)],
                 ["sites", "validate", str(tmp_path / "child.yaml")],
                 ["submit", "--dry-run", "--site", str(tmp_path / "child.yaml"), "train.py"]):
        done = hpcvod(*args, cwd=tmp_path, timeout=30)  # before the fix: blocked in open() until the timeout
        _one_line_error(done, "fifo.yaml", "it is a FIFO, expected a regular file")


def test_fifo_in_the_site_folders_does_not_hang_discovery(tmp_path, fifo):
    """A FIFO among ~/.config/hpcvod/sites is skipped while guessing the site from the hostname."""
    sites = tmp_path / "xdg-config" / "hpcvod" / "sites"
    sites.mkdir(parents=True)
    os.mkfifo(sites / "odd.yaml")
    (tmp_path / "train.py").write_text("print(1)\n")
    done = hpcvod("submit", "--dry-run", "train.py", cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("text", [
    "[" * 1_000_000,
    "{a: " * 250_000,
    "- " * 500_000 + "x\n",
    "a:\n" + "".join(" " * i + "k:\n" for i in range(1, 1000)),
    "a: " + "[" * 100_000 + "]" * 100_000 + "\n",
], ids=["flow-lists-1e6", "flow-maps-2.5e5", "block-lists-5e5", "block-maps-1e3", "balanced-1e5"])
def test_deep_nesting_fails_fast_in_one_line(tmp_path, text):
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with pytest.raises(UserError) as info:
        load_site(str(path), environ=NO_USER_CONFIG)
    assert time.monotonic() - start < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024  # KiB: no gigabytes
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert f"nested more than {MAX_DEPTH} levels" in message or "larger than" in message


def test_deep_nesting_in_the_cli(tmp_path):
    (tmp_path / "deep.yaml").write_text("[" * 1_000_000)
    done = hpcvod("sites", "validate", "deep.yaml", cwd=tmp_path, timeout=30)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [f"deep.yaml:1: nested more than {MAX_DEPTH} levels deep: expected a site profile"]


def test_depth_within_the_limit_is_fine(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(MINIMAL + "description: x\nx_nested: " + "[" * 60 + "]" * 60 + "\n")
    with pytest.raises(UserError, match="x_nested: unknown key"):  # got as far as the schema
        load_site(str(path), environ=NO_USER_CONFIG)


def test_aliases_cannot_multiply_or_loop(tmp_path):
    laughs = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    chain = "x0: &x0 []\n" + "".join(f"x{i}: &x{i} [*x{i - 1}]\n" for i in range(1, 100))
    for text, expected in ((laughs, "values (aliases expanded)"), (chain, "levels deep (aliases expanded)"),
                           ("a: &a [*a]\n", "alias *a is undefined or inside the node it names")):
        path = tmp_path / "alias.yaml"
        path.write_text(text)
        with pytest.raises(UserError) as info:
            load_site(str(path), environ=NO_USER_CONFIG)
        assert re.search(r"alias\.yaml:\d+: ", str(info.value)) and expected in str(info.value)


def test_huge_profile_is_not_read_whole(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as f:
        f.write(MINIMAL.encode())
        f.truncate(4 << 30)  # a sparse 4 GiB file: reading it whole would take the memory
    with pytest.raises(UserError, match=f"huge.yaml: site profile is larger than {MAX_PROFILE_BYTES} bytes"):
        load_site(str(path), environ=NO_USER_CONFIG)


def test_yaml_values_python_cannot_build_are_one_line(tmp_path):
    for text, expected in (("a: 2024-13-45\n", "month must be in 1..12"), ("a: " + "9" * 6000 + "\n", "digits")):
        path = tmp_path / "odd.yaml"
        path.write_text(text)
        with pytest.raises(UserError, match=f"odd.yaml: not valid YAML: .*{expected}"):
            load_site(str(path), environ=NO_USER_CONFIG)


def test_extends_chain_is_bounded(tmp_path):
    (tmp_path / "p0.yaml").write_text(MINIMAL)
    for i in range(1, MAX_EXTENDS + 4):
        (tmp_path / f"p{i}.yaml").write_text(f"extends: p{i - 1}.yaml\ndescription: level {i}\n")
    assert load_site(str(tmp_path / f"p{MAX_EXTENDS - 1}.yaml"), environ=NO_USER_CONFIG).profile.scheduler == "slurm"
    with pytest.raises(UserError, match=f"more than {MAX_EXTENDS} profiles in one extends chain"):
        load_site(str(tmp_path / f"p{MAX_EXTENDS + 3}.yaml"), environ=NO_USER_CONFIG)


def test_directory_and_device_as_site_file(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    done = hpcvod("sites", "validate", "dir.yaml", "/dev/zero", cwd=tmp_path, timeout=30)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == ["dir.yaml: cannot read site profile: it is a folder, expected a regular file",
                                        "/dev/zero: cannot read site profile: it is a character device, "
                                        "expected a regular file"]
