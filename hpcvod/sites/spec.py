"""Typed dataclasses as the single definition of a configuration format.

A format is declared once as dataclasses whose fields carry a doc string (``doc(...)``) and whose types
may be annotated with constraints (``Annotated[int, Min(1)]``). From that one declaration this module
derives both directions that would otherwise drift apart:

* ``from_data(cls, data)`` turns parsed YAML into instances, with errors that name the key path and what
  was expected, and a "did you mean" for unknown keys;
* ``json_schema(cls)`` produces the JSON Schema that editors and ``hpcvod sites schema`` publish.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import re
import types
import typing
from typing import Any, Iterator, Literal, Mapping, Sequence, Union

from hpcvod.support.errors import ProfileError

KeyPath = tuple[Union[str, int], ...]


# ---- constraints, used as typing.Annotated[...] extras -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Min:
    """Smallest allowed integer."""

    value: int


@dataclasses.dataclass(frozen=True)
class Above:
    """A number strictly greater than ``value`` (a speed, a size: 0 would mean nothing was declared)."""

    value: float


@dataclasses.dataclass(frozen=True)
class Pattern:
    """Regular expression a string must match in full; ``meaning`` says in words what it expects."""

    regex: str
    meaning: str


@dataclasses.dataclass(frozen=True)
class Choices:
    """A string from a set the caller hands over at validation time (``choices={key: [...]}`` of ``from_data``,
    ``check_keys``, ``json_schema``, ``field_docs``): the format names the set, it does not know who fills it
    (e.g. the scheduler modules that exist, which live above this package)."""

    key: str

    def values(self) -> list[str]:
        given = _GIVEN.get()
        if self.key not in given:
            raise TypeError(f"no choices given for {self.key!r}")  # a caller bug, not a user's mistake
        return list(given[self.key])


_GIVEN: contextvars.ContextVar[Mapping[str, Sequence[str]]] = contextvars.ContextVar("choices", default={})


@contextlib.contextmanager
def _choices(given: Mapping[str, Sequence[str]] | None) -> Iterator[None]:
    token = _GIVEN.set({**_GIVEN.get(), **(given or {})})
    try:
        yield
    finally:
        _GIVEN.reset(token)


# What no line of a profile may hold: a control character (NUL, ESC...; a tab is text) or a line break of any kind.
CONTROL_CHARS = r"\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029"
ONE_LINE = Pattern(rf"[^{CONTROL_CHARS}]*", "one line of text")
ENV_NAME = Pattern(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")


class EnvValue(str):
    """Marker type: an environment value; YAML numbers are accepted and kept as their text."""


def doc(text: str, default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its documentation (the one place a field is described)."""
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={"doc": text})
    return dataclasses.field(default=default, metadata={"doc": text})


# ---- type introspection ----------------------------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return _HINTS[cls]


