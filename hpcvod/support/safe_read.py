"""Reading files that others hand a process (a checkpoint left by an earlier run, a config another job wrote):
regular files only, of bounded size, and JSON of bounded depth holding finite numbers only.

Standard library only and importing nothing else of hpcvod (the ground floor, ``hpcvod.support``), so that both
halves can use it: the worker side (``hpcvod.runtime``, ``hpcvod.frameworks``) raises its own errors, never the
submission side's UserError (``hpcvod.support.files`` does the same checks for the submission side, in UserError
lines of its own). A FIFO would block a plain
``open`` for ever, ``/dev/zero`` would never end, ``[[[...]]]`` a few thousand levels deep raises RecursionError
in ``json.loads``, and ``Infinity`` or ``1e400`` turns into a float that breaks arithmetic far from the file.
Every refusal is a :class:`Refused` whose text says what is wrong, without the path: callers name the file.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from typing import Any, BinaryIO


class Refused(ValueError):
    """The file, or its content, is not what the caller may read; ``str()`` is the reason (no path).
    ``cause`` says which check refused it ("name", "link", "open", "kind", "read", "size", "content"), so that a
    caller can word its own line (``hpcvod.support.files`` does)."""

    def __init__(self, reason: str, cause: str = "content") -> None:
        super().__init__(reason)
        self.cause = cause


FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: "str | os.PathLike[str]", nofollow: bool = False) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file. FileNotFoundError passes through (callers
    decide what absence means); any other problem is :class:`Refused`. ``nofollow``: a symbolic link is refused."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    try:
        # O_NONBLOCK: opening a FIFO nobody writes to returns at once, so that the fstat below can refuse it
        fd = os.open(path, flags | (os.O_NOFOLLOW if nofollow else 0))
    except FileNotFoundError:
        raise
    except ValueError:
        raise Refused("the name holds a NUL byte", "name") from None
    except OSError as err:
        if nofollow and (err.errno == errno.ELOOP or os.path.islink(path)):
            raise Refused("it is a symbolic link, expected a regular file", "link") from None
        raise Refused(err.strerror or str(err), "open") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")
        raise Refused(f"it is {kind}, expected a regular file", "kind")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: "str | os.PathLike[str]", limit: int, nofollow: bool = False) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes (see :func:`open_regular`)."""
    with open_regular(path, nofollow) as f:
        try:
            data = f.read(limit + 1)   # not st_size alone: a file may grow while it is read
        except OSError as err:
            raise Refused(err.strerror or str(err), "read") from None
    if len(data) > limit:
        raise Refused(f"larger than {limit} bytes", "size")
    return data


# a JSON string (escapes included) or one bracket: the brackets outside strings give the nesting depth
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _reject_constant(name: str) -> Any:
    raise Refused(f"{name} is not a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Refused(f"{text} is not a finite number")
    return value


def load_json(text: "str | bytes", max_depth: int) -> Any:
    """``json.loads`` of text nested at most ``max_depth`` levels deep whose numbers are all finite
    (``NaN``, ``Infinity`` and ``1e400`` are refused); :class:`Refused` otherwise."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise Refused(f"not UTF-8 text (byte {text[err.start]:#04x} at offset {err.start})") from None
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > max_depth:
                raise Refused(f"JSON nested more than {max_depth} levels deep")
        elif bracket in "]}":
            depth -= 1
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite)
    except Refused:
        raise
    except (ValueError, RecursionError) as err:   # RecursionError: cannot happen below max_depth; kept as a guard
        raise Refused(f"not valid JSON ({err})") from None


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words: object, list, string, boolean, null, number."""
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")
