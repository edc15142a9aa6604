"""Job folders: one per submission, never reused. They hold the script, the resolved request (request.json),
what the scheduler said (job.json), output.log and the exit status the script records."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from hpcvod.jobs.shell import safe_name
from hpcvod.sites.errors import UserError

DEFAULT_ROOT = "hpcvod-jobs"
REQUEST_FILE = "request.json"
RECORD_FILE = "job.json"


def default_roots() -> list[Path]:
    """Where `status/logs/cancel JOB` look for a job id: $HPCVOD_JOBS_DIR, then ./hpcvod-jobs."""
    roots = [Path(p) for p in os.environ.get("HPCVOD_JOBS_DIR", "").split(os.pathsep) if p]
    return roots + [Path(DEFAULT_ROOT)]


def create_job_dir(root: Path, job_name: str, now: float | None = None) -> Path:
    """A new folder ``root/<name>-<YYYYmmdd-HHMMSS>[-N]``; an existing folder is never reused."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    root.mkdir(parents=True, exist_ok=True)
    base = f"{safe_name(job_name, 48)}-{stamp}"
    for attempt in range(1, 10_000):
        path = root / (base if attempt == 1 else f"{base}-{attempt}")
        try:
            path.mkdir()  # atomic: two submits in the same second get different folders
            return path.resolve()
        except FileExistsError:
            continue
    raise UserError(f"{root}: cannot create a new job folder for {base}")


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None


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
    record = read_json(job_dir / RECORD_FILE)
    request = read_json(job_dir / REQUEST_FILE)
    if not record.get("job_id"):
        raise UserError(f"{job_dir}: not a submitted hpcvod job folder (no job id in {RECORD_FILE})")
    plan = request.get("plan", {})
    return JobRef(job_id=str(record["job_id"]), scheduler=record.get("scheduler") or plan.get("scheduler", ""),
                  site=plan.get("site", ""), site_source=plan.get("site_source", ""), job_dir=job_dir.resolve())


def find_job(arg: str, roots: Iterable[Path] | None = None) -> JobRef | None:
    """A job folder path, a folder name under a jobs root, or a job id recorded in one; None if unknown."""
    path = Path(arg)
    if path.is_dir():
        return ref_from_dir(path)
    roots = list(roots) if roots is not None else default_roots()
    for root in roots:
        if (root / arg).is_dir():
            return ref_from_dir(root / arg)
    for root in roots:
        if not root.is_dir():
            continue
        for record_path in sorted(root.glob(f"*/{RECORD_FILE}"), reverse=True):
            try:
                record = json.loads(record_path.read_text())
            except (OSError, ValueError):
                continue
            if str(record.get("job_id")) == arg:
                return ref_from_dir(record_path.parent)
    return None
