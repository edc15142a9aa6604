"""What every scheduler module provides, and the job states hpcvod reports.

A scheduler module (``hpcvod/schedulers/<name>.py``) defines one ``Scheduler`` subclass and names it
``SCHEDULER``; its template is ``hpcvod/templates/<name>.j2``. That is all it takes to add one: the site
schema, discovery, the CLI and the golden tests pick it up by name.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Protocol, Sequence

from hpcvod.support.errors import UserError
from hpcvod.schedulers.jobfiles import read_job_text
from hpcvod.sites.joboptions import JobDefaults, JobOptions, flag
from hpcvod.sites.spec import Pattern

# hpcvod's job states; every scheduler maps its own words onto these.
PENDING = "PENDING"
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"
UNKNOWN = "UNKNOWN"
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT})

EXIT_FILE = "exitcode"  # written by every rendered script on exit (docs/submission.md)
OUTPUT_FILE = "output.log"
DATA_SERVICE_LOG = "data-service.log"  # the tf.data service compute job's own log (submit --data-service-nodes)
DATA_SERVICE_CONFIG = "data-service.json"  # its config, for the training ranks (HPCVOD_DATA_SERVICE_CONFIG)
CANCEL_FILE = "cancelled"  # written by `hpcvod cancel` before it asks the scheduler


@dataclass(frozen=True)
class JobStatus:
    """Where a job stands: hpcvod's state, the scheduler's own word, and how we know."""

    state: str
    raw: str = ""
    exit_code: int | None = None
    reason: str = ""
    source: str = ""
    # epoch seconds, where the scheduler says: when the job started (or, pending, is expected to) and ended
    start_time: float | None = None
    end_time: float | None = None

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL


@dataclass(frozen=True)
class Submitted:
    """What a submit returned: the job id and anything the scheduler wants kept in job.json."""

    job_id: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NoOptions:
    """This scheduler has no options."""


class JobRequest(Protocol):
    """What a scheduler reads of a resolved job to write its directives (hpcvod.jobs.plan.LaunchPlan has it all;
    the scheduler modules stay below hpcvod.jobs and only name the fields they use)."""

    scheduler_job_name: str
    nodes: int
    world_size: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    gpu_type: str | None
    time_seconds: int
    partition: str
    account: str | None
    options: JobOptions  # the per-job options, partition defaults merged in, dependency IDs resolved to job ids


class SchedulerError(Exception):
    """A scheduler command failed (sbatch rejected the job, qstat is missing...)."""


class Scheduler:
    """Base of the scheduler modules. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str]
    script_name: ClassVar[str]  # the file name of the rendered script inside the job folder
    directive_prefix: ClassVar[str] = ""  # "#SBATCH", "#PBS"; "" = the scheduler takes no directives
    Options: ClassVar[type] = NoOptions  # dataclass of the profile's `scheduler_options`
    poll_seconds: ClassVar[float] = 5.0  # how often --wait and logs -f ask
    # Every job id this scheduler hands out (and that its commands take), matched whole. The one check that
    # keeps a job id from an edited job.json or the command line ("--user=root") from reaching scancel/qdel
    # as an option; job_id_example is said in the error.
    job_id_pattern: ClassVar[re.Pattern[str]]
    job_id_example: ClassVar[str]
    # The per-job options (hpcvod/sites/joboptions.py) this scheduler writes as directives; any other one given
    # is refused in one line, with the hint below when there is one.
    job_options: ClassVar[frozenset[str]] = frozenset()
    refusal_hints: ClassVar[dict[str, str]] = {}
    # --sched-opt KEY[=VALUE] (docs/submission.md, "Scheduler options"): the form of a KEY this scheduler reads as
    # one option of its own, and the options hpcvod writes itself, KEY -> the hpcvod option that asks for it or why
    # it is hpcvod's. A --sched-opt comes after the generated directives and a scheduler takes the last of a
    # repeated option: it would override what hpcvod computed (the export that carries --secret-env, the log's
    # path, the layout the launcher was told).
    sched_opt_key: ClassVar[Pattern] = Pattern(r"[A-Za-z][A-Za-z0-9_-]*", "an option name without its dashes")
    computed_directives: ClassVar[dict[str, str]] = {}
    # KEYs whose VALUE is a comma-separated list of NAME=VALUE (qsub's -l resources, PBS's -W attributes) -> the
    # NAMEs hpcvod writes itself, as above; gpu_resource_key: the KEY under which the site's
    # scheduler_options.gpu_resource (the GPU count hpcvod asks for) is one of them
    computed_resources: ClassVar[dict[str, dict[str, str]]] = {}
    gpu_resource_key: ClassVar[str | None] = None
    # getopt_long (sbatch's directives) reads an unambiguous prefix of a long option as the option itself
    long_option_prefixes: ClassVar[bool] = False
    # The variable that holds an array task's index inside the job (None: no arrays), and the name of each
    # task's log with the scheduler's own placeholder for the index.
    array_index_var: ClassVar[str | None] = None
    array_output: ClassVar[str] = ""
    # What the MPI launcher inside the job is handed: the shell text naming the host list file the rendered
    # script has (None: the launcher finds the hosts itself, as srun does), and whether all ranks run on this
    # one machine (local: no hosts, and the node's CPU count is no limit).
    hostfile: ClassVar[str | None] = None
    single_host: ClassVar[bool] = False
    # Every rank starts in the scheduler's own container image (kubernetes' pods): the profile must name the
    # image's MPI, launcher and Python, since nothing of the submitting machine is there.
    runs_in_image: ClassVar[bool] = False
    # The batch system's own launcher kind (Slurm: srun), which no other scheduler's jobs can use.
    own_launcher: ClassVar[str | None] = None
    # What every one of its job ids starts with ("" for none): on a single-host scheduler, a JOB of another form
    # is no id of it, and only a job folder can name the job.
    job_id_prefix: ClassVar[str] = ""
    # What sbatch's or qsub's -q means to this scheduler's users: the QoS (Slurm), else the queue (--partition).
    short_q_is_qos: ClassVar[bool] = False
    # A job with a tf.data service compute job (submit --data-service-nodes; docs/data-service.md): how its two
    # parts get their nodes. "components": one heterogeneous job, each part launched in its own component
    # (srun --het-group=0 the compute part, 1 the training); "hostfiles": one job whose host list the script
    # splits into part_hostfiles (the compute part's first); "here": both on this machine; None: refused, and
    # data_service_refusal says why.
    data_service_layout: ClassVar[str | None] = None
    data_service_refusal: ClassVar[str] = ""
    part_hostfiles: ClassVar[tuple[str, str] | None] = None

    @classmethod
    def launcher_kinds(cls) -> list[str]:
        """The profile ``launcher.kind`` values that start ranks in this scheduler's jobs: every registered
        launcher's, except a batch system's own launcher (srun) under any other scheduler."""
        from hpcvod.launchers import all_launchers

        return sorted({kind for launcher in all_launchers().values() for kind in launcher.kinds
                       if not launcher.scheduler_own or kind == cls.own_launcher})

    def __init__(self, options: Any = None) -> None:
        self.options = options if options is not None else self.Options()

    @property
    def template(self) -> str:
        return f"{self.name}.j2"

    def directives(self, plan: JobRequest) -> list[str]:
        """The resource request, one directive per line, without the prefix."""
        return []

    def workdir(self, submit_dir: str) -> str:
        """The folder the job's launch line starts in: the one hpcvod was run from (a file system the nodes share),
        unless this scheduler's jobs run elsewhere (kubernetes: a folder of the container image)."""
        return submit_dir

    def image(self) -> str | None:
        """The container image this scheduler itself starts every rank in (kubernetes: its pods'), whatever the
        profile's container keys say; None: the ranks run where the launch line puts them."""
        return None

    def wrap_script(self, script: str, plan: Any) -> str:
        """The file submit writes and hands over, made of the rendered ``script``: the script itself for a batch
        system; kubernetes wraps it into the manifest whose launcher runs it."""
        return script

    def refresh_output(self, job_id: str, job_dir: Path | None) -> None:
        """Bring the job's output into its folder's output.log where the scheduler keeps it elsewhere (kubernetes:
        the launcher pod's log); the batch systems write output.log there themselves."""

    def data_service_directives(self, compute: JobRequest, training: JobRequest) -> list[str]:
        """The resource request of a training job (``training``) with its tf.data service compute part
        (``compute``: its nodes, tasks and CPUs; no options of its own)."""
        return self.directives(training)

    def check_job_options(self, options: JobDefaults) -> None:
        """Refuse (UserError, one line) every option given that this scheduler has no directive for, and every
        --sched-opt that is not one directive of its own (check_sched_opt)."""
        for name in sorted(_given(options)):
            if name not in self.job_options:
                raise self.refuse(name, getattr(options, name), self.refusal_hints.get(name, ""))
        for item in options.sched_opt:
            self.check_sched_opt(item)

    def check_sched_opt(self, item: str) -> None:
        """Refuse (UserError, one line) a --sched-opt (its form already checked: hpcvod.sites.joboptions) whose
        KEY is not of this scheduler's form, or that would repeat a directive hpcvod writes itself."""
        key, value = sched_opt_parts(item)
        if not re.fullmatch(self.sched_opt_key.regex, key):
            raise UserError(f"--sched-opt {item!r}: expected {self.sched_opt_key.meaning} for {self.name}")
        name = self._computed_option(key)
        if name is not None:
            raise UserError(f"--sched-opt {item!r}: {self.sched_opt_directive(name, None)} is left to hpcvod on "
                            f"{self.name} ({self.computed_directives[name]})")
        resources = dict(self.computed_resources.get(key, {}))
        gpu_resource = getattr(self.options, "gpu_resource", None)
        if key == self.gpu_resource_key and gpu_resource:
            resources[gpu_resource] = "use --gpus-per-node"
        for word in (value or "").split(","):
            resource = word.partition("=")[0]
            if resource in resources:
                raise UserError(f"--sched-opt {item!r}: {self.sched_opt_directive(key, resource)} is left to hpcvod "
                                f"on {self.name} ({resources[resource]})")

    def _computed_option(self, key: str) -> str | None:
        """The option hpcvod writes that ``key`` names: itself, or the one long option it is a prefix of."""
        if key in self.computed_directives:
            return key
        if self.long_option_prefixes and len(key) > 1:
            return next((name for name in self.computed_directives if len(name) > 1 and name.startswith(key)), None)
        return None

    def sched_opt_directive(self, key: str, value: str | None) -> str:
        """One --sched-opt as a directive of this scheduler: qsub's ``-KEY VALUE`` (l=software=x -> -l software=x)."""
        return f"-{key}" if value is None else f"-{key} {value}"

    def sched_opt_directives(self, items: Sequence[str]) -> list[str]:
        """The --sched-opt directives, in order: last, so that they may add to the generated ones."""
        return [self.sched_opt_directive(*sched_opt_parts(item)) for item in items]

    def refuse(self, name: str, value: object, why: str = "") -> UserError:
        shown = "" if value is True else f" {value!r}" if not isinstance(value, list) else f" {value[0]!r}"
        return UserError(f"{flag(name)}{shown}: {self.name} has no such request" + (f" ({why})" if why else ""))

    def task_job_id(self, job_id: str, index: int) -> str | None:
        """The id this scheduler's commands take for one task of array job ``job_id`` (None: it has none)."""
        return None

    def component_job_id(self, job_id: str, index: int) -> str | None:
        """The id of component ``index`` of a job laid out in components (data_service_layout; None: none)."""
        return None

    def output_file(self, plan: JobRequest) -> str:
        """The log the scheduler writes, relative to the job folder: one per task for an array."""
        return self.array_output if plan.options.array else OUTPUT_FILE

    def submit(self, job_dir: Path, script: Path, secret_env: Mapping[str, str] | None = None) -> Submitted:
        """Hand ``script`` (in ``job_dir``) to the scheduler. ``secret_env`` (name -> value) reaches the job through
        the scheduler's own environment passing: the submit command's environment carries the values, its
        arguments (``submit_argv``) the names only."""
        raise NotImplementedError

    def submit_argv(self, script_name: str, secret_names: Sequence[str] = ()) -> list[str]:
        """The submit command run in the job folder; it names the secret variables, never their values."""
        raise NotImplementedError

    def _run_submit(self, job_dir: Path, argv: list[str], secret_env: Mapping[str, str] | None
                    ) -> subprocess.CompletedProcess:
        """The submit command (``submit_argv``) run in the job folder, with the secret values added to its
        environment and the job folder's umask (the scheduler creates output files with the submitter's umask)."""
        from hpcvod.schedulers.jobfiles import modes_of

        env = {**os.environ, **secret_env} if secret_env else None
        return run_command(argv, cwd=job_dir, env=env, umask=modes_of(job_dir).umask)

    def status(self, job_id: str, job_dir: Path | None) -> JobStatus:
        raise NotImplementedError

    def statuses(self, jobs: Sequence[tuple[str, Path | None]]) -> dict[str, JobStatus]:
        """Where each of ``jobs`` (job id, job folder) stands, by job id, for a listing (`hpcvod jobs`). This
        default asks ``status`` of each; a scheduler whose commands take many ids at once asks them once."""
        return {job_id: self.status(job_id, job_dir) for job_id, job_dir in jobs}

    def cancel(self, job_id: str, job_dir: Path | None) -> None:
        raise NotImplementedError

    @staticmethod
    def parse_job_id(text: str) -> str:
        raise NotImplementedError

    @classmethod
    def check_job_id(cls, job_id: object, where: str = "") -> str:
        """``job_id`` if it has this scheduler's form, else a UserError saying where it came from."""
        if isinstance(job_id, str) and cls.job_id_pattern.fullmatch(job_id):
            return job_id
        raise UserError(f"{where + ': ' if where else ''}job id {job_id!r}: expected a {cls.name} job id "
                        f"like {cls.job_id_example}")

    @classmethod
    def check_record(cls, record: dict[str, Any], where: str) -> None:
        """Refuse (UserError naming ``where``) a job.json whose scheduler-specific fields are not what submit
        writes; the base scheduler records nothing of its own."""


