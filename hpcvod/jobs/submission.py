"""Submission as the CLI and the Python API both do it: plan, render, job folder, scheduler, watch."""

from __future__ import annotations

import codecs
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from hpcvod import __version__
from hpcvod.jobs.host import HostFacts
from hpcvod.jobs.jobdir import RECORD_FILE, REQUEST_FILE, JobRef, create_job_dir, write_json
from hpcvod.jobs.plan import LaunchPlan, resolve
from hpcvod.jobs.render import render
from hpcvod.jobs.spec import JobSpec
from hpcvod.schedulers import scheduler_for
from hpcvod.schedulers.base import CANCEL_FILE, JobStatus, read_cancel_marker, write_cancel_marker
from hpcvod.schedulers.jobfiles import write_job_file
from hpcvod.sites.errors import UserError
from hpcvod.sites.files import open_regular
from hpcvod.sites.loader import Site


@dataclass(frozen=True)
class Prepared:
    """A job ready to submit (or to print, for --dry-run): its plan and its script."""

    site: Site
    plan: LaunchPlan
    script: str
    script_name: str


def prepare(spec: JobSpec, site: Site, host: HostFacts, command: Sequence[str] = ()) -> Prepared:
    plan = resolve(spec, site, host, command)
    scheduler = scheduler_for(site)
    return Prepared(site=site, plan=plan, script=render(plan, scheduler.template), script_name=scheduler.script_name)


def secret_values(names: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of the job's secret variables (``--env KEY``, ``--secret-env KEY``), from the submitting
    environment; a name that is not set there is a UserError (one line, naming it, never a value)."""
    environ = os.environ if environ is None else environ
    missing = [name for name in names if name not in environ]
    if missing:
        raise UserError(f"--env {missing[0]}: not set in this environment (a secret KEY without =VALUE takes "
                        "its value from the environment hpcvod is submitting from)")
    return {name: environ[name] for name in names}


def submit_prepared(prepared: Prepared, jobs_root: Path, extra_request: dict | None = None) -> JobRef:
    """Write a new job folder and hand it to the scheduler; if the scheduler refuses, the folder goes away."""
    plan = prepared.plan
    secrets = secret_values(plan.secret_env)  # before any folder exists: a missing one is one line, nothing left
    job_dir = create_job_dir(jobs_root, plan.job_name, shared=plan.shared_job_dir)
    try:
        script = job_dir / prepared.script_name
        write_job_file(script, prepared.script, executable=True)
        write_json(job_dir / REQUEST_FILE, {
            "hpcvod_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": list(plan.command), "script": prepared.script_name, "plan": plan.to_dict(),
            "secret_env": list(plan.secret_env), **(extra_request or {})})
        scheduler = scheduler_for(prepared.site)
        submitted = scheduler.submit(job_dir, script, secrets)
        write_json(job_dir / RECORD_FILE, {"job_id": submitted.job_id, "scheduler": scheduler.name,
                                           "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **submitted.extra})
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)  # nothing half-done: no folder for a job that does not exist
        raise
    return JobRef(job_id=submitted.job_id, scheduler=scheduler.name, site=plan.site, site_source=plan.site_source,
                  job_dir=job_dir)


def scheduler_of(ref: JobRef):  # -> Scheduler
    """The scheduler object for a job, with the options of the site it was submitted to when still loadable.
    The job id is checked here too, for JobRefs made by hand (the Python API): no command gets an id that is
    not of its scheduler's form."""
    from hpcvod.schedulers import known_scheduler, profile_options
    from hpcvod.sites.loader import load_site_file

    cls = known_scheduler(ref.scheduler, f"job {ref.job_id!r}")
    cls.check_job_id(ref.job_id)
    if ref.site_source and os.path.isfile(ref.site_source):
        try:
            site = load_site_file(ref.site_source, schedulers=profile_options())
            if site.profile.scheduler == ref.scheduler:
                return scheduler_for(site)
        except UserError:
            pass  # the profile changed since: the default options still know how to ask
    return cls()


def job_status(ref: JobRef) -> JobStatus:
    return scheduler_of(ref).status(ref.job_id, ref.job_dir)


def cancel_job(ref: JobRef) -> None:
    """Mark the folder (so the job's end reads CANCELLED), then ask the scheduler; a refusal takes back a mark
    this call made."""
    scheduler = scheduler_of(ref)
    marked_before = read_cancel_marker(ref.job_dir)
    write_cancel_marker(ref.job_dir)
    try:
        scheduler.cancel(ref.job_id, ref.job_dir)
    except BaseException:
        if ref.job_dir is not None and not marked_before:
            (ref.job_dir / CANCEL_FILE).unlink(missing_ok=True)
        raise


def describe(ref: JobRef, status: JobStatus) -> str:
    text = f"job {ref.job_id}: {status.state}"
    if status.exit_code is not None and status.finished:
        text += f" (exit {status.exit_code})"
    if status.reason and status.reason not in ("None", "(null)") and not status.finished:
        text += f" [{status.reason}]"
    return text


def wait_for(ref: JobRef, stream=None, poll_seconds: float | None = None,
             sleep: Callable[[float], None] = time.sleep) -> JobStatus:
    """Poll until the job ends, showing its state on one live line (a TTY) or a line per change (otherwise)."""
    stream = stream or sys.stderr
    scheduler = scheduler_of(ref)
    poll = poll_seconds if poll_seconds is not None else scheduler.poll_seconds
    live = hasattr(stream, "isatty") and stream.isatty()
    start = time.monotonic()
    last = None
    while True:
        status = scheduler.status(ref.job_id, ref.job_dir)
        elapsed = time.monotonic() - start
        text = describe(ref, status)
        if live:
            stream.write(f"\r\x1b[K{text}  {int(elapsed) // 60:d}:{int(elapsed) % 60:02d}")
            stream.flush()
        elif text != last:
            stream.write(text + "\n")
            stream.flush()
        last = text
        if status.finished:
            if live:
                stream.write("\n")
                stream.flush()
            return status
        sleep(poll)


def follow_output(ref: JobRef, out, poll_seconds: float | None = None, follow: bool = True,
                  sleep: Callable[[float], None] = time.sleep) -> None:
    """Copy the job's output to ``out``; with ``follow``, keep copying until the job has ended."""
    path = ref.output
    if path is None:
        return
    scheduler = scheduler_of(ref)
    poll = poll_seconds if poll_seconds is not None else min(scheduler.poll_seconds, 1.0)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two reads
    position = 0
    while True:
        finished = not follow or scheduler.status(ref.job_id, ref.job_dir).finished
        try:
            with open_regular(path, "job output") as f:  # a FIFO or folder there: one line, not a hang
                f.seek(position)
                while chunk := f.read(1 << 20):
                    position += len(chunk)
                    out.write(decoder.decode(chunk))
        except FileNotFoundError:
            pass
        out.flush()
        if finished:
            out.write(decoder.decode(b"", final=True))
            out.flush()
            return
        sleep(poll)
