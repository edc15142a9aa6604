"""``hpcvod run --as-horovod`` (issue 29 item 8): a script spelled for Horovod runs with no line changed, for that
run only; refused where a real horovod package is importable; never in effect without the flag."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from frameworks_helpers import ROOT, WORKERS, rank_env, require_framework, run_or_fail

pytestmark = [pytest.mark.mpi]


def hpcvod_run(*words: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "hpcvod.cli", "run", *words]
    return subprocess.run(argv, env=env or rank_env(), capture_output=True, text=True, timeout=240, cwd=str(cwd))


@pytest.mark.frameworks
def test_an_unchanged_horovod_torch_script_trains_on_two_ranks() -> None:
    require_framework("torch")
    argv = [sys.executable, "-m", "hpcvod.cli", "run", "--as-horovod", "-np", "2", sys.executable,
            str(WORKERS / "horovod_style_torch.py")]
    proc = run_or_fail(argv, rank_env(), 240, "hpcvod run --as-horovod")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    found = re.findall(r"\[(\d)\]<stdout>: RANK (\d) OF 2 hvd=hpcvod\.torch error=\w+ "
                       r"run=hpcvod\.runner spread=([0-9.e-]+)", proc.stdout)
    assert sorted((label, rank) for label, rank, _ in found) == [("0", "0"), ("1", "1")], proc.stdout[-2000:]
    assert all(float(spread) == 0.0 for _, _, spread in found), found   # the ranks trained one model


def test_without_the_flag_horovod_is_not_importable() -> None:
    proc = hpcvod_run("-np", "1", sys.executable, "-c", "import horovod")
    assert proc.returncode != 0
    assert "No module named 'horovod'" in proc.stdout + proc.stderr


def test_a_missing_module_names_the_hpcvod_path_it_looked_for() -> None:
    proc = hpcvod_run("--as-horovod", "-np", "1", sys.executable, "-c", "import horovod.spark")
    assert proc.returncode != 0
    assert "hpcvod has no 'hpcvod.spark'" in proc.stderr, proc.stderr[-2000:]


def test_the_hidden_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = 'yes'\n")
    env = rank_env({"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    proc = hpcvod_run("--as-horovod", "-np", "1", sys.executable, "-c",
                      "import os, horovod; print('SITE', os.environ.get('SITE_RAN'), horovod.__name__)", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SITE yes hpcvod" in proc.stdout


def test_refused_in_one_line_where_a_real_horovod_is_importable(tmp_path: Path) -> None:
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("")
    marker = tmp_path / "ran"
    env = rank_env({"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    proc = hpcvod_run("--as-horovod", "-np", "2", sys.executable, "-c", f"open({str(marker)!r}, 'w')", env=env)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "--as-horovod: a real horovod package is importable here" in lines[0], proc.stderr
    assert str(tmp_path / "horovod") in lines[0]
    assert not marker.exists()   # no rank started