def _given(options: JobDefaults) -> list[str]:
    return [f.name for f in dataclasses.fields(options) if getattr(options, f.name) not in (None, [], ())]


def task_output_file(index: int) -> str:
    """An array task's log in the job folder (what each scheduler's ``array_output`` becomes)."""
    return f"output.{index}.log"


def task_exit_file(index: int) -> str:
    """An array task's exit status in the job folder (written by the rendered script)."""
    return f"{EXIT_FILE}.{index}"


def sched_opt_parts(item: str) -> tuple[str, str | None]:
    """``--sched-opt KEY[=VALUE]`` (already checked) -> (KEY, VALUE or None)."""
    key, sep, value = item.partition("=")
    return key, value if sep else None


# why a --sched-opt may not repeat the directives hpcvod writes (Scheduler.computed_directives)
JOB_LOG = "the job's log is output.log in its job folder, where hpcvod logs reads it"
JOB_ENV = "the job's environment is --env and --secret-env"
JOB_FOLDER = "the job runs in its job folder"


# ---- what qsub's families (PBS Pro, Grid Engine) share --------------------------------------------------

_QSUB_MAIL = {"NONE": "n", "BEGIN": "b", "END": "e", "FAIL": "a", "ALL": "bea"}


def qsub_mail_events(scheduler: Scheduler, types: str) -> str:
    """``--mail-type BEGIN,END`` -> qsub's ``-m`` letters ("be"); a Slurm-only event is refused."""
    letters = ""
    for word in types.split(","):
        if word not in _QSUB_MAIL:
            raise scheduler.refuse("mail_type", types, f"{word} is Slurm's only; qsub knows {', '.join(_QSUB_MAIL)}")
        letters += "".join(ch for ch in _QSUB_MAIL[word] if ch not in letters)
    return "n" if "n" in letters else letters


