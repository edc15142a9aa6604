"""Reading files that users, admins or old job folders hand us: regular files only, of bounded size.

A FIFO named as a site profile or left in a job folder would block a plain ``open`` for ever, a device or
``/dev/zero`` would never end, a huge file would be read whole: each of these is one UserError line instead.
"""

from __future__ import annotations

import contextlib
import os
import stat
import secrets
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


def write_atomic(path: Path, text: str, mode: int = 0o666, exact: bool = False) -> None:
    """Write ``text`` to a new file beside ``path``, then rename it over ``path``: a reader sees the old file or
    the new one, never half of one, and a symlink at ``path`` is replaced instead of written through. ``mode``
    goes through the umask, as for any new file; with ``exact`` the file gets ``mode`` whatever the umask (set on
    the open file before anything is written: no moment with wider permissions)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            break
        except FileExistsError:
            continue
    try:
        if exact:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:  # argv bytes as given
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_append(path: Path, mode: int) -> BinaryIO:
    """``path`` opened for appending (never through a symlink). A new file gets exactly ``mode`` whatever the
    umask (set on the open file before anything is written); an existing one keeps its own."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return os.fdopen(os.open(path, flags), "ab")
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def make_dir(path: Path, mode: int) -> None:
    """A new folder with exactly ``mode``, whatever the umask. mkdir already applies ``mode`` minus the umask,
    which is never wider than ``mode``: the chmod after it only adds back what the umask took. A set-group-id bit
    the folder inherits (a group's project folder) is kept, so what is written inside stays in that group."""
    os.mkdir(path, mode)
    os.chmod(path, mode | (os.stat(path).st_mode & stat.S_ISGID))
