"""`hpcvod render` writes the script alone: its header does not point at a job folder nobody made, while the copy
submit keeps in the job folder says how to re-run it there (issue 25, small ones)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from submission_helpers import clean_env, hpcvod, wait_until_finished

ALONE = "# Written alone by hpcvod render: no job folder was made."


@pytest.mark.parametrize("site", ["local", "slurm-ib-openmpi", "pbs-ib-openmpi", "sge-sandbox"])
def test_render_points_at_no_job_folder(tmp_path: Path, site: str) -> None:
    (tmp_path / "train.py").write_text("")
    shown = hpcvod("render", "--site", site, "train.py", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    written = hpcvod("render", "--site", site, "-o", "job.script", "train.py", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    for text in (shown.stdout, (tmp_path / "job.script").read_text()):
        header = text.split("\n\n", 1)[0]
        assert ALONE in header and "Re-run it" not in header, header
    assert not (tmp_path / "hpcvod-jobs").exists()


@pytest.mark.mpi
def test_the_submitted_copy_says_how_to_re_run_it_in_its_folder(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    done = hpcvod("submit", "--json", "--site", "local", "train.py", cwd=tmp_path, env=clean_env(tmp_path))
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    wait_until_finished(job["job_id"], tmp_path, clean_env(tmp_path))
    script = (Path(job["job_dir"]) / "job.sh").read_text()
    assert "# Re-run it from anywhere: bash job.sh" in script and ALONE not in script