def qsub_begin(scheduler: Scheduler, text: str) -> str:
    """``--begin YYYY-MM-DD[THH:MM[:SS]]`` -> qsub's ``-a CCYYMMDDhhmm.SS``; now+N is refused (the script would
    change with the clock, and qsub has no relative form)."""
    from hpcvod.sites.joboptions import begin_datetime

    when = begin_datetime(text)
    if when is None:
        raise scheduler.refuse("begin", text, "qsub takes a date: YYYY-MM-DD[THH:MM[:SS]]")
    return when.strftime("%Y%m%d%H%M.%S")


def qsub_range(scheduler: Scheduler, spec: str, lowest: int) -> tuple[str, int | None]:
    """``--array START-END[:STEP][%MAX]`` -> ("START-END:STEP", MAX); lists, and indexes below ``lowest``, are
    refused."""
    from hpcvod.sites.joboptions import array_indexes

    body, _, _ = spec.partition("%")
    indexes, limit = array_indexes(spec)
    if "," in body:
        raise scheduler.refuse("array", spec, "it takes one range START-END[:STEP]")
    if indexes[0] < lowest:
        raise scheduler.refuse("array", spec, f"its task indexes start at {lowest}")
    first, _, rest = body.partition("-")
    last, _, step = (rest or first).partition(":")
    return f"{first}-{last}:{step or 1}", limit


