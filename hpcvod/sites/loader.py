"""Reading site profiles: YAML, ``extends:``, validation with file:line and key path, and discovery."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from hpcvod.support.errors import ProfileError, UserError
from hpcvod.support.files import read_text_bounded
from hpcvod.sites.profile import Schedulers, SiteProfile, choices, profile_problems
from hpcvod.sites.spec import check_keys, from_data


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
NOT_INHERITED = ("hostnames",)  # a profile that extends another does not claim the other's login nodes
# Bounds on what a profile may be: real ones are a few KiB, a handful of levels deep, one or two bases long.
MAX_PROFILE_BYTES = 1 << 20
MAX_DEPTH = 64  # nesting of mappings and lists, aliases expanded
MAX_NODES = 100_000  # values in one file, aliases expanded (YAML aliases can multiply a small file)
MAX_EXTENDS = 16  # profiles in one extends chain


@dataclass(frozen=True)
class Site:
    """A validated profile, where it came from, and its scheduler options (an instance of its scheduler's
    Options dataclass; hpcvod.schedulers.scheduler_for(site) builds the scheduler)."""

    name: str
    source: str
    profile: SiteProfile
    scheduler_options: Any
    data: dict[str, Any]  # the merged YAML data (after extends), for `sites show`


# ---- where profiles live ----------------------------------------------------------------------------------


def shipped_dir() -> Path:
    """The profiles shipped with hpcvod (hpcvod/site_configs is the repository's site-configs/ folder)."""
    return Path(__file__).resolve().parent.parent / "site_configs"


def user_dir(environ: Mapping[str, str] = os.environ) -> Path:
    config = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "hpcvod" / "sites"


def search_dirs(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """Where profiles are looked up by name, first match wins: $HPCVOD_SITE_PATH (the admins'), the user's
    ~/.config/hpcvod/sites, then the shipped ones."""
    dirs = [Path(p) for p in environ.get("HPCVOD_SITE_PATH", "").split(os.pathsep) if p]
    return dirs + [user_dir(environ), shipped_dir()]


def site_files(environ: Mapping[str, str] = os.environ, include_bases: bool = False) -> dict[str, Path]:
    """Every profile that can be named, name -> file (earlier folders shadow later ones).
    Files whose name starts with '_' are bases for ``extends`` and are listed only on request."""
    found: dict[str, Path] = {}
    for folder in search_dirs(environ):
        if not os.path.isdir(folder):
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix in (".yaml", ".yml") and (include_bases or not path.stem.startswith("_")):
                found.setdefault(path.stem, path)
    return found


def _looks_like_path(text: str) -> bool:
    return os.sep in text or text.endswith((".yaml", ".yml"))


# ---- loading ----------------------------------------------------------------------------------------------


def _checked_text(path: Path) -> str:
    """The file's text, once it is known to be a regular file of bounded size whose YAML nests at most MAX_DEPTH
    levels and holds at most MAX_NODES values, aliases counted expanded. The YAML parser and composer recurse once
    per level: a hostile file of "[[[[..." would otherwise crash the interpreter or eat the memory."""
    try:
        text = read_text_bounded(path, MAX_PROFILE_BYTES, "site profile")
    except FileNotFoundError:
        raise UserError(f"{path}: no such site profile file") from None
    _check_shape(text, path)
    return text


def _check_shape(text: str, path: Path) -> None:
    """Walk the YAML events (a flat stream, no recursion) and stop at the first level or value too many."""
    open_nodes: list[list[Any]] = []  # per open mapping/list: [anchor, values inside, levels below]
    anchored: dict[str, tuple[int, int]] = {}  # anchor -> (values, levels) of its node, for aliases

    def close(anchor: str | None, values: int, levels: int, mark: Any) -> None:
        if anchor:
            anchored[anchor] = (values, levels)
        if open_nodes:
            parent = open_nodes[-1]
            parent[1] += values
            parent[2] = max(parent[2], levels + 1)
            if len(open_nodes) + levels > MAX_DEPTH:
                raise UserError(f"{path}:{mark.line + 1}: nested more than {MAX_DEPTH} levels deep "
                                f"(aliases expanded): expected a site profile")
            if parent[1] > MAX_NODES:
                raise UserError(f"{path}:{mark.line + 1}: more than {MAX_NODES} values (aliases expanded): "
                                f"expected a site profile")

    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.CollectionStartEvent):
                if len(open_nodes) >= MAX_DEPTH:
                    raise UserError(f"{path}:{event.start_mark.line + 1}: nested more than {MAX_DEPTH} levels "
                                    f"deep: expected a site profile")
                open_nodes.append([event.anchor, 1, 0])
            elif isinstance(event, yaml.CollectionEndEvent):
                anchor, values, levels = open_nodes.pop()
                close(anchor, values, levels, event.start_mark)
            elif isinstance(event, yaml.ScalarEvent):
                close(event.anchor, 1, 0, event.start_mark)
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in anchored:  # a node that holds an alias to itself would never end
                    raise UserError(f"{path}:{event.start_mark.line + 1}: alias *{event.anchor} is undefined or "
                                    f"inside the node it names: expected an alias to an earlier, complete node")
                close(None, *anchored[event.anchor], event.start_mark)
    except yaml.YAMLError as err:
        if "nesting depth" in str(getattr(err, "problem", None) or ""):
            # PyYAML >= 6.0.4 has its own limit (1000), which its scanner, reading flow collections ahead of the
            # events, can reach before the check above sees level 65: the same file, the same answer
            mark = getattr(err, "problem_mark", None)
            raise UserError(f"{path}{f':{mark.line + 1}' if mark else ''}: nested more than {MAX_DEPTH} levels "
                            f"deep: expected a site profile") from None
        raise _yaml_error(path, err) from None


def _yaml_error(path: Path, err: Exception) -> UserError:
    mark = getattr(err, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    return UserError(f"{where}: not valid YAML: {problem} (is the file truncated?)")


def _read_yaml(path: Path) -> dict[str, Any]:
    text = _checked_text(path)
    try:
        data = yaml.load(text, Loader=_Loader)
    except (yaml.YAMLError, ValueError) as err:  # ValueError: a date like 2024-13-45, an int of 5000 digits
        raise _yaml_error(path, err) from None
    if data is None:
        raise UserError(f"{path}: empty site profile (expected a mapping with scheduler, partitions, launcher, mpi)")
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of profile keys at the top, got a {type(data).__name__}")
    return data


def _line_of(path: Path, key_path: tuple) -> int | None:
    """The line of the deepest part of ``key_path`` present in the file (for error messages only)."""
    try:
        node = yaml.compose(_checked_text(path), Loader=_Loader)
    except (UserError, yaml.YAMLError):
        return None
    line = None
    for part in key_path:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if getattr(k, "value", None) == part]
            if not match:
                break
            line = match[0][0].start_mark.line + 1
            node = match[0][1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else in the child replaces the base's value."""
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _data_with_bases(path: Path, chain: tuple[Path, ...], environ: Mapping[str, str]) -> tuple[dict, list[Path]]:
    """The file's data merged over its ``extends`` chain, and the files that contributed (child first)."""
    data = _read_yaml(path)
    parent = data.get("extends")
    if parent is None:
        return data, [path]
    if not isinstance(parent, str) or not parent.strip():
        raise ProfileError(("extends",), f"expected a profile name or path, got {parent!r}", str(path))
    if _looks_like_path(parent):
        base_path = (path.parent / parent).resolve()
    else:
        files = site_files(environ, include_bases=True)
        base_path = files.get(parent)
        if base_path is None or base_path.resolve() == path.resolve():
            base_path = next((path.parent / f"{parent}{ext}" for ext in (".yaml", ".yml")
                              if os.path.exists(path.parent / f"{parent}{ext}")), None)
        if base_path is None:
            raise ProfileError(("extends",), _no_base(parent, path, files, environ), _where(path, ("extends",)))
    if base_path.resolve() in [p.resolve() for p in chain + (path,)]:
        cycle = " -> ".join(str(p) for p in chain + (path, base_path))
        raise ProfileError(("extends",), f"profiles extend each other in a circle: {cycle}", str(path))
    if len(chain) + 1 >= MAX_EXTENDS:
        raise ProfileError(("extends",), f"more than {MAX_EXTENDS} profiles in one extends chain "
                           f"(from {chain[0] if chain else path}): expected a short chain of bases",
                           _where(path, ("extends",)))
    if not os.path.exists(base_path):
        raise ProfileError(("extends",), f"{base_path} does not exist", _where(path, ("extends",)))
    base, contributors = _data_with_bases(base_path, chain + (path,), environ)
    base = {k: v for k, v in base.items() if k not in NOT_INHERITED and k != "extends"}
    merged = _merge(base, data)
    merged.pop("extends", None)
    return merged, [path] + contributors


def _no_base(name: str, path: Path, files: Mapping[str, Path], environ: Mapping[str, str]) -> str:
    """Why ``extends: name`` found nothing: the nearest name there is, and every folder that was searched."""
    import difflib  # only on the error path

    close = difflib.get_close_matches(name, [n for n, p in files.items() if p.resolve() != path.resolve()], n=1)
    folders = [str(folder) for folder in search_dirs(environ)] + [f"{path.resolve().parent} (beside this file)"]
    return (f"no profile named {name!r} to extend{f'; did you mean {close[0]!r}?' if close else ''} "
            f"(looked for {name}.yaml in: {', '.join(folders)})")


def _where(path: Path, key_path: tuple) -> str:
    line = _line_of(path, key_path)
    return f"{path}:{line}" if line else str(path)


def load_site_file(path: str | Path, environ: Mapping[str, str] = os.environ, *,
                   schedulers: Schedulers) -> Site:
    """Load, merge and validate one profile file against the ``schedulers`` it is handed; every problem is a
    one-line UserError (the first one found: ``validate_site_file`` gives them all)."""
    site, problems = validate_site_file(path, environ, schedulers=schedulers)
    if problems:
        raise problems[0]
    assert site is not None
    return site


def validate_site_file(path: str | Path, environ: Mapping[str, str] = os.environ, *,
                       schedulers: Schedulers) -> tuple[Site | None, list[UserError]]:
    """(the site or None, every problem of the file, each naming its file, line and key). A file that is not
    YAML, or whose extends chain breaks, is one problem; otherwise each key is checked and, once every key is
    valid alone, the rules that tie keys together (profile_problems, crosscheck.cross_problems)."""
    from hpcvod.sites.crosscheck import cross_problems

    path = Path(path)
    try:
        data, contributors = _data_with_bases(path, (), environ)
    except UserError as err:
        return None, [err]
    problems: list[ProfileError] = []
    profile = from_data(SiteProfile, data, choices=choices(schedulers), problems=problems)
    if profile is not None:
        problems += profile_problems(profile, schedulers)
        problems += [p for p in cross_problems(profile) if p.key_path not in [q.key_path for q in problems]]
    traits = schedulers.get(data.get("scheduler")) if isinstance(data.get("scheduler"), str) else None
    options = None
    if traits is not None:
        options = from_data(traits.Options, data.get("scheduler_options") or {}, ("scheduler_options",),
                            problems=problems)
    if problems:
        # name the file (and line) that holds each offending key: the profile itself or one of its bases
        located = []
        for err in problems:
            file = next((p for p in contributors if _line_of(p, err.key_path[:1])), None)
            line = _line_of(file, err.key_path) if file is not None else None
            order = (contributors.index(file) if file is not None else len(contributors), line or 0)
            located.append((order, err.located(f"{file}:{line}" if line else str(file or path))))
        return None, [err for _, err in sorted(located, key=lambda item: item[0])]  # each file top to bottom
    return Site(name=path.stem, source=str(path), profile=profile, scheduler_options=options, data=data), []


def check_base_file(path: str | Path, *, schedulers: Schedulers) -> list[UserError]:
    """Validate a base profile (one that others extend) key by key; required keys may be missing. Every problem
    is returned (each naming the file's line and key), none raised."""
    path = Path(path)
    try:
        data = _read_yaml(path)
    except UserError as err:
        return [err]
    problems: list[ProfileError] = []
    check_keys(SiteProfile, data, choices=choices(schedulers), problems=problems)
    return [err.located(_where(path, err.key_path)) for err in problems]


def site_path(name_or_path: str, origin: str = "--site", environ: Mapping[str, str] = os.environ) -> Path:
    """The file a profile name (looked up in the search folders) or path stands for."""
    if not name_or_path.strip():
        raise UserError(f"empty site name ({origin})")
    if _looks_like_path(name_or_path) or os.path.isfile(name_or_path):  # os.path: a name too long is no file
        if not os.path.lexists(name_or_path):
            raise UserError(f"site file {name_or_path!r} ({origin}): no such file")  # else: it says what it is
        return Path(name_or_path)
    path = site_files(environ, include_bases=True).get(name_or_path)
    if path is None:
        raise _unknown_site(name_or_path, origin, environ)
    return path


def _unknown_site(name: str, origin: str, environ: Mapping[str, str]) -> UserError:
    known = sorted(site_files(environ))
    import difflib

    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return UserError(f"unknown site {name!r} ({origin}): expected one of {', '.join(known)}{hint} "
                     f"(or a path to a .yaml file)")


def load_site(name_or_path: str, origin: str = "--site", environ: Mapping[str, str] = os.environ, *,
              schedulers: Schedulers) -> Site:
    """A profile by name (looked up in the search folders) or by path."""
    return load_site_file(site_path(name_or_path, origin, environ), environ, schedulers=schedulers)


def site_for_host(hostname: str, environ: Mapping[str, str] = os.environ) -> Path | None:
    """The first profile whose ``hostnames`` patterns match this host (read without full validation)."""
    for path in site_files(environ).values():
        try:
            patterns = _read_yaml(path).get("hostnames") or []
        except UserError:
            continue  # a broken profile is reported when it is used, not while guessing
        if isinstance(patterns, list) and any(isinstance(p, str) and fnmatch.fnmatchcase(hostname, p) for p in patterns):
            return path
    return None


def discover_site(requested: str | None, hostname: str, environ: Mapping[str, str] = os.environ, *,
                  schedulers: Schedulers) -> Site:
    """The site a command uses: --site, then $HPCVOD_SITE, then a profile claiming this hostname, then local."""
    if requested:
        return load_site(requested, "--site", environ, schedulers=schedulers)
    if environ.get("HPCVOD_SITE"):
        return load_site(environ["HPCVOD_SITE"], "$HPCVOD_SITE", environ, schedulers=schedulers)
    by_host = site_for_host(hostname, environ)
    if by_host is not None:
        return load_site_file(by_host, environ, schedulers=schedulers)
    return load_site("local", "the default site", environ, schedulers=schedulers)