def _split_annotated(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    if typing.get_origin(tp) is typing.Annotated:
        base, *extras = typing.get_args(tp)
        return base, tuple(extras)
    return tp, ()


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return typing.get_args(tp)
    return None


def _describe(tp: Any) -> str:
    """What a type expects, in words, for error messages."""
    base, extras = _split_annotated(tp)
    for extra in extras:
        if isinstance(extra, Pattern):
            return extra.meaning
        if isinstance(extra, Choices):
            return "one of " + ", ".join(repr(v) for v in extra.values())
        if isinstance(extra, Min) and base is int:
            return f"an integer >= {extra.value}"
        if isinstance(extra, Above) and base is float:
            return f"a number > {extra.value:g}"
    args = _union_args(base)
    if args is not None:
        return " or ".join(_describe(a) for a in args)
    if base is type(None):
        return "nothing (null)"
    if typing.get_origin(base) is Literal:
        values = typing.get_args(base)
        return repr(values[0]) if len(values) == 1 else "one of " + ", ".join(repr(v) for v in values)
    if base is str:
        return "a string"
    if base is EnvValue:
        return "a string or a number"
    if base is int:
        return "an integer"
    if base is float:
        return "a number"
    if base is bool:
        return "true or false"
    if typing.get_origin(base) is list:
        return "a list"
    if typing.get_origin(base) is dict or dataclasses.is_dataclass(base):
        return "a mapping"
    return str(base)


def _got(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


# ---- data -> instances -----------------------------------------------------------------------------------


def from_data(cls: type, data: Any, path: KeyPath = (), choices: Mapping[str, Sequence[str]] | None = None,
              problems: list[ProfileError] | None = None) -> Any:
    """Build a ``cls`` instance from parsed YAML/JSON, raising ProfileError at the first problem. ``choices``
    fills the format's ``Choices`` sets by key. With a ``problems`` list, every problem is appended to it instead
    (each key is checked, also after a bad one) and the result is None if there was any."""
    with _choices(choices), _collecting(problems):
        return _run_collecting(lambda: _convert(cls, data, path))


# ---- every problem in one pass -----------------------------------------------------------------------------

_FOUND: contextvars.ContextVar[list[ProfileError] | None] = contextvars.ContextVar("found", default=None)


class _Reported(ProfileError):
    """A value whose problems are already in the problems list: the parts above it fail without saying more."""


@contextlib.contextmanager
def _collecting(problems: list[ProfileError] | None) -> Iterator[None]:
    token = _FOUND.set(problems)
    try:
        yield
    finally:
        _FOUND.reset(token)


def _run_collecting(convert: Any) -> Any:
    """``convert()``; while collecting, a problem that escapes it is recorded and the answer is None."""
    found = _FOUND.get()
    if found is None:
        return convert()
    try:
        return convert()
    except _Reported:
        return None
    except ProfileError as err:
        found.append(err)
        return None


class _Parts:
    """The parts (keys, items) of one mapping or list: raises at the first problem, or, while collecting,
    records each part's problem, goes on with the next part, and fails as a whole at the end (``done``)."""

    def __init__(self) -> None:
        self.found = _FOUND.get()
        self.failed = False

    def convert(self, convert: Any, *args: Any) -> Any:
        if self.found is None:
            return convert(*args)
        try:
            return convert(*args)
        except _Reported:
            pass
        except ProfileError as err:
            self.found.append(err)
        self.failed = True
        return None

    def problem(self, err: ProfileError) -> None:
        if self.found is None:
            raise err
        self.found.append(err)
        self.failed = True

    def done(self) -> None:
        if self.failed:
            raise _Reported((), "reported above")


def _convert(tp: Any, value: Any, path: KeyPath) -> Any:
    base, extras = _split_annotated(tp)
    args = _union_args(base)
    if args is not None:
        if value is None and type(None) in args:
            return None
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:  # the one option gives the more precise message(s) (e.g. an unknown key deep inside)
            return _convert(non_null[0], value, path)
        with _collecting(None):  # an option that does not fit is no problem while another may
            for option in non_null:
                try:
                    return _convert(option, value, path)
                except ProfileError:
                    pass
        raise ProfileError(path, f"expected {_describe(tp)}, got {_got(value)}")
    if dataclasses.is_dataclass(base):
        return _convert_dataclass(base, value, path)
    if typing.get_origin(base) is Literal:
        if value in typing.get_args(base) and type(value) is not bool:
            return value
        raise ProfileError(path, f"expected {_describe(base)}, got {_got(value)}")
    if typing.get_origin(base) is list:
        if not isinstance(value, list):
            raise ProfileError(path, f"expected a list, got {_got(value)}")
        (item_tp,) = typing.get_args(base)
        parts = _Parts()
        items = [parts.convert(_convert, item_tp, item, path + (i,)) for i, item in enumerate(value)]
        parts.done()
        return items
    if typing.get_origin(base) is dict:
        if not isinstance(value, dict):
            raise ProfileError(path, f"expected a mapping, got {_got(value)}")
        key_tp, val_tp = typing.get_args(base)
        out = {}
        parts = _Parts()
        for key, item in value.items():
            if not isinstance(key, str):
                parts.problem(ProfileError(path, f"keys must be strings, got {_got(key)}"))
                continue
            parts.convert(_convert, key_tp, key, path + (key,))
            out[key] = parts.convert(_convert, val_tp, item, path + (key,))
        parts.done()
        return out
    if base is bool:
        if isinstance(value, bool):
            return value
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            for extra in extras:
                if isinstance(extra, Min) and value < extra.value:
                    raise ProfileError(path, f"expected an integer >= {extra.value}, got {value}")
            return value
    elif base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            for extra in extras:
                if isinstance(extra, Above) and not value > extra.value:
                    raise ProfileError(path, f"expected {_describe(tp)}, got {value}")
            return float(value)
    elif base is EnvValue:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ProfileError(path, f"expected a string or a number (quote yes/no/true/false in YAML), got {_got(value)}")
    elif base is str:
        if isinstance(value, str):
            for extra in extras:
                if isinstance(extra, Pattern) and not re.fullmatch(extra.regex, value):
                    raise ProfileError(path, f"expected {extra.meaning}, got {_got(value)}")
                if isinstance(extra, Choices) and value not in extra.values():
                    raise ProfileError(path, f"expected {_describe(tp)}, got {_got(value)}" + _did_you_mean(value, extra.values()))
            return value
    else:  # pragma: no cover - a type the format should not use
        raise TypeError(f"unsupported field type {base!r}")
    hint = ""
    if base is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        hint = " (YAML reads unquoted numbers and times like 48:00:00 as numbers: quote the value)"
    raise ProfileError(path, f"expected {_describe(tp)}, got {_got(value)}{hint}")


def _did_you_mean(word: str, candidates: list[str]) -> str:
    import difflib  # only on the error path

    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _convert_dataclass(cls: type, value: Any, path: KeyPath) -> Any:
    if not isinstance(value, dict):
        raise ProfileError(path, f"expected a mapping, got {_got(value)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    parts = _Parts()
    for key in value:
        if key not in fields:
            known = sorted(fields)
            hint = _did_you_mean(str(key), known)
            parts.problem(ProfileError(path + (str(key),), f"unknown key{hint or ''}"
                                       + ("" if hint else f" (expected one of: {', '.join(known)})")))
    hints = _hints(cls)
    kwargs = {}
    for name, f in fields.items():
        if name in value:
            kwargs[name] = parts.convert(_convert, hints[name], value[name], path + (name,))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            parts.problem(ProfileError(path + (name,), f"missing required key (expected {_describe(hints[name])})"))
    parts.done()
    return cls(**kwargs)


def check_keys(cls: type, data: Any, path: KeyPath = (), choices: Mapping[str, Sequence[str]] | None = None,
               problems: list[ProfileError] | None = None) -> None:
    """Check the keys present in ``data`` without requiring the required ones (a base for ``extends``); with a
    ``problems`` list, every problem goes there instead of raising the first."""
    with _choices(choices), _collecting(problems):
        _run_collecting(lambda: _check_keys(cls, data, path))


def _check_keys(cls: type, data: Any, path: KeyPath) -> None:
    if not isinstance(data, dict):
        raise ProfileError(path, f"expected a mapping, got {_got(data)}")
    hints = _hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    parts = _Parts()
    for key, value in data.items():
        if key not in fields:
            hint = _did_you_mean(str(key), sorted(fields))
            parts.problem(ProfileError(path + (str(key),), f"unknown key{hint}"))
            continue
        parts.convert(_convert, hints[key], value, path + (key,))
    parts.done()


def to_data(obj: Any) -> Any:
    """Instances back to plain data (for ``sites show`` and the job's resolved request)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_data(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_data(v) for v in obj]
    if isinstance(obj, EnvValue):
        return str(obj)
    return obj


# ---- JSON Schema ------------------------------------------------------------------------------------------


def json_schema(cls: type, choices: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a dataclass format; nested dataclasses go to ``$defs``."""
    defs: dict[str, Any] = {}
    with _choices(choices):
        root = _schema_of(cls, defs, top=True)
    root = {"$schema": "https://json-schema.org/draft/2020-12/schema", **root}
    if defs:
        root["$defs"] = defs
    return root


def _schema_of(tp: Any, defs: dict[str, Any], top: bool = False) -> dict[str, Any]:
    base, extras = _split_annotated(tp)
    args = _union_args(base)
    if args is not None:
        return {"anyOf": [_schema_of(a, defs) for a in args]}
    if base is type(None):
        return {"type": "null"}
    if dataclasses.is_dataclass(base):
        body = _dataclass_schema(base, defs)
        if top:
            return body
        defs.setdefault(base.__name__, body)
        return {"$ref": f"#/$defs/{base.__name__}"}
    if typing.get_origin(base) is Literal:
        return {"enum": list(typing.get_args(base))}
    if typing.get_origin(base) is list:
        return {"type": "array", "items": _schema_of(typing.get_args(base)[0], defs)}
    if typing.get_origin(base) is dict:
        key_tp, val_tp = typing.get_args(base)
        out: dict[str, Any] = {"type": "object", "additionalProperties": _schema_of(val_tp, defs)}
        key_schema = _schema_of(key_tp, defs)
        names = {k: v for k, v in key_schema.items() if k in ("pattern", "enum")}
        if names:
            out["propertyNames"] = names
        return out
    if base is bool:
        return {"type": "boolean"}
    if base is EnvValue:
        return {"type": ["string", "number"]}
    if base in (int, float):
        # an integer's Min is inclusive, a number's Above exclusive
        out = {"type": "integer" if base is int else "number"}
        for extra in extras:
            if isinstance(extra, Min):
                out["minimum"] = extra.value
            if isinstance(extra, Above):
                out["exclusiveMinimum"] = extra.value
        return out
    if base is str:
        out = {"type": "string"}
        for extra in extras:
            if isinstance(extra, Pattern):
                out["pattern"] = f"^(?:{extra.regex})$"
            if isinstance(extra, Choices):
                out["enum"] = list(extra.values())
        return out
    raise TypeError(f"unsupported field type {base!r}")  # pragma: no cover


def _dataclass_schema(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = _hints(cls)
    props = {}
    required = []
    for f in dataclasses.fields(cls):
        prop = _schema_of(hints[f.name], defs)
        if f.metadata.get("doc"):
            prop = {"description": f.metadata["doc"], **prop}
        if f.default is not dataclasses.MISSING and f.default is not None and not dataclasses.is_dataclass(f.default):
            prop["default"] = f.default
        props[f.name] = prop
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
    if cls.__doc__:
        out = {"description": " ".join(cls.__doc__.split()), **out}
    if required:
        out["required"] = required
    return out


def field_docs(cls: type, prefix: str = "", choices: Mapping[str, Sequence[str]] | None = None
               ) -> list[tuple[str, str, str]]:
    """(key path, expected, doc) for every field, nested sections included: the reference table of docs/sites.md."""
    with _choices(choices):
        return _field_docs(cls, prefix)


def _field_docs(cls: type, prefix: str) -> list[tuple[str, str, str]]:
    rows = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = prefix + f.name
        base, _ = _split_annotated(tp)
        args = _union_args(base) or (base,)
        inner = [a for a in args if a is not type(None)]
        rows.append((key, _describe(tp), f.metadata.get("doc", "")))
        for a in inner:
            a_base, _ = _split_annotated(a)
            if dataclasses.is_dataclass(a_base):
                rows.extend(_field_docs(a_base, key + "."))
            elif typing.get_origin(a_base) is dict and dataclasses.is_dataclass(typing.get_args(a_base)[1]):
                rows.extend(_field_docs(typing.get_args(a_base)[1], key + ".<name>."))
    return rows
