"""The submission side's rooms import one way: cli -> jobs -> schedulers/launchers -> sites.

Read from the source (every import, also those inside functions and under TYPE_CHECKING), so a back-reaching
import fails here even where it would not run in a test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hpcvod

PACKAGE = Path(hpcvod.__file__).parent
# room -> the rooms above it, which it must never import
ABOVE = {
    "sites": ("hpcvod.cli", "hpcvod.jobs", "hpcvod.schedulers", "hpcvod.launchers"),
    "schedulers": ("hpcvod.cli", "hpcvod.jobs"),
    "launchers": ("hpcvod.cli", "hpcvod.jobs", "hpcvod.schedulers"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("room", sorted(ABOVE))
def test_room_imports_nothing_above_it(room: str) -> None:
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line}: imports {name}"
             for path in sorted((PACKAGE / room).glob("*.py")) for line, name in _imports(path)
             if name.startswith(ABOVE[room])]
    assert not wrong, "\n".join(wrong)
    assert list((PACKAGE / room).glob("*.py")), f"no files in {room}: the test would prove nothing"


def test_the_check_sees_a_back_reaching_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from hpcvod.jobs.plan import LaunchPlan\n")
    assert _imports(bad) == [(2, "hpcvod.jobs.plan")]