def qsub_begin_and_mail(scheduler: Scheduler, job: JobOptions) -> list[str]:
    """``-a`` (--begin), ``-m`` (--mail-type) and ``-M`` (--mail-user): the same in PBS Pro and Grid Engine."""
    out = []
    if job.begin is not None:
        out.append(f"-a {qsub_begin(scheduler, job.begin)}")
    if job.mail_type is not None:
        out.append(f"-m {qsub_mail_events(scheduler, job.mail_type)}")
    if job.mail_user is not None:
        out.append(f"-M {job.mail_user}")
    return out


def apply_directive_overrides(generated: list[str], skip: Sequence[str], extra: Sequence[str]) -> list[str]:
    """dask-jobqueue's override point: drop generated directives containing a skip string, then add extras."""
    kept = [d for d in generated if not any(s in d for s in skip)]
    return kept + list(extra)


def run_command(argv: list[str], *, cwd: Path | None = None, timeout: float = 60,
                env: Mapping[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess:
    """Run a scheduler command; a missing command or a timeout becomes a SchedulerError with one line."""
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None, umask=umask)
    except FileNotFoundError:
        raise SchedulerError(f"{argv[0]}: command not found (is this a login node of the cluster?)") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"{' '.join(argv)}: no answer after {timeout:.0f} s") from None


