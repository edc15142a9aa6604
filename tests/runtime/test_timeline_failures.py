"""A timeline is never worth a training run: one that cannot be written (a full disk: /dev/full) is one line on
stderr and the job finishes; a timeline in a folder that does not exist is an error at init() on every rank, and
no folder is created for it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpcvod.runtime.errors import HpcvodInputError
from hpcvod.runtime.timeline import NEGOTIATE, Timeline, open_timeline

from conftest import MpiFlavour


def test_a_timeline_on_a_full_disk_says_so_once_and_never_raises(capsys) -> None:
    timeline = open_timeline("/dev/full", 0)
    for i in range(5000):   # more than one batch: the engine thread's own flush meets the error first
        timeline.span(f"t{i % 7}", NEGOTIATE, 0.0, 1.0)
    timeline.close()
    timeline.close()   # twice, as stop_timeline() then shutdown() may
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["hpcvod: rank 0: cannot write the timeline /dev/full (No space left on device); it stops here "
                     "and the file is incomplete; the job goes on"], lines
    assert timeline.write_error == "No space left on device"


def test_a_timeline_in_a_missing_folder_is_refused_and_no_folder_is_made(tmp_path: Path) -> None:
    path = tmp_path / "not" / "there" / "tl.json"
    with pytest.raises(HpcvodInputError) as err:
        open_timeline(str(path), 0)
    assert str(err.value) == (f"rank 0: cannot write the timeline {path}: its folder {path.parent} does not exist "
                              f"(create it first)")
    assert not (tmp_path / "not").exists()
    assert open_timeline(str(path), 1) is None   # another rank writes it: nothing to check here


def test_a_timeline_file_is_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        Timeline(str(tmp_path / "tl.json"), 0).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "tl.json").stat().st_mode) == 0o600


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_a_timeline_that_cannot_be_written_does_not_fail_the_job(mpich: MpiFlavour) -> None:
    ranks = mpich.run(2, "w_setting_bounds.py", env={"HPCVOD_TIMELINE": "/dev/full"}, timeout=90)
    assert ranks.returncode == 0, ranks.explain()
    for rank in (0, 1):
        assert f"rank {rank} allreduce [2.0, 2.0]" in ranks.stdout, ranks.explain()
    said = [line for line in ranks.stderr.splitlines() if "cannot write the timeline" in line]
    assert len(said) == 1 and said[0].startswith("hpcvod: rank 0: cannot write the timeline /dev/full"), \
        ranks.explain()
    assert "Traceback" not in ranks.stderr and "not been heard from" not in ranks.stderr, ranks.explain()


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_a_timeline_in_a_missing_folder_is_one_line_on_every_rank(mpich: MpiFlavour, tmp_path: Path) -> None:
    path = tmp_path / "missing" / "tl.json"
    ranks = mpich.run(2, "w_setting_bounds.py", env={"HPCVOD_TIMELINE": str(path)}, timeout=90)
    assert ranks.returncode != 0, ranks.explain()
    for rank in (0, 1):
        lines = [line for line in ranks.stdout.splitlines() if line.startswith(f"rank {rank} refused: ")]
        assert len(lines) == 1 and f"HPCVOD_TIMELINE='{path}': rank 0: cannot write the timeline" in lines[0] \
            and "does not exist" in lines[0], ranks.explain()
    assert not path.parent.exists()
