"""Scheduler modules, one per batch system: ``slurm``, ``pbs``, ``local`` (and whatever else is dropped in).

``get_scheduler(name)`` imports ``hpcvod.schedulers.<name>`` and returns its ``SCHEDULER`` class; the list of
names (the site schema's ``scheduler`` choices) is the set of modules in this folder, so adding a scheduler is
one module plus one template (see hpcvod/schedulers/base.py).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcvod.schedulers.base import Scheduler
    from hpcvod.sites.loader import Site

_NOT_SCHEDULERS = {"base", "jobfiles"}


def available_schedulers() -> list[str]:
    """Names of the scheduler modules shipped with this hpcvod."""
    here = Path(__file__).parent
    return sorted(p.stem for p in here.glob("*.py") if not p.stem.startswith("_") and p.stem not in _NOT_SCHEDULERS)


def scheduler_class(name: str) -> "type[Scheduler]":
    """The Scheduler subclass of module ``hpcvod.schedulers.<name>``."""
    if name not in available_schedulers():
        raise KeyError(name)
    module = importlib.import_module(f"hpcvod.schedulers.{name}")
    return module.SCHEDULER


def profile_options() -> "dict[str, type[Scheduler]]":
    """What hpcvod.sites is handed to validate a profile: each scheduler's name -> its class, which answers
    hpcvod.sites' SchedulerTraits (its Options dataclass, single_host, launcher_kinds())."""
    return {name: scheduler_class(name) for name in available_schedulers()}


def scheduler_for(site: "Site") -> "Scheduler":
    """The scheduler a loaded site profile names, built with the profile's ``scheduler_options``."""
    return scheduler_class(site.profile.scheduler)(site.scheduler_options)


def known_scheduler(name: object, where: str) -> "type[Scheduler]":
    """``scheduler_class(name)``, or a UserError naming ``where`` the unknown name came from."""
    from hpcvod.support.errors import UserError

    if not isinstance(name, str) or name not in available_schedulers():
        raise UserError(f"{where}: scheduler {name!r}: expected one of {', '.join(available_schedulers())}")
    return scheduler_class(name)
