"""The files of a job folder: the modes they get (private, or group-readable when shared) and how hpcvod writes
and reads them. Beside the scheduler modules, which write job.json, the cancel mark and output.log through it, and
below hpcvod/jobs/jobdir.py, which creates and finds the folders."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hpcvod.support.errors import UserError
from hpcvod.support.safe_read import json_kind
from hpcvod.support.files import open_append, open_regular, read_text_bounded, write_atomic

RECORD_FILE = "job.json"      # what the scheduler said (written at submit)
MAX_JSON_BYTES = 1 << 20  # what hpcvod writes there is a few KiB


@dataclass(frozen=True)
class JobModes:
    """Permissions of a job folder and what hpcvod writes in it: private to the owner by default, readable by
    the group (never by others) when the user or the site profile shares job folders (docs/submission.md)."""

    folder: int
    file: int
    script: int
    umask: int  # what the rendered script sets before it writes anything (its logs, exitcode)

    @property
    def shared(self) -> bool:
        return bool(self.folder & 0o070)


PRIVATE = JobModes(folder=0o700, file=0o600, script=0o700, umask=0o077)
SHARED = JobModes(folder=0o750, file=0o640, script=0o750, umask=0o027)


def job_modes(shared: bool) -> JobModes:
    return SHARED if shared else PRIVATE


def modes_of(job_dir: Path | int) -> JobModes:
    """The modes for files written later into an existing job folder (job.json, the cancel mark, output.log):
    shared if the folder (a path, or an open descriptor) itself lets its group in."""
    try:
        return job_modes(bool(os.stat(job_dir).st_mode & 0o070))
    except OSError:
        return PRIVATE


def write_job_file(path: Path, text: str, executable: bool = False, folder_fd: int | None = None) -> None:
    """THE way hpcvod writes a file into a job folder: in one step (write_atomic), with the folder's modes
    (owner-only, or group-readable in a shared folder) whatever the umask. With ``folder_fd`` (the job folder
    submit has just created, open) the file is made in that folder, its path never resolved again."""
    modes = modes_of(path.parent if folder_fd is None else folder_fd)
    write_atomic(path, text, mode=modes.script if executable else modes.file, exact=True, dir_fd=folder_fd)


def open_job_log(path: Path):  # -> BinaryIO
    """A log in a job folder opened for appending; created with the folder's file mode whatever the umask."""
    return open_append(path, modes_of(path.parent).file)


def open_job_file(path: Path, what: str) -> BinaryIO:
    """THE way hpcvod opens a file of a job folder for reading (output.log, a task's log): a regular file, never
    through a symbolic link, and a FIFO refused without waiting (open_regular)."""
    return open_regular(path, what, nofollow=True)


def read_job_text(path: Path, limit: int, what: str) -> str:
    """A small text file of a job folder (job.json, request.json, exitcode) read as ``open_job_file`` opens it."""
    return read_text_bounded(path, limit, what, nofollow=True)


def read_json(path: Path) -> dict[str, Any]:
    """A job folder's JSON object; {} when the file is missing, a UserError naming it when it is anything but
    the JSON object hpcvod wrote (empty, truncated, not UTF-8, a list, a FIFO, a symbolic link, huge)."""
    try:
        text = read_job_text(path, MAX_JSON_BYTES, "job file")
    except FileNotFoundError:
        return {}
    if not text.strip():
        raise UserError(f"{path}: empty file: expected the JSON object hpcvod wrote there")
    try:
        data = json.loads(text)
    except ValueError as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply: expected the JSON object hpcvod wrote there") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got a JSON {json_kind(data)}")
    return data
