"""JobSpec: what the user asked for, before the site profile fills in the rest."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from hpcvod.support.shell import ENV_KEY, parse_env
from hpcvod.support.errors import UserError
from hpcvod.sites.joboptions import JobOptions

_TIME = re.compile(r"(?:(\d+)-)?(\d+):([0-5]\d):([0-5]\d)|(\d+)")
# Set by the script from the plan (docs/contract.md); --env may not override them.
CONTRACT_ENV = ("HPCVOD_WORLD_SIZE", "HPCVOD_JOB_DIR", "HPCVOD_SITE", "HPCVOD_JOB_NAME", "HPCVOD_ARRAY_INDEX",
                "HPCVOD_MPI_FLAVOUR", "HPCVOD_DATA_SERVICE_CONFIG", "HPCVOD_ELASTIC_EVENTS", "HPCVOD_ELASTIC_MIN_NODES")
# Names --env and --secret-env may not set (docs/submission.md, "Environment"). Bash's: readonly ones (the job
# script dies exporting them), ones that change how it reads and runs its own lines (IFS, PS4 under xtrace, a
# file every later bash sources), and ones whose value bash itself keeps, which an export silently disables.
SHELL_ENV = frozenset({"BASHOPTS", "BASHPID", "CDPATH", "DIRSTACK", "ENV", "EPOCHREALTIME", "EPOCHSECONDS", "EUID",
                       "FUNCNAME", "GLOBIGNORE", "GROUPS", "HISTCMD", "IFS", "LINENO", "OPTERR", "OPTIND", "PIPESTATUS",
                       "POSIXLY_CORRECT", "PPID", "PS4", "RANDOM", "SECONDS", "SHELLOPTS", "SRANDOM", "UID"})
# The scheduler's and the launcher's own: what sbatch, srun, qsub and the MPI launchers tell the job about itself
# (the script's requeue reads SLURM_JOB_ID, srun its SLURM_*/SRUN_* inputs, a rank its PMI_*/PMIX_* world).
SCHEDULER_ENV = frozenset({"JOB_ID", "JOB_NAME", "PE", "PE_HOSTFILE", "NHOSTS", "NSLOTS", "NQUEUES", "QUEUE"})
RESERVED_ENV_PREFIXES = ("BASH_", "SLURM_", "SRUN_", "SBATCH_", "SALLOC_", "PBS_", "SGE_", "PMI_", "PMIX_",
                         "OMPI_COMM_WORLD_")
SETTABLE_ENV_PREFIXES = ("PMIX_MCA_",)  # PMIx's own settings, as the site profile's mpi.env may set them


def check_env_name(flag: str, name: str) -> None:
    """Refuse (UserError, one line) a variable name --env or --secret-env (``flag``) may not set."""
    if not ENV_KEY.fullmatch(name):
        raise UserError(f"{flag} {name!r}: expected KEY, a variable name ([A-Za-z_][A-Za-z0-9_]*)")
    if name in CONTRACT_ENV:
        why = "set by hpcvod itself (docs/contract.md)"
    elif name in SHELL_ENV or name.startswith("BASH_"):
        why = "bash's own variable: the job script would stop on it or run differently"
    elif (name in SCHEDULER_ENV or name.startswith(RESERVED_ENV_PREFIXES)) and not name.startswith(
            SETTABLE_ENV_PREFIXES):
        why = "the scheduler's or the MPI launcher's own variable, which it sets for the job"
    else:
        return
    raise UserError(f"{flag} {name}: {why}; choose another name (docs/submission.md, Environment)")
DISPATCHER_SIDES = ("compute", "training")  # python -m hpcvod.tensorflow.data.compute_worker --dispatcher-side


@dataclass(frozen=True)
class DataServiceSpec:
    """``submit --data-service-nodes N``: a tf.data service compute job submitted with the training job
    (docs/data-service.md); None means "the site's default" as in JobSpec."""

    nodes: int
    partition: str | None = None
    tasks_per_node: int | None = None  # default 1: one tf.data worker per node, with all its cores
    dispatchers: int = 1
    dispatcher_side: str = "compute"


# the settings that go with data_service_nodes (CLI: --data-service-..., Python API: keyword arguments)
DATA_SERVICE_OPTIONS = ("data_service_partition", "data_service_tasks_per_node", "data_service_dispatchers",
                        "data_service_dispatcher_side")


def data_service_spec(values: dict[str, Any], spell: Callable[[str], str] = str) -> DataServiceSpec | None:
    """The DataServiceSpec of ``values`` (``data_service_nodes`` and DATA_SERVICE_OPTIONS, None where not given);
    None without ``data_service_nodes``, where any of the others is a usage error (``spell`` names an option as
    the user wrote it). The numbers themselves are checked against the site when the job is planned."""
    if values.get("data_service_nodes") is None:
        given = [name for name in DATA_SERVICE_OPTIONS if values.get(name) is not None]
        if given:
            raise UserError(f"{spell(given[0])}: goes with {spell('data_service_nodes')} N (the compute job's nodes)")
        return None
    dispatchers = values.get("data_service_dispatchers")
    return DataServiceSpec(nodes=values["data_service_nodes"], partition=values.get("data_service_partition"),
                           tasks_per_node=values.get("data_service_tasks_per_node"),
                           dispatchers=1 if dispatchers is None else dispatchers,
                           dispatcher_side=values.get("data_service_dispatcher_side") or "compute")


@dataclass(frozen=True)
class JobSpec:
    """A request: the program and the resources; None means "the site's default"."""

    program: str
    args: tuple[str, ...] = ()
    nodes: int | None = None
    gpus_per_node: int | None = None
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    job_name: str | None = None
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    container: str | None = None
    # variables whose values the job takes from the submitting environment at submit time; only their names
    # are ever written (docs/submission.md, "Trust model / secrets")
    secret_env: tuple[str, ...] = ()
    shared_job_dir: bool | None = None  # None: the site's jobs.shared_with_group
    options: JobOptions = field(default_factory=JobOptions)  # --exclusive, --mem, --array... (checked already)
    data_service: DataServiceSpec | None = None  # a tf.data service compute job beside the training ranks
    min_nodes: int | None = None  # elastic: the job goes on while this many of its nodes are left (docs/elastic.md)


def parse_time(text: str, flag: str = "--time") -> int:
    """Seconds of ``[D-]HH:MM:SS`` or whole minutes (Slurm's and PBS's common ground)."""
    match = _TIME.fullmatch(text.strip())
    if not match:
        raise UserError(f"{flag} {text!r}: expected a time as HH:MM:SS, D-HH:MM:SS or whole minutes")
    days, hours, minutes, seconds, only_minutes = match.groups()
    if only_minutes is not None:
        total = int(only_minutes) * 60
    else:
        total = int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + int(seconds)
    if total <= 0:
        raise UserError(f"{flag} {text!r}: expected a time longer than zero")
    return total


def parse_job_env(items: list[str] | tuple[str, ...], secret_items: list[str] | tuple[str, ...] = ()
                  ) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """``submit --env``: ``KEY=VALUE`` pairs (written into the script), and the bare ``KEY`` names of ``--env KEY``
    and ``--secret-env KEY`` (the value is taken from the submitting environment; only the name is written)."""
    pairs = parse_env([item for item in items if "=" in item])
    names: list[str] = []
    for flag, item in [("--env", i) for i in items if "=" not in i] + [("--secret-env", i) for i in secret_items]:
        if not ENV_KEY.fullmatch(item):
            raise UserError(f"{flag} {item!r}: expected KEY (a variable name, [A-Za-z_][A-Za-z0-9_]*) or KEY=VALUE")
        check_env_name(flag, item)
        if item not in names:
            names.append(item)
    return pairs, tuple(names)
