"""`hpcvod sites check --model PATH` (issue 23 item 11): a zip that looks like TorchScript but is not one, a FIFO,
/dev/zero or a folder is one line naming --model and what was expected, exit 2, before any job is submitted."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from submission_helpers import clean_env, hpcvod, one_error_line


def _fake_torchscript(path: Path) -> None:
    """A zip with the layout of torch.jit.save's archive (code/, data.pkl, version) and nothing torch can load."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/code/__torch__.py", "def forward(self):\n    return 1\n")
        archive.writestr("model/data.pkl", b"not a pickle")
        archive.writestr("model/version", "3\n")


def _broken_torchscript(path: Path) -> None:
    """A real TorchScript file with its data.pkl left out (a copy cut short while it was written)."""
    torch = pytest.importorskip("torch")
    whole = path.with_name("whole.pt")
    torch.jit.save(torch.jit.script(torch.nn.Linear(3, 2)), str(whole))
    with zipfile.ZipFile(whole) as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith("/data.pkl"):
                dst.writestr(item, src.read(item))


@pytest.mark.timeout(120)   # a FIFO: the check once waited on it
@pytest.mark.parametrize("kind, expected", [
    ("fake-torchscript", "a zip holding code/ but not a TorchScript file torch can load"),
    ("broken-torchscript", "a zip holding code/ but not a TorchScript file torch can load"),
    ("fifo", "cannot read the --model file: it is a FIFO, expected a regular file"),
    ("dev-zero", "/dev/zero: cannot read the --model file: it is a character device, expected a regular file"),
    ("folder", "cannot read the --model file: it is a folder, expected a regular file"),
])
def test_model_that_is_no_torch_file_is_one_line_before_any_job(tmp_path: Path, kind: str, expected: str) -> None:
    pytest.importorskip("torch")
    model = tmp_path / "model.pt"
    if kind == "fake-torchscript":
        _fake_torchscript(model)
    elif kind == "broken-torchscript":
        _broken_torchscript(model)
    elif kind == "fifo":
        os.mkfifo(model)
    elif kind == "dev-zero":
        model = Path("/dev/zero")
    else:
        model.mkdir()
    done = hpcvod("sites", "check", "local", "--output-dir", str(tmp_path / "jobs"), "--model", str(model),
                  cwd=tmp_path, env=clean_env(tmp_path), timeout=90)
    line = one_error_line(done.returncode, done.stderr, expected)
    assert "--model" in line and "expected" in line, line
    assert not (tmp_path / "jobs").exists()
