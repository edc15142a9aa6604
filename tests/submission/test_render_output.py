"""`hpcvod render -o FILE` overwrites only an earlier rendered script (or anything with --force), never the program
the script launches, and never leaves a half-written file (issue 10, item 2)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpcvod.jobs.render import RENDERED_MARKER, RENDERED_SHEBANG, is_rendered_script
from submission_helpers import GOLDEN, one_error_line

TRAIN = "print('my training script')\n"


@pytest.fixture
def cli(cli, tmp_path):
    """The in-process CLI of conftest.py, in a folder holding the user's train.py."""
    (tmp_path / "train.py").write_text(TRAIN)
    return cli


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_never_over_the_program_it_launches(tmp_path, cli, force):
    code, _, err = cli("render", "-o", "train.py", *force, "train.py")
    one_error_line(code, err, "which the script launches", "even with --force")
    assert (tmp_path / "train.py").read_text() == TRAIN
    os.link(tmp_path / "train.py", tmp_path / "hard.sh")
    (tmp_path / "soft.sh").symlink_to("train.py")
    for other_name in ("hard.sh", "soft.sh", str(tmp_path / "." / "train.py")):
        code, _, err = cli("render", "-o", other_name, *force, "train.py")
        one_error_line(code, err, "which the script launches")
    (tmp_path / "data.txt").write_text("input")
    code, _, err = cli("render", "-o", "data.txt", *force, "train.py", "data.txt")  # a file on its command line
    one_error_line(code, err, "which the script launches")
    assert (tmp_path / "train.py").read_text() == TRAIN and (tmp_path / "data.txt").read_text() == "input"
    assert _leftovers(tmp_path) == []


def test_other_existing_files_need_force(tmp_path, cli):
    mine = tmp_path / "notes.sh"
    mine.write_text("#!/bin/bash\necho my own script\n")
    code, _, err = cli("render", "-o", "notes.sh", "train.py")
    one_error_line(code, err, "-o 'notes.sh': exists and is not a script hpcvod rendered", "--force")
    assert mine.read_text() == "#!/bin/bash\necho my own script\n"
    code, _, err = cli("render", "-o", "notes.sh", "--force", "train.py")
    assert code == 0, err
    assert is_rendered_script(mine)


def test_an_earlier_rendered_script_is_overwritten(tmp_path, cli):
    code, _, err = cli("render", "--tasks-per-node", "1", "-o", "job.sh", "train.py")
    assert code == 0, err
    first = (tmp_path / "job.sh").read_text()
    assert first.startswith(RENDERED_SHEBANG + RENDERED_MARKER)
    assert stat.S_IMODE((tmp_path / "job.sh").stat().st_mode) & 0o100  # executable
    code, _, err = cli("render", "--tasks-per-node", "2", "-o", "job.sh", "train.py")
    assert code == 0, err
    assert (tmp_path / "job.sh").read_text() != first and "2 task(s) per node" in (tmp_path / "job.sh").read_text()
    assert _leftovers(tmp_path) == []


def test_not_a_regular_file_or_no_folder(tmp_path, cli):
    (tmp_path / "dir.sh").mkdir()
    os.mkfifo(tmp_path / "fifo.sh")
    for name in ("dir.sh", "fifo.sh"):
        code, _, err = cli("render", "-o", name, "--force", "train.py")
        one_error_line(code, err, f"-o '{name}': exists and is not a regular file")
    code, _, err = cli("render", "-o", "no/such/folder/job.sh", "train.py")
    one_error_line(code, err, "no such folder 'no/such/folder'")
    code, _, err = cli("render", "--force", "train.py")
    one_error_line(code, err, "--force goes with -o FILE")


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, cli, monkeypatch):
    code, _, _ = cli("render", "-o", "job.sh", "train.py")
    before = (tmp_path / "job.sh").read_text()

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    code, _, err = cli("render", "--tasks-per-node", "3", "-o", "job.sh", "train.py")
    one_error_line(code, err, "cannot write the script (No space left on device)")
    assert (tmp_path / "job.sh").read_text() == before
    assert _leftovers(tmp_path) == []


def test_the_marker_is_what_every_template_writes():
    """RENDERED_MARKER comes from templates/partials/header.j2; the golden scripts show every template uses it."""
    goldens = sorted(GOLDEN.glob("*.sh"))
    assert goldens
    for path in goldens:
        assert path.read_text().startswith(RENDERED_SHEBANG + RENDERED_MARKER), path.name
