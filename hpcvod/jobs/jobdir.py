"""Job folders: one per submission, never reused. They hold the script, the resolved request (request.json),
what the scheduler said (job.json), output.log and the exit status the script records."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from hpcvod.support.shell import safe_name
from hpcvod.schedulers.jobfiles import (RECORD_FILE, job_modes, open_job_file, read_json,
                                       write_job_file)
from hpcvod.support.errors import UserError
from hpcvod.support.files import open_private_dir
from hpcvod.support.safe_read import json_kind

DEFAULT_ROOT = "hpcvod-jobs"
REQUEST_FILE = "request.json"


def default_roots() -> list[Path]:
    """Where `status/logs/cancel JOB` look for a job id: $HPCVOD_JOBS_DIR, then ./hpcvod-jobs."""
    roots = [Path(p) for p in os.environ.get("HPCVOD_JOBS_DIR", "").split(os.pathsep) if p]
    return roots + [Path(DEFAULT_ROOT)]


def open_root(root: Path, shared: bool = False, what: str = "jobs folder") -> tuple[int, Path]:
    """The jobs root opened (a descriptor) with its real path, once no other user can change it or a folder above
    it (``open_private_dir``: else one UserError line starting ``<what> <root>``). Missing folders are created
    private, or group-readable with ``shared``, whatever the umask; an existing root keeps its mode."""
    return open_private_dir(root, f"{what} {root}", job_modes(shared).folder)


def ensure_root(root: Path, shared: bool = False, what: str = "jobs folder") -> Path:
    """``open_root`` for callers that write into the root by path (the Python API's pickles): its real path."""
    fd, real = open_root(root, shared, what)
    os.close(fd)
    return real


@dataclass
class NewJobDir:
    """A job folder just created, open: hpcvod writes its files relative to ``fd`` (write_job_file's
    ``folder_fd``), never through its path again; the scheduler, which needs a path, gets ``path``, a path no
    other user can change (open_private_dir)."""

    path: Path
    fd: int
    root_fd: int

    def remove(self) -> None:
        """The folder and what is in it, through the open root (nothing half-done when a submit fails)."""
        shutil.rmtree(self.path.name, dir_fd=self.root_fd, ignore_errors=True)

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.root_fd)

    def __enter__(self) -> "NewJobDir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_new_job_dir(root: Path, job_name: str, now: float | None = None, shared: bool = False,
                     what: str = "jobs folder") -> NewJobDir:
    """A new folder ``root/<name>-<YYYYmmdd-HHMMSS>[-N]``, opened; an existing folder is never reused. The folder
    (and ``root`` and the folders above it when this creates them; an existing root keeps its mode) is private, or
    group-readable with ``shared``, whatever the umask. ``root`` is checked first (``open_root``)."""
    modes = job_modes(shared)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    root_fd, real_root = open_root(root, shared, what)
    base = f"{safe_name(job_name, 48)}-{stamp}"
    try:
        for attempt in range(1, 10_000):
            name = base if attempt == 1 else f"{base}-{attempt}"
            try:
                os.mkdir(name, modes.folder, dir_fd=root_fd)  # atomic: two submits in one second get two folders
            except FileExistsError:
                continue
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
            os.fchmod(fd, modes.folder | (os.fstat(fd).st_mode & stat.S_ISGID))  # whatever the umask
            return NewJobDir(path=real_root / name, fd=fd, root_fd=root_fd)
    except BaseException:
        os.close(root_fd)
        raise
    os.close(root_fd)
    raise UserError(f"{root}: cannot create a new job folder for {base}")


def create_job_dir(root: Path, job_name: str, now: float | None = None, shared: bool = False) -> Path:
    """``open_new_job_dir``'s folder, by path."""
    with open_new_job_dir(root, job_name, now, shared) as job_dir:
        return job_dir.path


def write_json(path: Path, data: dict[str, Any], folder_fd: int | None = None) -> None:
    write_job_file(path, json.dumps(data, indent=2, sort_keys=True) + "\n", folder_fd=folder_fd)


def _text_field(data: dict[str, Any], key: str, path: Path) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise UserError(f"{path}: {key}: expected a string, got a JSON {json_kind(value)}")
    return value


@dataclass(frozen=True)
class JobRef:
    """A job as `status/logs/cancel` see it: its id, its scheduler and site, and its folder when known."""

    job_id: str
    scheduler: str
    site: str
    site_source: str
    job_dir: Path | None

    @property
    def output(self) -> Path | None:
        from hpcvod.schedulers.base import OUTPUT_FILE

        return self.job_dir / OUTPUT_FILE if self.job_dir else None


def ref_from_dir(job_dir: Path) -> JobRef:
    """The job a folder records, once every file hpcvod reads there is checked: a corrupt folder is one
    UserError naming the file, whichever command reads it."""
    from hpcvod.schedulers import known_scheduler

    record_path, request_path = job_dir / RECORD_FILE, job_dir / REQUEST_FILE
    record = read_json(record_path)
    request = read_json(request_path)
    job_id = record.get("job_id")
    if not job_id:
        raise UserError(f"{job_dir}: not a submitted hpcvod job folder (no job id in {RECORD_FILE})")
    plan = request.get("plan", {})
    if not isinstance(plan, dict):
        raise UserError(f"{request_path}: plan: expected a JSON object, got a JSON {json_kind(plan)}")
    name, source = (record["scheduler"], record_path) if "scheduler" in record else (plan.get("scheduler"), request_path)
    scheduler = known_scheduler(name, str(source))
    scheduler.check_job_id(job_id, str(record_path))
    scheduler.check_record(record, str(record_path))
    _check_outputs(job_dir)
    return JobRef(job_id=job_id, scheduler=scheduler.name, site=_text_field(plan, "site", request_path),
                  site_source=_text_field(plan, "site_source", request_path), job_dir=job_dir.resolve())


def _check_outputs(job_dir: Path) -> None:
    """The files the job and cancel write: an exit status that is no number, an output.log or cancel mark that is
    a folder or a FIFO, is reported now rather than by whichever command happens to read it."""
    from hpcvod.schedulers.base import CANCEL_FILE, OUTPUT_FILE, read_exit_file

    read_exit_file(job_dir)
    for name, what in ((OUTPUT_FILE, "job output"), (CANCEL_FILE, "cancel mark")):
        try:
            open_job_file(job_dir / name, what).close()
        except FileNotFoundError:
            pass  # not there yet


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):  # a name too long for the file system (pathlib lets ENAMETOOLONG through)
        return False


def find_job(arg: str, roots: Iterable[Path] | None = None) -> JobRef | None:
    """A job folder path, a folder name under a jobs root, or a job id recorded in one; None if unknown."""
    path = Path(arg)
    if _is_dir(path):
        return ref_from_dir(path)
    roots = list(roots) if roots is not None else default_roots()
    for root in roots:
        if _is_dir(root / arg):
            return ref_from_dir(root / arg)
    for root in roots:
        if not _is_dir(root):
            continue
        for record_path in sorted(root.glob(f"*/{RECORD_FILE}"), reverse=True):
            try:
                record = read_json(record_path)
            except UserError:
                continue  # a broken folder is reported when it is named, not while searching the others
            if record.get("job_id") == arg:
                return ref_from_dir(record_path.parent)
    return None
