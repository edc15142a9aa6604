"""examples/demo_digits.py (the README's demo) trains on 2 ranks to the accuracy of 1 rank."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import ROOT

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]

DEMO = ROOT / "examples" / "demo_digits.py"


def accuracy(output: str) -> float:
    match = re.search(r"test accuracy (\d\.\d+) \(\d+ samples\); parameters identical on every rank", output)
    assert match, output
    return float(match.group(1))


def test_demo_on_two_ranks_reaches_the_one_rank_accuracy(mpich) -> None:
    alone = subprocess.run([mpich.python, str(DEMO)], env=mpich.env(), capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
    assert alone.returncode == 0, alone.stderr
    assert "1 rank(s)" in alone.stdout
    two = subprocess.run(mpich.launch_argv(2) + [mpich.python, str(DEMO)], env=mpich.env(), capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert two.returncode == 0, two.stderr
    assert "2 rank(s)" in two.stdout and "32 per rank" in two.stdout
    assert len(re.findall(r"^epoch +\d+ +loss", two.stdout, re.M)) == 12, "rank 0 alone prints the epochs"
    acc1, acc2 = accuracy(alone.stdout), accuracy(two.stdout)
    assert acc1 > 0.9
    assert acc2 >= acc1 - 0.01, (acc1, acc2)
