"""The submission side's rooms import one way: cli -> jobs -> schedulers/launchers -> sites -> support; and the worker side
(the runtime, the frameworks and their public import points) never imports the submission side.

Read from the source (every import, also those inside functions and under TYPE_CHECKING, relative ones resolved),
so a back-reaching import fails here even where it would not run in a test; and, for the worker side, checked
once more in a fresh interpreter, where an import the source hides (importlib) shows in sys.modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import hpcvod

PACKAGE = Path(hpcvod.__file__).parent
# room -> the rooms above it, which it must never import
ABOVE = {
    # the error type and the file helpers every room uses: the ground floor, it imports no other room
    "support": ("hpcvod.cli", "hpcvod.jobs", "hpcvod.schedulers", "hpcvod.launchers", "hpcvod.sites",
                "hpcvod.machine", "hpcvod.containers"),
    "sites": ("hpcvod.cli", "hpcvod.jobs", "hpcvod.schedulers", "hpcvod.launchers", "hpcvod.machine",
              "hpcvod.containers"),
    # this machine's facts, MPI detection and doctor: below the launchers, beside the sites
    "machine": ("hpcvod.cli", "hpcvod.jobs", "hpcvod.schedulers", "hpcvod.launchers", "hpcvod.containers"),
    # container runtimes' words, images, their checks at submit: used by jobs (the plan) and cli (`hpcvod image`)
    "containers": ("hpcvod.cli", "hpcvod.jobs", "hpcvod.schedulers", "hpcvod.launchers"),
    "schedulers": ("hpcvod.cli", "hpcvod.jobs"),
    "launchers": ("hpcvod.cli", "hpcvod.jobs", "hpcvod.schedulers"),
}


SUBMISSION_SIDE = ("hpcvod.cli", "hpcvod.jobs", "hpcvod.schedulers", "hpcvod.launchers", "hpcvod.sites",
                   "hpcvod.machine", "hpcvod.containers")
# the worker side: the runtime, the frameworks and the packages users import (`import hpcvod.torch as hvd`)
WORKER_SIDE = tuple(name for name in ("runtime", "frameworks", "torch", "tensorflow", "keras", "mxnet", "common")
                    if (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file())


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str = "", text: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path`` (or in ``text``, read as that file); ``module``: the
    file's own dotted name, which resolves relative imports (without it they are skipped)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level and module:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            if node.module:
                found.append((node.lineno, f"{base}.{node.module}"))
            else:   # from .. import jobs: the names are modules
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _worker_files() -> list[Path]:
    files: list[Path] = []
    for name in WORKER_SIDE:
        files += sorted((PACKAGE / name).rglob("*.py")) if (PACKAGE / name).is_dir() else [PACKAGE / f"{name}.py"]
    return files


def _reaches(name: str, rooms: tuple[str, ...]) -> bool:
    return any(name == room or name.startswith(room + ".") for room in rooms)


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


def test_the_worker_side_never_imports_the_submission_side() -> None:
    files = _worker_files()
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line}: imports {name}"
             for path in files for line, name in _imports(path, _module_of(path))
             if _reaches(name, SUBMISSION_SIDE)]
    assert not wrong, "the runtime and the frameworks must run without the submission side:\n" + "\n".join(wrong)
    assert len(files) > 30 and any(p.parent.name == "runtime" for p in files), files


def test_the_check_resolves_relative_imports() -> None:
    def imports(path: Path, text: str) -> list[str]:
        return [name for _, name in _imports(path, _module_of(path), text)]

    engine = PACKAGE / "runtime" / "engine.py"
    assert imports(engine, "from ..jobs.plan import resolve\n") == ["hpcvod.jobs.plan"]
    assert imports(engine, "def f():\n    from .. import jobs\n") == ["hpcvod.jobs"]
    assert imports(engine, "from .handles import Handle\n") == ["hpcvod.runtime.handles"]
    package = PACKAGE / "frameworks" / "torch" / "__init__.py"
    assert imports(package, "from ...sites import files\n") == ["hpcvod.sites"]
    assert _reaches("hpcvod.jobs.plan", SUBMISSION_SIDE) and not _reaches("hpcvod.jobsx", SUBMISSION_SIDE)


def test_importing_the_worker_side_loads_no_submission_module() -> None:
    """A fresh interpreter that imports hpcvod.torch and hpcvod.runtime (as a training script does) has no
    submission module in sys.modules, whatever way it could have been imported."""
    code = ("import sys, hpcvod.torch, hpcvod.runtime\n"
            f"bad = sorted(m for m in sys.modules if m.startswith({SUBMISSION_SIDE!r}))\n"
            "print('LOADED', bad)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=str(PACKAGE.parent))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOADED []" in proc.stdout, proc.stdout[-3000:]
