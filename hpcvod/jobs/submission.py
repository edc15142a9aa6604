"""Submission as the CLI and the Python API both do it: plan, render, job folder, scheduler (watching a job:
hpcvod.jobs.watch)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from hpcvod import __version__
from hpcvod.jobs.jobdir import RECORD_FILE, REQUEST_FILE, JobRef, open_new_job_dir, write_json
from hpcvod.jobs.plan import LaunchPlan, resolve
from hpcvod.jobs.render import render
from hpcvod.jobs.spec import JobSpec
from hpcvod.machine.host import HostFacts
from hpcvod.schedulers import scheduler_for
from hpcvod.schedulers.base import (CANCEL_FILE, CANCELLED, COMPLETED, FAILED, UNKNOWN, JobStatus, read_cancel_marker,
                                    read_exit_file, status_from_exit_file, task_exit_file, write_cancel_marker)
from hpcvod.schedulers.jobfiles import read_json, write_job_file
from hpcvod.support.errors import UserError
from hpcvod.sites.joboptions import array_indexes
from hpcvod.sites.loader import Site


@dataclass(frozen=True)
class Prepared:
    """A job ready to submit (or to print, for --dry-run): its plan and its script."""

    site: Site
    plan: LaunchPlan
    script: str
    script_name: str


def prepare(spec: JobSpec, site: Site, host: HostFacts, command: Sequence[str] = (),
            job_folder: bool = True) -> Prepared:
    """The plan and its script; ``job_folder=False``: the script is written alone (``hpcvod render``)."""
    plan = resolve(spec, site, host, command)
    scheduler = scheduler_for(site)
    script = scheduler.wrap_script(render(plan, scheduler.template, job_folder), plan)  # kubernetes: its manifest
    return Prepared(site=site, plan=plan, script=script, script_name=scheduler.script_name)


def secret_values(names: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of the job's secret variables (``--env KEY``, ``--secret-env KEY``), from the submitting
    environment; a name that is not set there is a UserError (one line, naming it, never a value)."""
    environ = os.environ if environ is None else environ
    missing = [name for name in names if name not in environ]
    if missing:
        raise UserError(f"--env {missing[0]}: not set in this environment (a secret KEY without =VALUE takes "
                        "its value from the environment hpcvod is submitting from)")
    return {name: environ[name] for name in names}


