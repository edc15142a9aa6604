"""``hpcvod run --as-horovod``: a Horovod script runs with no line changed, ``import horovod.X`` loading ``hpcvod.X``.

Opt-in, for one run only: ``hpcvod run --as-horovod`` puts the folder ``site/`` beside this file first on the
ranks' PYTHONPATH; its ``sitecustomize`` installs ``HorovodAlias`` at the front of ``sys.meta_path`` in every
Python process of the run (the ranks and their children) and then runs the sitecustomize it hides, if any.
Nothing is installed by default, and the run is refused where a real ``horovod`` package is importable (two
packages answering to one name would make it unclear which one trained). Only the standard library here: the
line labeller loads this too.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Mapping

from hpcvod.support.errors import UserError

SITE_DIR = str(Path(__file__).resolve().parent / "site")
ALIASED = "horovod"


class _AliasLoader(importlib.abc.Loader):
    """Loads ``horovod.X`` as the module object ``hpcvod.X`` itself (one module under two names)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec   # the import system set the alias's spec: hpcvod.X keeps its own


class HorovodAlias(importlib.abc.MetaPathFinder):
    """``horovod`` and ``horovod.X`` are found as ``hpcvod`` and ``hpcvod.X``."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != ALIASED and not fullname.startswith(ALIASED + "."):
            return None
        name = "hpcvod" + fullname[len(ALIASED):]
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {fullname!r}: hpcvod run --as-horovod loads horovod.X from "
                                      f"hpcvod.X, and hpcvod has no {name!r} (docs/drop-in.md)", name=fullname)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(name), is_package=True)


def install() -> None:
    if not any(isinstance(finder, HorovodAlias) for finder in sys.meta_path):
        sys.meta_path.insert(0, HorovodAlias())


def run_hidden_sitecustomize() -> None:
    """The sitecustomize that SITE_DIR hides (a venv's or a site's), run as Python would have run it."""
    others = [entry for entry in sys.path if os.path.abspath(entry or ".") != SITE_DIR]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def ranks_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that make ``import horovod.X`` load ``hpcvod.X`` in the ranks (their PYTHONPATH, before the
    one ``environ`` gives them); ``UserError`` where a real horovod package is importable here."""
    found = importlib.util.find_spec(ALIASED)
    if found is not None:
        where = found.origin or ", ".join(found.submodule_search_locations or [])
        raise UserError(f"--as-horovod: a real horovod package is importable here ({where}): run the script with "
                         f"horovodrun, or give hpcvod run without --as-horovod in an environment without horovod")
    current = environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": SITE_DIR + (os.pathsep + current if current else "")}
