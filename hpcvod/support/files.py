"""Reading files that users, admins or old job folders hand us: regular files only, of bounded size.

A FIFO named as a site profile or left in a job folder would block a plain ``open`` for ever, a device or
``/dev/zero`` would never end, a huge file would be read whole: each of these is one UserError line instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import secrets
from pathlib import Path
from typing import BinaryIO

from hpcvod.support import safe_read
from hpcvod.support.errors import UserError



def open_regular(path: Path, what: str, nofollow: bool = False) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file. A missing file raises FileNotFoundError
    (callers decide what absence means); anything else that is wrong is a UserError naming the file. With
    ``nofollow`` (every file read from a job folder) a symbolic link there is refused, not read through: another
    user's link to a secret must not be printed by ``hpcvod logs``. The checks are ``safe_read``'s; this is
    their wording for the submission side."""
    try:
        return safe_read.open_regular(path, nofollow)
    except safe_read.Refused as refused:
        raise _user_error(path, what, refused) from None


def read_bounded(path: Path, limit: int, what: str, nofollow: bool = False) -> bytes:
    """The whole file, if it is a regular file of at most ``limit`` bytes (see ``open_regular``)."""
    try:
        return safe_read.read_bounded(path, limit, nofollow)
    except safe_read.Refused as refused:
        if refused.cause == "size":
            raise UserError(f"{path}: {what} is larger than {limit} bytes: expected a small text file") from None
        raise _user_error(path, what, refused) from None


def _user_error(path: Path, what: str, refused: safe_read.Refused) -> UserError:
    if refused.cause == "name":
        return UserError(f"{path!r}: cannot read {what}: {refused}")
    if refused.cause == "link":
        return UserError(f"{path}: cannot read {what}: {refused} (hpcvod reads no link in a job folder)")
    if refused.cause in ("open", "read"):
        return UserError(f"{path}: cannot read {what} ({refused})")
    return UserError(f"{path}: cannot read {what}: {refused}")


def read_text_bounded(path: Path, limit: int, what: str, nofollow: bool = False) -> str:
    """``read_bounded`` decoded as UTF-8; other bytes are a UserError naming the first bad offset."""
    data = read_bounded(path, limit, what, nofollow)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: {what} is not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start})") \
            from None


def write_atomic(path: Path, text: str, mode: int = 0o666, exact: bool = False, dir_fd: int | None = None) -> None:
    """Write ``text`` to a new file beside ``path``, then rename it over ``path``: a reader sees the old file or
    the new one, never half of one, and a symlink at ``path`` is replaced instead of written through. ``mode``
    goes through the umask, as for any new file; with ``exact`` the file gets ``mode`` whatever the umask (set on
    the open file before anything is written: no moment with wider permissions). With ``dir_fd`` (an open
    folder) ``path``'s name is taken in that folder, the path itself never resolved again."""
    where = {} if dir_fd is None else {"dir_fd": dir_fd}
    target = path if dir_fd is None else path.name
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        tmp_name = tmp if dir_fd is None else tmp.name
        try:
            fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                         **where)
            break
        except FileExistsError:
            continue
    try:
        if exact:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:  # argv bytes as given
            f.write(text)
        os.replace(tmp_name, target, **({} if dir_fd is None else {"src_dir_fd": dir_fd, "dst_dir_fd": dir_fd}))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name, **where)
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


# ---- folders no other user can change ---------------------------------------------------------------------

_MAX_LINKS = 40  # symbolic links followed while walking one path (Linux's own limit)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _owner_name(uid: int) -> str:
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _private_group(st: os.stat_result) -> bool:
    """Whether the folder's group is its owner's own (a "user private group": umask 002 makes folders
    group-writable, but nobody else is in that group): named like the owner, the owner's primary group, and no
    other member listed."""
    import grp
    import pwd

    try:
        owner, group = pwd.getpwuid(st.st_uid), grp.getgrgid(st.st_gid)
    except KeyError:
        return False
    return (group.gr_name == owner.pw_name and owner.pw_gid == st.st_gid
            and set(group.gr_mem) <= {owner.pw_name})