_EXIT_STATUS = re.compile(r"[0-9]{1,3}")


def read_exit_file(job_dir: Path | None, name: str = EXIT_FILE) -> int | None:
    """The exit status the rendered script recorded in its job folder (works after the scheduler forgot the job;
    ``name``: an array task's own file). None while there is none; anything but a number 0-255 is a UserError
    naming the file."""
    if job_dir is None:
        return None
    path = job_dir / name
    try:
        text = read_job_text(path, 64, "exit status file").strip()
    except FileNotFoundError:
        return None
    if not text:
        return None  # the script's `echo $? > exitcode` has truncated the file and not yet written it
    if not _EXIT_STATUS.fullmatch(text) or int(text) > 255:
        raise UserError(f"{path}: expected the exit status the job script writes (a number 0-255), "
                        f"got {text[:40]!r}")
    return int(text)


def write_cancel_marker(job_dir: Path | None) -> None:
    if job_dir is not None:
        from hpcvod.schedulers.jobfiles import write_job_file

        write_job_file(job_dir / CANCEL_FILE, "cancelled by hpcvod cancel\n")


def read_cancel_marker(job_dir: Path | None) -> bool:
    return job_dir is not None and (job_dir / CANCEL_FILE).exists()


def status_from_exit_file(job_dir: Path | None, name: str = EXIT_FILE) -> JobStatus | None:
    code = read_exit_file(job_dir, name)
    if code is None:
        return None
    return JobStatus(COMPLETED if code == 0 else FAILED, raw=f"exit {code}", exit_code=code,
                     source=f"{name} file")


def no_such_job(job_id: str, scheduler: str) -> UserError:
    return UserError(f"job {job_id!r}: {scheduler} does not know this job (and no job folder records it)")


def dataclass_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]
