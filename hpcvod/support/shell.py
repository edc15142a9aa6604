"""The one shell-quoting rule of hpcvod, and the marker for text that must reach the script as written."""

import re
import shlex

from hpcvod.support.errors import UserError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Verbatim(str):
    """Script text that hpcvod itself vouches for (a directive it generated, an admin's setup line,
    ``"$PBS_NODEFILE"``): written as is. Everything else that reaches a template goes through ``shell_quote``."""


def shell_quote(value: object) -> Verbatim:
    """One shell word that bash reads back as exactly ``value``; always on one line.

    ``shlex.quote`` for printable text; ANSI-C ``$'...'`` quoting when the text holds newlines or other control
    characters, so a value can never break out of its line (comments, directives) or run as code.
    """
    if isinstance(value, Verbatim):
        return value
    text = str(value)
    if not _CONTROL.search(text):
        return Verbatim(shlex.quote(text))
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif _CONTROL.match(ch):
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return Verbatim("$'" + "".join(out) + "'")


def shell_join(words: "list[str] | tuple[str, ...]") -> Verbatim:
    """Words quoted one by one (Verbatim words kept) and joined by spaces."""
    return Verbatim(" ".join(shell_quote(w) for w in words))


def safe_name(text: str, limit: int = 64) -> str:
    """A job name every scheduler accepts (PBS: starts with a letter, no spaces); the user's own name is
    kept verbatim in HPCVOD_JOB_NAME."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._-") or "job"
    if not name[0].isalpha():
        name = "j" + name
    return name[:limit]


ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a variable name a launcher can forward


def parse_env(items: list[str] | tuple[str, ...], flag: str = "--env") -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` strings -> pairs; the value is kept byte for byte (it may hold '=', quotes, newlines)."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not ENV_KEY.fullmatch(key):
            raise UserError(f"{flag} {item!r}: expected KEY=VALUE with KEY a variable name ([A-Za-z_][A-Za-z0-9_]*)")
        out.append((key, value))
    return tuple(out)
