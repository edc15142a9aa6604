import pytest

from submission_helpers import GOLDEN_WORKDIR


@pytest.fixture(scope="session")
def golden_workdir():
    GOLDEN_WORKDIR.mkdir(exist_ok=True)
    (GOLDEN_WORKDIR / "train.py").write_text("print('train')\n")
    return GOLDEN_WORKDIR
