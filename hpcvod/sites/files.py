"""Reading files that users, admins or old job folders hand us: regular files only, of bounded size.

A FIFO named as a site profile or left in a job folder would block a plain ``open`` for ever, a device or
``/dev/zero`` would never end, a huge file would be read whole: each of these is one UserError line instead.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from hpcvod.sites.errors import UserError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: Path, what: str) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file. A missing file raises FileNotFoundError
    (callers decide what absence means); anything else that is wrong is a UserError naming the file."""
    try:
        # O_NONBLOCK: opening a FIFO that nobody writes to returns at once, so the fstat below can refuse it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise
    except ValueError:  # a NUL byte in the name
        raise UserError(f"{path!r}: cannot read {what}: the name holds a NUL byte") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read {what} ({err.strerror or err})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise UserError(f"{path}: cannot read {what}: it is {kind}, expected a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The whole file, if it is a regular file of at most ``limit`` bytes (see ``open_regular``)."""
    with open_regular(path, what) as f:
        try:
            data = f.read(limit + 1)  # not st_size alone: a file may grow while it is read
        except OSError as err:
            raise UserError(f"{path}: cannot read {what} ({err.strerror or err})") from None
    if len(data) > limit:
        raise UserError(f"{path}: {what} is larger than {limit} bytes: expected a small text file")
    return data


def read_text_bounded(path: Path, limit: int, what: str) -> str:
    """``read_bounded`` decoded as UTF-8; other bytes are a UserError naming the first bad offset."""
    data = read_bounded(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: {what} is not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start})") \
            from None
