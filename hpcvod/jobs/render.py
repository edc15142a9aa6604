"""LaunchPlan -> batch script, through the Jinja templates in hpcvod/templates.

Every value a template writes goes through ONE filter, ``q`` (``shell.shell_quote``); a value that reaches the
output unquoted and not marked ``Verbatim`` stops the rendering, so a forgotten filter fails the golden tests
instead of opening a shell injection.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcvod.jobs.plan import LaunchPlan
from hpcvod.jobs.shell import Verbatim, shell_quote

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"


class UnquotedValue(Exception):
    """A template wrote a string without the ``q`` filter."""


def _finalize(value: Any) -> Any:
    if isinstance(value, (Verbatim, int)) and not isinstance(value, bool):
        return value
    raise UnquotedValue(f"template wrote {value!r} without |q")


def _bytecode_cache():  # -> jinja2.BytecodeCache | None
    """Compiled templates kept in the user's cache folder: compiling them costs more than the rest of a dry-run.
    Entries are keyed by the template's source checksum, so an edited template is never served stale."""
    import jinja2

    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpcvod" / "templates"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # a read-only home: compile every time
    return jinja2.FileSystemBytecodeCache(str(folder))


@lru_cache(maxsize=1)
def environment():  # -> jinja2.Environment
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             finalize=_finalize, bytecode_cache=_bytecode_cache())
    env.filters["q"] = shell_quote
    return env


def render(plan: LaunchPlan, template: str) -> str:
    """The script for ``plan`` (byte-identical for identical plans: no clocks, no paths of the moment)."""
    for directive in plan.directives:
        if "\n" in directive or "\r" in directive:
            raise ValueError(f"directive {directive!r} spans lines")
    context = {
        "plan": plan,
        "directives": [Verbatim(d) for d in plan.directives],
        "directive_prefix": Verbatim(plan.directive_prefix),
        "setup": [Verbatim(line) for line in plan.setup],
        "env_groups": [(Verbatim(title), pairs) for title, pairs in plan.env_groups],  # titles: constants of plan.py
        "command": Verbatim(" ".join(shell_quote(w) for w in plan.command)) if plan.command else Verbatim("(none)"),
    }
    return environment().get_template(template).render(context)
