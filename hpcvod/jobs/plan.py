"""JobSpec + Site (+ HostFacts) -> LaunchPlan: every decision about a job, made once, in one place.

The plan is what gets rendered (templates only format it), printed by --dry-run, and saved as the job's
resolved request; nothing downstream decides anything.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hpcvod import __version__
from hpcvod.containers.image_check import check_image
from hpcvod.containers.runtimes import pyxis_srun_args, wrap_words
from hpcvod.jobs.elastic import EVENTS_ENV, ElasticRequest, elastic_request
from hpcvod.jobs.jobdir import find_job
from hpcvod.jobs.spec import DISPATCHER_SIDES, DataServiceSpec, JobSpec, check_env_name, parse_time
from hpcvod.launchers import Launcher, LaunchRequest, label_argv, launcher_for, launchers_of_kind
from hpcvod.machine.host import HostFacts
from hpcvod.support.shell import ENV_KEY, Verbatim, safe_name
from hpcvod.schedulers import scheduler_for
from hpcvod.schedulers.base import Scheduler, apply_directive_overrides
from hpcvod.support.errors import UserError
from hpcvod.sites.joboptions import JobOptions, merged
from hpcvod.sites.loader import Site
from hpcvod.sites.profile import AUTO, NAME_PATTERN, Partition, interconnect_env, time_seconds

ARRAY_INDEX_ENV = "HPCVOD_ARRAY_INDEX"  # an array task's index, whatever the scheduler (docs/contract.md)
# The tf.data service config's path, for the training ranks (docs/contract.md); the script sets it to a file in
# the job folder, found at run time like the folder itself.
DATA_SERVICE_CONFIG_ENV = "HPCVOD_DATA_SERVICE_CONFIG"
COMPUTE_WORKER = "hpcvod.tensorflow.data.compute_worker"


@dataclass(frozen=True)
class DataServicePart:
    """The tf.data service compute job of a plan (submit --data-service-nodes, docs/data-service.md): its own
    nodes, ranks and launch line; the scheduler reads it as a JobRequest to write its part of the request."""

    scheduler_job_name: str
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    world_size: int
    partition: str
    time_seconds: int
    account: str | None
    dispatchers: int
    dispatcher_side: str
    launch_argv: tuple[str, ...]
    program_argv: tuple[str, ...]
    hostfiles: tuple[str, str] | None = None  # the host lists the script splits the job's into: compute, training
    gpus_per_node: int = 0
    gpu_type: str | None = None
    options: JobOptions = dataclasses.field(default_factory=JobOptions)  # none of its own: the job's are the training's


@dataclass(frozen=True)
class LaunchPlan:
    """A fully resolved job. Every field is a decision the template only writes down."""

    site: str
    site_source: str
    scheduler: str
    job_name: str  # the user's, verbatim (HPCVOD_JOB_NAME)
    scheduler_job_name: str  # what the scheduler sees (safe characters only)
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    gpu_type: str | None
    world_size: int
    partition: str
    time_seconds: int
    account: str | None
    workdir: str
    mpi_flavour: str
    launcher: str
    launch_argv: tuple[str, ...]
    program_argv: tuple[str, ...]
    env_groups: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (where from, ((KEY, value), ...))
    module_purge: bool
    modules: tuple[str, ...]
    setup: tuple[str, ...]
    directive_prefix: str
    directives: tuple[str, ...]
    container: str | None
    command: tuple[str, ...]
    hpcvod_version: str = __version__
    secret_env: tuple[str, ...] = ()  # names only: the scheduler hands the values over (never written)
    shared_job_dir: bool = False  # job folder group-readable (else owner only)
    options: JobOptions = dataclasses.field(default_factory=JobOptions)  # per-job scheduler options, resolved
    array_index_var: str | None = None  # the scheduler's variable for an array task's index; None: no array
    data_service: DataServicePart | None = None  # a tf.data service compute job beside the training ranks
    min_nodes: int | None = None  # elastic (submit --min-nodes): trains on while this many nodes are left
    elastic_restart: bool = False  # elastic without ULFM: the launch line is run by launchers/elastic_batch.py

    @property
    def env(self) -> dict[str, str]:
        """The environment every rank sees (later groups win)."""
        return {k: v for _, pairs in self.env_groups for k, v in pairs}

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["env_groups"] = {title: dict(pairs) for title, pairs in self.env_groups}
        return out


def _positive(value: int | None, flag: str, allow_zero: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        expected = "an integer >= 0" if allow_zero else "a positive integer"
        raise UserError(f"{flag} {value!r}: expected {expected}")


def _did_you_mean(word: str, options: Sequence[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(options), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _partition(site: Site, name: str, flag: str) -> Partition:
    """The profile's partition ``name``, or one line naming ``flag`` and the partitions there are."""
    partitions = site.profile.partitions
    if name not in partitions:
        raise UserError(f"{flag} {name!r}: site {site.name!r} has no such partition "
                        f"(has: {', '.join(partitions)}){_did_you_mean(name, list(partitions))}")
    return partitions[name]


