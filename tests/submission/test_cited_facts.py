"""What the code, the shipped profiles and the docs cite as measured is in the repository (docs/measured.md), not
in a notes file users do not have (issue 25, small ones)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    return [REPO / n for n in names if n.endswith((".py", ".md", ".yaml", ".sh", ".j2", ".txt"))]


def test_nothing_cites_a_notes_file_outside_the_repository() -> None:
    citing = [f"{path.relative_to(REPO)}:{number}" for path in _tracked_text_files() if path.is_file()
              for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
              if re.search(r"FACTS\.md|\.\./shared/", line) and path.name != Path(__file__).name]
    assert citing == [], citing


def test_the_page_they_cite_instead_holds_the_facts() -> None:
    page = (REPO / "docs" / "measured.md").read_text()
    for fact in ("--mpi=pmi2", "worlds of size 1", "OMPI_MCA_pml=ob1", "np.bool", "getDeviceCount",
                 "maxConcurrentTasksCheck", "0.58x", "~1.1 ms", "2-3x"):
        assert fact in page, fact
