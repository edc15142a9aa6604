"""Site profiles: one YAML file per cluster (docs/sites.md).

Public names: ``SiteProfile`` (the schema, defined once in ``profile.py``), ``Site`` (a loaded profile),
``load_site(name_or_path)``, ``load_site_file(path)``, ``discover_site(requested, hostname)``,
``site_files()``, ``schema()`` and ``UserError``/``ProfileError``.
"""

from __future__ import annotations

from typing import Any

from hpcvod.sites.errors import ProfileError, UserError
from hpcvod.sites.loader import Site, check_base_file, discover_site, load_site, load_site_file, search_dirs, shipped_dir, site_files
from hpcvod.sites.profile import SiteProfile


def schema() -> dict[str, Any]:
    """The published JSON Schema of a site profile, generated from ``SiteProfile`` and the schedulers' options."""
    from hpcvod.schedulers import available_schedulers, scheduler_class
    from hpcvod.sites.spec import json_schema

    out = json_schema(SiteProfile)
    out["$id"] = "https://hpcvod.invalid/schemas/site-profile.json"
    out["title"] = "hpcvod site profile"
    # a profile that extends another may leave the inherited required keys out
    required = out.pop("required", [])
    out["anyOf"] = [{"required": ["extends"]}, {"required": required}]
    branches = []
    for name in available_schedulers():
        options = json_schema(scheduler_class(name).Options)
        options.pop("$schema", None)
        branches.append({"if": {"properties": {"scheduler": {"const": name}}, "required": ["scheduler"]},
                         "then": {"properties": {"scheduler_options": options}}})
    out["allOf"] = branches
    return out


def reference_markdown() -> str:
    """The key reference of docs/sites.md, generated from the same definition as the schema."""
    from hpcvod.schedulers import available_schedulers, scheduler_class
    from hpcvod.sites.spec import field_docs

    def table(rows: list[tuple[str, str, str]]) -> list[str]:
        out = ["| key | expects | meaning |", "|---|---|---|"]
        for key, expected, text in rows:
            out.append(f"| `{key}` | {expected.replace('|', '/')} | {text.replace('|', '/')} |")
        return out

    lines = ["### Profile keys", ""] + table(field_docs(SiteProfile))
    for name in available_schedulers():
        rows = field_docs(scheduler_class(name).Options)
        if rows:
            lines += ["", f"### `scheduler_options` for `scheduler: {name}`", ""]
            lines += table([(f"scheduler_options.{k}", e, t) for k, e, t in rows])
    return "\n".join(lines) + "\n"


__all__ = ["ProfileError", "Site", "SiteProfile", "UserError", "check_base_file", "discover_site", "load_site", "load_site_file",
           "reference_markdown", "schema", "search_dirs", "shipped_dir", "site_files"]
