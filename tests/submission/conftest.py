import os

import pytest

from submission_helpers import GOLDEN_WORKDIR


@pytest.fixture(scope="session")
def golden_workdir():
    GOLDEN_WORKDIR.mkdir(exist_ok=True)
    (GOLDEN_WORKDIR / "train.py").write_text("print('train')\n")
    return GOLDEN_WORKDIR


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """``hpcvod ARGS...`` in this process (hpcvod.cli.main, fast), in tmp_path, with no HPCVOD_* settings and only
    the shipped site profiles; returns (exit status, stdout, stderr)."""
    from hpcvod.cli import main

    for key in [k for k in os.environ if k.startswith("HPCVOD_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def sandbox():
    """The slurm-sandbox site profile, loaded (the sites-check unit tests judge records against it)."""
    from hpcvod.schedulers import profile_options
    from hpcvod.sites import load_site

    return load_site("slurm-sandbox", schedulers=profile_options())