def _max_nodes(part: Partition, nodes: int, flag: str, partition_name: str, site: Site) -> None:
    if part.max_nodes is not None and nodes > part.max_nodes:
        raise UserError(f"{flag} {nodes}: partition {partition_name!r} of site {site.name!r} allows at most "
                        f"{part.max_nodes} node{'s' if part.max_nodes > 1 else ''}")


def _data_service_layout(ds: DataServiceSpec, site: Site, scheduler: Scheduler, host: HostFacts, partition: str,
                         world: int, seconds: int, options: JobOptions) -> tuple[str, int, int, int]:
    """(partition, nodes, tasks per node, CPUs per task) of the compute job; UserError for what cannot be."""
    flag = f"--data-service-nodes {ds.nodes!r}"
    if scheduler.data_service_layout is None:
        raise UserError(f"{flag}: {scheduler.name} has no such request ({scheduler.data_service_refusal})")
    _positive(ds.nodes, "--data-service-nodes")
    _positive(ds.tasks_per_node, "--data-service-tasks-per-node")
    _positive(ds.dispatchers, "--data-service-dispatchers")
    if ds.dispatcher_side not in DISPATCHER_SIDES:
        raise UserError(f"--data-service-dispatcher-side {ds.dispatcher_side!r}: expected one of "
                        f"{', '.join(DISPATCHER_SIDES)}")
    if options.array:
        raise UserError(f"--array {options.array!r}: not with --data-service-nodes (one compute job serves one "
                        "training job)")
    if scheduler.data_service_layout == "components" and not all(
            cls.het_groups for cls in launchers_of_kind(site.profile.launcher.kind)):
        raise UserError(f"{flag}: site {site.name!r} starts ranks with {site.profile.launcher.kind}; the compute "
                        "job's heterogeneous job component needs srun --het-group (launcher.kind: srun)")
    if scheduler.single_host and ds.nodes != 1:
        raise UserError(f"{flag}: site {site.name!r} runs every rank on this machine: expected 1")
    name = ds.partition or partition
    part = _partition(site, name, "--data-service-partition")
    _max_nodes(part, ds.nodes, "--data-service-nodes", name, site)
    if part.max_time is not None and seconds > time_seconds(part.max_time):
        raise UserError(f"--data-service-partition {name!r}: allows at most {part.max_time}, the training job asks "
                        f"for {seconds} s (--time)")
    node_cpus = host.cpu_count if part.cpus_per_node == AUTO else part.cpus_per_node
    tasks = ds.tasks_per_node or 1
    if not scheduler.single_host and tasks > node_cpus:
        raise UserError(f"--data-service-tasks-per-node {tasks}: partition {name!r} of site {site.name!r} has "
                        f"{node_cpus} CPUs per node")
    if (ds.nodes * tasks) % ds.dispatchers:
        raise UserError(f"--data-service-tasks-per-node {tasks}: {ds.nodes} node(s) x {tasks} = "
                        f"{ds.nodes * tasks} compute ranks cannot be split among {ds.dispatchers} dispatchers: "
                        "expected a multiple of --data-service-dispatchers")
    if ds.dispatchers not in (1, world):  # a training rank reads from dispatcher 0, or from its own
        raise UserError(f"--data-service-dispatchers {ds.dispatchers}: expected 1 (shared by every training rank) or "
                        f"{world} (one per training rank)")
    return name, ds.nodes, tasks, max(1, node_cpus // tasks)


def _program_argv(spec: JobSpec, site: Site, host: HostFacts, python: str) -> list[str]:
    """A .py script runs under the job's Python; anything else runs as a command."""
    program = spec.program
    if not program.strip():
        raise UserError("SCRIPT: expected a script or command to run, got an empty string")
    in_cwd = os.path.join(host.cwd, program)  # os.path's tests: a name too long is no file, not an OSError
    if program.endswith(".py"):
        if not os.path.isfile(in_cwd):
            raise UserError(f"SCRIPT {program!r}: no such file (looked in {host.cwd})")
        return [python, program, *spec.args]
    if "/" in program:
        if not os.path.exists(in_cwd):
            raise UserError(f"SCRIPT {program!r}: no such file (looked in {host.cwd})")
        return [program, *spec.args]
    if shutil.which(program) is None:
        if os.path.isfile(in_cwd):
            return [f"./{program}", *spec.args]
        profile = site.profile
        # modules, setup lines or a container may provide the command on the nodes: trust the user then
        if not (profile.modules or profile.setup or spec.container or profile.container.image):
            raise UserError(f"SCRIPT {program!r}: no such file in {host.cwd} and no such command on PATH")
    return [program, *spec.args]


def _resolve_dependency(expression: str, scheduler: Scheduler) -> str:
    """Each ID of ``--dependency`` as the scheduler's job id: a job id stays, a job folder (its path, or its name
    under a jobs root) becomes the id its job.json records."""
    parts = []
    for part in expression.split(","):
        kind, *ids = part.split(":")
        resolved = []
        for given in ids:
            if scheduler.job_id_pattern.fullmatch(given):
                resolved.append(given)
                continue
            ref = find_job(given)
            if ref is None:
                raise UserError(f"--dependency {expression!r}: {given!r}: expected a {scheduler.name} job id like "
                                f"{scheduler.job_id_example}, or an hpcvod job folder (path or name)")
            if ref.scheduler != scheduler.name:
                raise UserError(f"--dependency {expression!r}: {given!r} is a {ref.scheduler} job; this site's "
                                f"jobs run under {scheduler.name}")
            resolved.append(ref.job_id)
        parts.append(":".join([kind, *resolved]))
    return ",".join(parts)


@dataclass(frozen=True)
class _Layout:
    """Where the ranks go: the partition, its nodes' CPUs, and how many ranks on how many nodes."""

    partition: str
    part: Partition
    node_cpus: int
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node


@dataclass(frozen=True)
class _Program:
    """What each rank runs: the program's words (a container's wrapper first), and the Pythons that run it and the
    line labeller; ``srun_container_args``: a pyxis container, which srun itself starts."""

    image: str | None
    python: str
    label_python: str
    wrap: tuple[str, ...]
    argv: tuple[str, ...]
    srun_container_args: tuple[str, ...]


@dataclass(frozen=True)
class _Environment:
    """The job's variables by where they come from, and the names every rank must see on every node."""

    job_name: str
    site: dict[str, str]
    contract: dict[str, str]
    user: dict[str, str]
    secret: tuple[str, ...]
    forward: tuple[str, ...]


def _layout(spec: JobSpec, site: Site, scheduler: Scheduler, host: HostFacts) -> _Layout:
    """The partition and the rank layout: one task per GPU (every GPU of a node unless -G is given), one per CPU
    slot when no GPU is asked for (-G 0, or a partition without GPUs)."""
    profile = site.profile
    partition_name = spec.partition or profile.default_partition or next(iter(profile.partitions))
    part = _partition(site, partition_name, "--partition")
    node_cpus = host.cpu_count if part.cpus_per_node == AUTO else part.cpus_per_node
    node_gpus = host.gpu_count if part.gpus_per_node == AUTO else part.gpus_per_node
    _positive(spec.nodes, "--nodes")
    _positive(spec.gpus_per_node, "--gpus-per-node", allow_zero=True)
    _positive(spec.tasks_per_node, "--tasks-per-node")
    _positive(spec.cpus_per_task, "--cpus-per-task")
    nodes = spec.nodes or 1
    _max_nodes(part, nodes, "--nodes", partition_name, site)
    # a partition with GPUs gets one rank per GPU of each node unless -G says otherwise (-G 0: CPU ranks there)
    gpus = node_gpus if spec.gpus_per_node is None else spec.gpus_per_node
    if gpus > node_gpus:
        raise UserError(f"--gpus-per-node {gpus}: partition {partition_name!r} of site {site.name!r} has "
                        f"{node_gpus} GPU{'s' if node_gpus != 1 else ''} per node")
    if spec.tasks_per_node:
        tasks = spec.tasks_per_node
    elif gpus:
        tasks = gpus
    else:
        tasks = max(1, node_cpus // (spec.cpus_per_task or 1))
    cpus_per_task = spec.cpus_per_task or (max(1, node_cpus // tasks) if gpus else 1)
    if not scheduler.single_host and tasks * cpus_per_task > node_cpus:
        raise UserError(f"--tasks-per-node {tasks} x --cpus-per-task {cpus_per_task}: partition {partition_name!r} "
                        f"of site {site.name!r} has {node_cpus} CPUs per node")
    return _Layout(partition_name, part, node_cpus, nodes, tasks, cpus_per_task, gpus)


def _job_options(spec: JobSpec, site: Site, scheduler: Scheduler, layout: _Layout) -> JobOptions:
    """Per-job scheduler options: the user's, else the partition's; refused where the scheduler has none."""
    try:  # the partition's own, named as the profile key that holds them
        scheduler.check_job_options(layout.part.job_defaults)
    except UserError as err:
        raise UserError(f"site {site.name!r}: partitions.{layout.partition}.job_defaults: {err}") from None
    options = merged(layout.part.job_defaults, spec.options)
    scheduler.check_job_options(options)
    if options.dependency is not None:
        options = dataclasses.replace(options, dependency=_resolve_dependency(options.dependency, scheduler))
    return options


def _time_and_account(spec: JobSpec, site: Site, layout: _Layout) -> tuple[int, str | None]:
    """The walltime in seconds (the partition's default, within its limit) and the account to charge."""
    part = layout.part
    if spec.time is not None:
        seconds = parse_time(spec.time)
        if part.max_time is not None and seconds > time_seconds(part.max_time):
            raise UserError(f"--time {spec.time}: partition {layout.partition!r} of site {site.name!r} allows at "
                            f"most {part.max_time}")
    else:
        seconds = time_seconds(part.default_time)
    account = spec.account if spec.account is not None else site.profile.account
    if account is not None and not re.fullmatch(NAME_PATTERN.regex, account):
        raise UserError(f"--account {account!r}: expected {NAME_PATTERN.meaning}")
    return seconds, account


def _mpi(site: Site, host: HostFacts) -> tuple[str, str, HostFacts]:
    """(MPI flavour, launcher executable, host facts): 'auto' is the MPI installed beside this Python or on PATH,
    where the launcher is the MPI's own; a batch system's launcher (srun) needs the flavour named."""
    profile = site.profile
    kind, flavour, executable = profile.launcher.kind, profile.mpi.flavour, profile.launcher.executable
    if flavour == AUTO or executable == AUTO:
        if not all(cls.local_mpi for cls in launchers_of_kind(kind)):
            raise UserError(f"site {site.name!r}: 'auto' MPI detection does not apply to {kind} (set mpi.flavour)")
        host = host.with_mpi(None if executable in (None, AUTO) else executable)
        assert host.mpi is not None
        flavour = host.mpi.flavour if flavour == AUTO else flavour
        executable = host.mpi.launcher if executable == AUTO else executable
    return flavour, executable or kind, host


def _elastic_driver_argv(elastic: ElasticRequest | None, layout: Any, python: str) -> tuple[str, ...]:
    """The words before the launch line of an elastic job that restarts its world (MPICH, Intel MPI): the driver
    runs the line once per world, narrowed to the nodes left (launchers/elastic_batch.py)."""
    if elastic is None or not elastic.restart:
        return ()
    return (python, "-m", "hpcvod.launchers.elastic_batch", "--nodes", str(layout.nodes), "--min-nodes",
            str(elastic.min_nodes), "--tasks-per-node", str(layout.tasks_per_node), "--")


def _program(spec: JobSpec, site: Site, host: HostFacts, gpus: int, flavour: str,
             forward_env: Sequence[str], workdir: str) -> _Program:
    """The program each rank runs, inside the site's container where one is asked for."""
    profile = site.profile
    image = spec.container or profile.container.image
    runtime = profile.container.runtime
    if image and runtime is None:
        raise UserError(f"--container {image!r}: site {site.name!r} has no container runtime (container.runtime)")
    python = profile.container.python if image else (profile.python or host.python)
    program = _program_argv(spec, site, host, python)
    # the line labeller runs where the launcher starts the rank: inside a pyxis container, outside a wrapped one
    label_python = python if not image or runtime == "pyxis" else (profile.python or host.python)
    srun_container_args: list[str] = []
    wrap: list[str] = []  # words before the program when the container wraps it
    if image:
        check_image(site.name, profile, image, flavour, workdir)
        mounts, args = profile.container.mounts, profile.container.args
        if runtime == "pyxis":
            srun_container_args = pyxis_srun_args(image, mounts, args)
        else:
            wrap = wrap_words(runtime, image, mounts, args, gpus, forward_env, workdir)
    return _Program(image, python, label_python, tuple(wrap), tuple(wrap + program), tuple(srun_container_args))


def _environment(spec: JobSpec, site: Site, layout: _Layout, flavour: str, array: bool) -> _Environment:
    """The site's variables, the contract's (docs/contract.md), the user's and the secret names; a user's that
    would clash is refused."""
    profile = site.profile
    job_name = spec.job_name if spec.job_name is not None else Path(spec.program).stem or "job"
    if not job_name.strip():
        raise UserError("--job-name: expected a non-empty name")
    site_env: dict[str, str] = {}
    site_env.update(interconnect_env(profile.interconnect))
    site_env.update(profile.mpi.env)
    site_env.update(profile.mpi.flavour_env.get(flavour, {}))
    site_env.update(profile.env)
    site_env.update(layout.part.env)
    if profile.container.runtime == "charliecloud" and (spec.container or profile.container.image):
        # each ch-run is its own user namespace: UCX's shared memory cannot open a peer's /proc/PID/fd there
        site_env.setdefault("UCX_POSIX_USE_PROC_LINK", "n")
    user_env: dict[str, str] = {}
    for key, value in spec.env:
        if not ENV_KEY.fullmatch(key):
            raise UserError(f"--env {key}=...: expected KEY=VALUE with KEY a variable name")
        check_env_name("--env", key)
        user_env[key] = value
    secret_env = tuple(dict.fromkeys(spec.secret_env))
    for key in secret_env:
        if not isinstance(key, str):
            raise UserError(f"--secret-env {key!r}: expected KEY, a variable name ([A-Za-z_][A-Za-z0-9_]*)")
        check_env_name("--secret-env", key)
        if key in user_env:
            raise UserError(f"--env {key}: given both as KEY=VALUE and as a secret KEY; choose one")
        if key in site_env:  # the script's export of the site's value would hide the secret
            raise UserError(f"--env {key}: site {site.name!r} sets it in the script already; choose another name")
    contract = {"HPCVOD_SITE": site.name, "HPCVOD_WORLD_SIZE": str(layout.world_size), "HPCVOD_JOB_NAME": job_name,
                "HPCVOD_MPI_FLAVOUR": flavour}  # hvd.init() checks the MPI it loads against it
    forward = (*site_env, *contract, "HPCVOD_JOB_DIR", *([ARRAY_INDEX_ENV] if array else []),
               *([DATA_SERVICE_CONFIG_ENV] if spec.data_service else []), *user_env, *secret_env)
    return _Environment(job_name, site_env, contract, user_env, secret_env, forward)


def _data_service_part(ds: DataServiceSpec, ds_layout: tuple[str, int, int, int], launcher: Launcher,
                       request: LaunchRequest, hostfiles: tuple[str, str] | None, components: bool,
                       program: _Program, env: _Environment, seconds: int, account: str | None) -> DataServicePart:
    """The compute job's own launch line beside the training's (same launcher, its own nodes and ranks)."""
    ds_partition, ds_nodes, ds_tasks, ds_cpus = ds_layout
    compute_line = launcher.line(dataclasses.replace(
        request, world_size=ds_nodes * ds_tasks, nodes=ds_nodes, tasks_per_node=ds_tasks, cpus_per_task=ds_cpus,
        hostfile=Verbatim(hostfiles[0]) if hostfiles else request.hostfile, het_group=0 if components else None))
    return DataServicePart(
        scheduler_job_name=safe_name(env.job_name), nodes=ds_nodes, tasks_per_node=ds_tasks, cpus_per_task=ds_cpus,
        world_size=ds_nodes * ds_tasks, partition=ds_partition, time_seconds=seconds, account=account,
        dispatchers=ds.dispatchers, dispatcher_side=ds.dispatcher_side,
        launch_argv=tuple(compute_line.argv) + tuple(label_argv(program.label_python)),
        program_argv=(*program.wrap, program.python, "-m", COMPUTE_WORKER, "--dispatchers", str(ds.dispatchers),
                      "--dispatcher-side", ds.dispatcher_side, Verbatim(f'"${DATA_SERVICE_CONFIG_ENV}"')),
        hostfiles=hostfiles)


def world_line(plan: LaunchPlan) -> str:
    """The world a submit starts, in one line for stderr: nodes x ranks per node, and the GPUs."""
    gpus = f"{plan.gpus_per_node} GPU{'s' if plan.gpus_per_node != 1 else ''} per node" if plan.gpus_per_node \
        else f"no GPU, {plan.cpus_per_task} CPU{'s' if plan.cpus_per_task != 1 else ''} per rank"
    return (f"world: {plan.nodes} node{'s' if plan.nodes != 1 else ''} x {plan.tasks_per_node} "
            f"rank{'s' if plan.tasks_per_node != 1 else ''} = {plan.world_size} rank{'s' if plan.world_size != 1 else ''}"
            f", {gpus}")


def resolve(spec: JobSpec, site: Site, host: HostFacts, command: Sequence[str] = ()) -> LaunchPlan:
    """Every decision about the job; raises UserError (one line) for anything the user must fix."""
    profile = site.profile
    scheduler = scheduler_for(site)
    layout = _layout(spec, site, scheduler, host)
    options = _job_options(spec, site, scheduler, layout)
    array_index_var = scheduler.array_index_var if options.array else None
    seconds, account = _time_and_account(spec, site, layout)
    ds = spec.data_service
    ds_layout = (_data_service_layout(ds, site, scheduler, host, layout.partition, layout.world_size, seconds,
                                      options) if ds else None)
    flavour, executable, host = _mpi(site, host)
    env = _environment(spec, site, layout, flavour, array_index_var is not None)
    program = _program(spec, site, host, layout.gpus_per_node, flavour, env.forward, scheduler.workdir(host.cwd))

    # -- the launch line (and the compute job's, beside it)
    launcher = launcher_for(profile.launcher.kind, flavour)
    elastic = elastic_request(spec.min_nodes, layout.nodes, site.name, profile.scheduler, flavour, launcher.name,
                              profile.launcher.kind, ds is not None)
    components = ds is not None and scheduler.data_service_layout == "components"
    hostfiles = scheduler.part_hostfiles if ds and scheduler.data_service_layout == "hostfiles" else None
    hostfile = hostfiles[1] if hostfiles else scheduler.hostfile
    request = LaunchRequest(
        executable=executable, world_size=layout.world_size, nodes=layout.nodes,
        tasks_per_node=layout.tasks_per_node, cpus_per_task=layout.cpus_per_task,
        mpi_plugin=profile.launcher.mpi_plugin, pmi_library=profile.mpi.pmi_library,
        hostfile=Verbatim(hostfile) if hostfile else None, single_host=scheduler.single_host,
        forward_env=(*env.forward, *((*elastic.env, EVENTS_ENV) if elastic else ())), is_root=host.is_root,
        extra_args=(*profile.launcher.args, *(elastic.launcher_args if elastic else ())),
        srun_container_args=program.srun_container_args, het_group=1 if components else None)
    line = launcher.line(request)
    data_service = (_data_service_part(ds, ds_layout, launcher, request, hostfiles, components, program, env,
                                       seconds, account) if ds and ds_layout else None)
    groups = [("site profile", env.site), ("launcher", line.env), ("hpcvod (docs/contract.md)", env.contract),
              ("elastic (submit --min-nodes, docs/elastic.md)", elastic.env if elastic else {}), ("--env", env.user)]
    plan = LaunchPlan(
        site=site.name, site_source=site.source, scheduler=profile.scheduler, job_name=env.job_name,
        scheduler_job_name=safe_name(env.job_name), nodes=layout.nodes, tasks_per_node=layout.tasks_per_node,
        cpus_per_task=layout.cpus_per_task, gpus_per_node=layout.gpus_per_node, gpu_type=layout.part.gpu_type,
        world_size=layout.world_size, partition=layout.partition, time_seconds=seconds, account=account,
        workdir=scheduler.workdir(host.cwd), mpi_flavour=flavour, launcher=launcher.name,
        launch_argv=_elastic_driver_argv(elastic, layout, program.label_python) + tuple(line.argv)
        + (("--",) if elastic and elastic.restart else ()) + tuple(label_argv(program.label_python)),
        program_argv=program.argv,
        env_groups=tuple((title, tuple(pairs.items())) for title, pairs in groups if pairs),
        module_purge=profile.module_purge, modules=tuple(profile.modules), setup=tuple(profile.setup),
        directive_prefix=scheduler.directive_prefix, directives=(), container=program.image or scheduler.image(),
        command=tuple(command), secret_env=env.secret, options=options, array_index_var=array_index_var,
        data_service=data_service, min_nodes=elastic.min_nodes if elastic else None,
        elastic_restart=bool(elastic and elastic.restart),
        shared_job_dir=profile.jobs.shared_with_group if spec.shared_job_dir is None else bool(spec.shared_job_dir))
    generated = (scheduler.data_service_directives(data_service, plan) if data_service
                 else scheduler.directives(plan)) + list(elastic.directives if elastic else ())
    directives = apply_directive_overrides(generated, profile.directives.skip, profile.directives.extra)
    return dataclasses.replace(plan, directives=tuple(directives))
