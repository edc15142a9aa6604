"""Site profiles: one YAML file per cluster (docs/sites.md).

Public names: ``SiteProfile`` (the schema, defined once in ``profile.py``), ``Site`` (a loaded profile),
``load_site(name_or_path, schedulers=...)``, ``load_site_file(path, schedulers=...)``,
``discover_site(requested, hostname, schedulers=...)``, ``site_files()``, ``schema(schedulers)`` and
``UserError``/``ProfileError``.

This package sits below the scheduler and launcher modules and never imports them: whoever loads a profile hands
over the schedulers it may name, each with its options dataclass, what it can run (``single_host``) and the
launcher kinds that start ranks under it (``SchedulerTraits``; ``hpcvod.schedulers.profile_options()``).
"""

from __future__ import annotations

from typing import Any

from hpcvod.support.errors import ProfileError, UserError
from hpcvod.sites.loader import (Site, check_base_file, discover_site, load_site, load_site_file, search_dirs,
                                 shipped_dir, site_files, site_path, validate_site_file)
from hpcvod.sites.profile import Schedulers, SchedulerTraits, SiteProfile, choices


def schema(schedulers: Schedulers) -> dict[str, Any]:
    """The published JSON Schema of a site profile, generated from ``SiteProfile`` and the options of the
    ``schedulers`` it is handed (name -> the scheduler's class)."""
    from hpcvod.sites.spec import json_schema

    out = json_schema(SiteProfile, choices=choices(schedulers))
    out["$id"] = "https://hpcvod.invalid/schemas/site-profile.json"
    out["title"] = "hpcvod site profile"
    # a profile that extends another may leave the inherited required keys out
    required = out.pop("required", [])
    out["anyOf"] = [{"required": ["extends"]}, {"required": required}]
    branches = []
    for name in sorted(schedulers):
        options = json_schema(schedulers[name].Options)
        options.pop("$schema", None)
        out.setdefault("$defs", {}).update(options.pop("$defs", {}))  # a nested dataclass's $ref is to the root
        branches.append({"if": {"properties": {"scheduler": {"const": name}}, "required": ["scheduler"]},
                         "then": {"properties": {"scheduler_options": options}}})
    out["allOf"] = branches
    return out


def reference_markdown(schedulers: Schedulers) -> str:
    """The key reference of docs/sites.md, generated from the same definition as the schema."""
    from hpcvod.sites.spec import field_docs

    def table(rows: list[tuple[str, str, str]]) -> list[str]:
        out = ["| key | expects | meaning |", "|---|---|---|"]
        for key, expected, text in rows:
            out.append(f"| `{key}` | {expected.replace('|', '/')} | {text.replace('|', '/')} |")
        return out

    lines = ["### Profile keys", ""] + table(field_docs(SiteProfile, choices=choices(schedulers)))
    for name in sorted(schedulers):
        rows = field_docs(schedulers[name].Options)
        if rows:
            lines += ["", f"### `scheduler_options` for `scheduler: {name}`", ""]
            lines += table([(f"scheduler_options.{k}", e, t) for k, e, t in rows])
    return "\n".join(lines) + "\n"


__all__ = ["ProfileError", "SchedulerTraits", "Schedulers", "Site", "SiteProfile", "UserError", "check_base_file", "discover_site", "load_site", "load_site_file",
           "reference_markdown", "schema", "search_dirs", "shipped_dir", "site_files", "site_path",
           "validate_site_file"]