def submit_prepared(prepared: Prepared, jobs_root: Path, extra_request: dict | None = None,
                    root_option: str = "jobs folder") -> JobRef:
    """Write a new job folder and hand it to the scheduler; if the scheduler refuses, the folder goes away. A jobs
    root another user could change is refused first (one UserError line starting ``<root_option> <jobs_root>``,
    nothing created); the files are written relative to the open folder (jobdir.open_new_job_dir)."""
    plan = prepared.plan
    secrets = secret_values(plan.secret_env)  # before any folder exists: a missing one is one line, nothing left
    with open_new_job_dir(jobs_root, plan.job_name, shared=plan.shared_job_dir, what=root_option) as new:
        job_dir = new.path
        try:
            script = job_dir / prepared.script_name
            write_job_file(script, prepared.script, executable=True, folder_fd=new.fd)
            write_json(job_dir / REQUEST_FILE, {
                "hpcvod_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": list(plan.command), "script": prepared.script_name, "plan": plan.to_dict(),
                "secret_env": list(plan.secret_env), **(extra_request or {})}, folder_fd=new.fd)
            scheduler = scheduler_for(prepared.site)
            submitted = scheduler.submit(job_dir, script, secrets)
            write_json(job_dir / RECORD_FILE, {"job_id": submitted.job_id, "scheduler": scheduler.name,
                                               "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **submitted.extra},
                       folder_fd=new.fd)
        except BaseException:
            new.remove()  # nothing half-done: no folder for a job that does not exist
            raise
    return JobRef(job_id=submitted.job_id, scheduler=scheduler.name, site=plan.site, site_source=plan.site_source,
                  job_dir=job_dir)


def scheduler_of(ref: JobRef):  # -> Scheduler
    """The scheduler object for a job, with the options of the site it was submitted to when still loadable.
    The job id is checked here too, for JobRefs made by hand (the Python API): no command gets an id that is
    not of its scheduler's form."""
    from hpcvod.schedulers import known_scheduler

    cls = known_scheduler(ref.scheduler, f"job {ref.job_id!r}")
    cls.check_job_id(ref.job_id)
    site = site_of(ref)
    return scheduler_for(site) if site is not None else cls()


def site_of(ref: JobRef):  # -> Site | None
    """The site profile the job was submitted with, while it still loads and names the job's scheduler (None: it
    changed since, or is gone; the scheduler's defaults still know how to ask)."""
    from hpcvod.schedulers import profile_options
    from hpcvod.sites.loader import load_site_file

    if ref.site_source and os.path.isfile(ref.site_source):
        try:
            site = load_site_file(ref.site_source, schedulers=profile_options())
            if site.profile.scheduler == ref.scheduler:
                return site
        except UserError:
            pass
    return None


MAX_TASKS_ASKED = 100  # an array's tasks asked one by one; beyond that, the unfinished ones show the job's state


def job_status(ref: JobRef, status: JobStatus | None = None) -> JobStatus:
    """Where the job stands: ``status`` (what its scheduler answered, e.g. for a whole listing) or the scheduler's
    answer now, then an array job's tasks' exit files where the scheduler has forgotten it."""
    status = status if status is not None else scheduler_of(ref).status(ref.job_id, ref.job_dir)
    if status.state == UNKNOWN and _array_spec(ref):  # forgotten by the scheduler: the tasks' exit files tell
        codes = [read_exit_file(ref.job_dir, task_exit_file(i)) for i in array_indexes(_array_spec(ref))[0]]
        if None not in codes:
            failed = [c for c in codes if c]
            return JobStatus(FAILED if failed else COMPLETED, raw=f"{len(codes) - len(failed)} of {len(codes)} "
                             "tasks exit 0", exit_code=failed[0] if failed else 0, source="the tasks' exit files")
    return status


def _array_spec(ref: JobRef) -> str | None:
    """The --array SPEC the job folder's request.json records (None: not an array job, or no folder)."""
    if ref.job_dir is None:
        return None
    plan = read_json(ref.job_dir / REQUEST_FILE).get("plan")
    options = plan.get("options") if isinstance(plan, dict) else None
    spec = options.get("array") if isinstance(options, dict) else None
    if spec is not None and not isinstance(spec, str):
        raise UserError(f"{ref.job_dir / REQUEST_FILE}: plan.options.array: expected a string, got {spec!r}")
    return spec


def job_world_size(ref: JobRef) -> int | None:
    """The training's number of ranks, as the job folder's request.json records it (None: no folder, or no
    whole number recorded there)."""
    if ref.job_dir is None:
        return None
    plan = read_json(ref.job_dir / REQUEST_FILE).get("plan")
    size = plan.get("world_size") if isinstance(plan, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def job_has_data_service(ref: JobRef) -> bool:
    """Whether the job was submitted with a tf.data service compute job (its own ranks, in data-service.log)."""
    if ref.job_dir is None:
        return False
    plan = read_json(ref.job_dir / REQUEST_FILE).get("plan")
    return isinstance(plan, dict) and bool(plan.get("data_service"))


def array_task_states(ref: JobRef) -> list[tuple[int, JobStatus]]:
    """Each task of an array job with where it stands ([] for a job that is no array): its exit file once it has
    ended, else what the scheduler says of that task (or, where it cannot be asked, of the whole job)."""
    spec = _array_spec(ref)
    if spec is None:
        return []
    scheduler = scheduler_of(ref)
    indexes = array_indexes(spec)[0]
    whole: JobStatus | None = None
    out = []
    for index in indexes:
        status = status_from_exit_file(ref.job_dir, task_exit_file(index))
        task_id = scheduler.task_job_id(ref.job_id, index)
        if status is None and task_id is not None and len(indexes) <= MAX_TASKS_ASKED:
            status = scheduler.status(task_id, None)
        if status is None:
            whole = whole or scheduler.status(ref.job_id, ref.job_dir)
            status = whole if not whole.finished else JobStatus(UNKNOWN, reason="no exit file", source="none")
        out.append((index, status))
    return out


DATA_SERVICE_PARTS = ("data service", "training")  # the components of a job with a data service, in order


def component_states(ref: JobRef) -> list[tuple[str, JobStatus]]:
    """Each part of a job submitted with a tf.data service compute job, where its scheduler runs them as separate
    components (Slurm's heterogeneous job: the compute part, then the training); [] for any other job."""
    if not job_has_data_service(ref):
        return []
    scheduler = scheduler_of(ref)
    out = []
    for index, part in enumerate(DATA_SERVICE_PARTS):
        component = scheduler.component_job_id(ref.job_id, index)
        if component is None:
            return []
        out.append((part, scheduler.status(component, None)))
    if all(status.state == UNKNOWN for _, status in out):
        return []  # the scheduler has forgotten the job: its exit file (the job's own line) is all there is
    return out


def cancel_job(ref: JobRef) -> JobStatus | None:
    """Mark the folder (so the job's end reads CANCELLED), then ask the scheduler; a refusal takes back a mark
    this call made. A job known to have ended (an exit status, or cancelled) is left as it is (its mark would turn
    a FAILED into CANCELLED): its status is returned, else None."""
    scheduler = scheduler_of(ref)
    status = job_status(ref)
    if status.finished and (status.exit_code is not None or status.state == CANCELLED):
        return status
    marked_before = read_cancel_marker(ref.job_dir)
    write_cancel_marker(ref.job_dir)
    try:
        scheduler.cancel(ref.job_id, ref.job_dir)
    except BaseException:
        if ref.job_dir is not None and not marked_before:
            (ref.job_dir / CANCEL_FILE).unlink(missing_ok=True)
        raise
    return None


def job_mpi_check(plan: LaunchPlan) -> tuple[str | None, str]:
    """(a one-line refusal or None, the comparison as `doctor` shows it): the MPI the job's Python loads with the
    job's environment against the site's flavour, checked before anything is queued."""
    problem, comparison, _ = _job_mpi_comparison(plan)
    return problem, comparison


def job_mpi_verdict(plan: LaunchPlan) -> tuple[str, str]:
    """`doctor`'s row for the same check: ("ok", ...) only when both MPIs were seen and agree, ("FAIL", the
    refusal), or ("--", why it could not be compared here)."""
    problem, comparison, compared = _job_mpi_comparison(plan)
    return ("FAIL", problem) if problem else ("ok" if compared else "--", comparison)


def _job_mpi_comparison(plan: LaunchPlan) -> tuple[str | None, str, bool]:
    from hpcvod.launchers import without_outer_launch
    from hpcvod.machine.flavour import FLAVOUR_NAMES, job_mpi, job_python, mismatch, unknowable

    promised = f"site {plan.site} launches {FLAVOUR_NAMES.get(plan.mpi_flavour, plan.mpi_flavour)}"
    why_not = unknowable(plan.container, plan.modules, plan.setup)
    python = job_python(plan.program_argv)
    if why_not or python is None:
        return None, f"{promised}; not checked here: {why_not or 'the job runs no Python'}", False
    found = job_mpi(python, {**without_outer_launch(os.environ), **plan.env})
    problem = mismatch(plan.site, plan.mpi_flavour, found)
    # a Python that loads no MPI (or one not told apart) leaves nothing to compare: the job itself will say so
    return problem, f"{promised}; the job's Python {found.describe()}", found.flavour is not None


def refuse_another_mpi(plan: LaunchPlan) -> None:
    """``submit``'s check (CLI and Python API): a job whose Python would load another MPI than the site launches
    is refused in one line, before it waits in a queue only to start N one-rank worlds."""
    problem, _ = job_mpi_check(plan)
    if problem:
        raise UserError(problem)