def _untrusted(st: os.stat_result, real: str, last: bool) -> str | None:
    """Why another user could change the folder ``real`` (None: nobody but this user and root can): it belongs to
    someone else, or others (or a group with other members) may write it; a sticky folder (/tmp) on the way is
    fine, since there nobody can rename or remove what is not theirs, but not as the jobs folder itself."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"{real} belongs to {_owner_name(st.st_uid)}, not to you or root"
    if st.st_mode & stat.S_ISVTX and not last:
        return None
    mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
    if st.st_mode & stat.S_IWOTH:
        return f"{real} can be written by every user ({mode})"
    if st.st_mode & stat.S_IWGRP and not _private_group(st):
        import grp

        try:
            group = f"group {grp.getgrgid(st.st_gid).gr_name}"
        except KeyError:
            group = f"gid {st.st_gid}"
        return f"{real} can be written by {group} ({mode})"
    return None


def _kind(st: os.stat_result) -> str:
    if stat.S_ISREG(st.st_mode):
        return "a file"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    return next((name for test, name in safe_read.FILE_KINDS if test(st.st_mode)), "not a folder")


def open_private_dir(path: Path, what: str, mode: int) -> tuple[int, Path]:
    """The folder ``path`` opened (a file descriptor, for ``dir_fd=``) and its real path, once no other user can
    change it or any folder above it, as ssh checks ~/.ssh: each is owned by this user or root and writable by
    nobody else (a sticky /tmp-style folder above it aside). The path is walked one folder at a time from /, each
    opened relative to the one before and checked on its open descriptor, so nothing is re-resolved after its
    check; symbolic links on the way are followed only where they are this user's or root's. Missing folders are
    created with exactly ``mode`` whatever the umask (mkdir applies ``mode`` minus the umask; the chmod after it
    only adds back what the umask took), and removed again if the walk then fails. A set-group-id bit a new
    folder inherits (a group's project folder) is kept, so what is written inside stays in that group. Anything
    wrong is one UserError starting with ``what``."""
    text = os.fspath(path)
    if "\0" in text:
        raise UserError(f"{what}: the name holds a NUL byte")
    if not text:
        raise UserError(f"{what}: expected a folder name, got an empty one")
    try:
        start = text if os.path.isabs(text) else os.path.join(os.getcwd(), text)
    except OSError as err:
        raise UserError(f"{what}: the current folder is gone ({err.strerror})") from None
    todo = [part for part in start.split("/") if part not in ("", ".")][::-1]  # a stack: next name last
    stack: list[tuple[int, str]] = []  # (fd, real path) of each folder from / down to the current one
    opened: list[int] = []             # every descriptor this walk opened, closed at its end
    made: list[tuple[int, str]] = []   # (parent fd, name) of each folder this call created, to undo on failure
    links = 0

    def enter(name: str, fd: int, real: str) -> None:
        opened.append(os.open(name, _DIR_FLAGS, dir_fd=fd) if fd >= 0 else os.open(name, _DIR_FLAGS))
        stack.append((opened[-1], real))

    try:
        enter("/", -1, "/")
        while True:
            fd, real = stack[-1]
            problem = _untrusted(os.fstat(fd), real, last=not todo)
            if problem:
                raise UserError(f"{what}: {problem}: another user could swap the folders there for their own, so "
                                "hpcvod writes no job under it (docs/submission.md, trust model)")
            if not todo:
                break
            name = todo.pop()
            if name == "..":
                if len(stack) > 1:
                    stack.pop()
                continue
            child = os.path.join(real, name)
            try:
                enter(name, fd, child)
                continue
            except FileNotFoundError:
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    todo.append(name)  # made a moment ago (by another submit of ours): look again
                    continue
                except OSError as err:
                    raise UserError(f"{what}: cannot create {child} ({err.strerror})") from None
                made.append((fd, name))
                enter(name, fd, child)
                os.fchmod(opened[-1], mode | (os.fstat(opened[-1]).st_mode & stat.S_ISGID))
                continue
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise UserError(f"{what}: cannot open {child} ({err.strerror})") from None
            entry = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISLNK(entry.st_mode):
                raise UserError(f"{what}: {child} is {_kind(entry)}, expected a folder")
            if entry.st_uid not in (os.geteuid(), 0):
                raise UserError(f"{what}: {child} is a symbolic link that belongs to {_owner_name(entry.st_uid)}, "
                                "not to you or root, so hpcvod does not follow it (docs/submission.md, trust model)")
            links += 1
            if links > _MAX_LINKS:
                raise UserError(f"{what}: more than {_MAX_LINKS} symbolic links on the way (a loop?)")
            target = os.readlink(name, dir_fd=fd)
            if target.startswith("/"):
                del stack[1:]
            todo.extend([part for part in target.split("/") if part not in ("", ".")][::-1])
    except BaseException as err:
        for parent, name in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent)
        for fd in opened:
            os.close(fd)
        if isinstance(err, OSError):
            raise UserError(f"{what}: {err.strerror or err}") from None
        raise
    fd, real = stack[-1]
    for other in opened:
        if other != fd:
            os.close(other)
    return fd, Path(real)
