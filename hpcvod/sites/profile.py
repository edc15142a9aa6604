"""The site profile: THE definition of every key a site YAML file may hold.

The loader, the JSON Schema (``hpcvod sites schema``) and the key reference in docs/sites.md are all
generated from these dataclasses; add or change a key here and nowhere else.
"""

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Mapping, Optional, Protocol, Sequence, Union

from hpcvod.support.errors import ProfileError, UserError
from hpcvod.sites.joboptions import JobDefaults, check_job_options
from hpcvod.sites.spec import ENV_NAME, ONE_LINE, Above, Choices, EnvValue, Min, Pattern, doc

TIME_PATTERN = Pattern(r"(\d+-)?\d+:[0-5]\d:[0-5]\d|\d+", "a time as [D-]HH:MM:SS or whole minutes")
NAME_PATTERN = Pattern(r"[A-Za-z0-9][A-Za-z0-9_.+@-]*", "a name of letters, digits and _ . + @ -")

EnvMap = dict[Annotated[str, ENV_NAME], EnvValue]
Line = Annotated[str, ONE_LINE]
Flavour = Literal["openmpi", "intelmpi", "mpich"]
AUTO = "auto"
# The scheduler and launcher modules live above this package: whoever validates a profile hands their names over
# under these keys (``choices(schedulers)``).
SCHEDULERS = Choices("scheduler")
LAUNCHER_KINDS = Choices("launcher kind")


class SchedulerTraits(Protocol):
    """What a profile's validation reads of a scheduler (hpcvod.schedulers.base.Scheduler has it all)."""

    Options: type  # the dataclass of the profile's ``scheduler_options``
    single_host: bool  # every rank runs on this machine: the only scheduler 'auto' resources fit
    runs_in_image: bool  # the scheduler starts every rank in its own container image (kubernetes' pods)

    def launcher_kinds(self) -> Sequence[str]:
        """The ``launcher.kind`` values that can start ranks in this scheduler's allocations."""
        ...


Schedulers = Mapping[str, SchedulerTraits]  # name -> the scheduler's class (hpcvod.schedulers.profile_options())


def choices(schedulers: Schedulers) -> dict[str, list[str]]:
    """The sets the profile format leaves to its caller: the scheduler names and every launcher kind."""
    kinds = {kind for traits in schedulers.values() for kind in traits.launcher_kinds()}
    return {SCHEDULERS.key: sorted(schedulers), LAUNCHER_KINDS.key: sorted(kinds)}


def _either(names: Sequence[str]) -> str:
    return " or ".join(repr(name) for name in names)


@dataclass(frozen=True)
class Partition:
    """A Slurm partition or PBS queue: what one of its nodes has and how long a job may run."""

    cpus_per_node: Union[Annotated[int, Min(1)], Literal["auto"]] = doc(
        "CPU cores per node; 'auto' = count them on this machine (local site only)")
    gpus_per_node: Union[Annotated[int, Min(0)], Literal["auto"]] = doc(
        "GPUs per node (0 = CPU partition); 'auto' = count /dev/nvidiaN on this machine (local site only)", 0)
    memory_gb: Optional[Annotated[int, Min(1)]] = doc("memory per node in GB (informational; shown by `sites show`)", None)
    max_nodes: Optional[Annotated[int, Min(1)]] = doc("most nodes one job may ask for (null = no limit known)", None)
    default_time: Annotated[str, TIME_PATTERN] = doc("walltime a job gets when --time is not given", "01:00:00")
    max_time: Optional[Annotated[str, TIME_PATTERN]] = doc("longest --time accepted (null = no limit known)", None)
    gpu_type: Optional[Annotated[str, NAME_PATTERN]] = doc(
        "GPU model for Slurm's typed GRES (--gres=gpu:TYPE:N), e.g. a100; null = untyped", None)
    env: EnvMap = doc("environment variables set for jobs in this partition only", factory=dict)
    description: Line = doc("what this partition is for", "")
    job_defaults: JobDefaults = doc(
        "scheduler options every job in this partition gets unless the user gives its flag (e.g. exclusive: true, "
        "qos: high); docs/submission.md lists them", factory=JobDefaults)


@dataclass(frozen=True)
class Launcher:
    """How the ranks are started inside the allocation (kept apart from how resources are requested)."""

    kind: Annotated[str, LAUNCHER_KINDS] = doc(
        "srun (Slurm's launcher, needs mpi_plugin), mpirun or mpiexec (the MPI library's own launcher)")
    mpi_plugin: Optional[Literal["pmix", "pmi2", "pmi", "none"]] = doc(
        "srun --mpi=PLUGIN; must match the MPI (Open MPI 5: pmix; MPICH/Intel MPI: pmi2). A wrong one starts "
        "N silent size-1 worlds", None)
    executable: Optional[Annotated[str, ONE_LINE]] = doc(
        "path or name of mpirun/mpiexec; 'auto' = the installed MPI's own (beside this Python first, then PATH)", None)
    args: list[Line] = doc("extra arguments put right after the launcher command", factory=list)


@dataclass(frozen=True)
class Mpi:
    """Which MPI library the jobs use and the environment it needs."""

    flavour: Literal["openmpi", "intelmpi", "mpich", "auto"] = doc(
        "openmpi, intelmpi or mpich; 'auto' = detect the MPI installed beside this Python (local site)")
    env: EnvMap = doc("MPI settings (OMPI_MCA_*, UCX_*, I_MPI_*, FI_*, PMIX_*) for every job", factory=dict)
    flavour_env: dict[Flavour, EnvMap] = doc(
        "extra settings applied only when that flavour is used (useful with flavour: auto)", factory=dict)
    pmi_library: Optional[Annotated[str, ONE_LINE]] = doc(
        "libpmi2.so for Intel MPI under srun (exported as I_MPI_PMI_LIBRARY)", None)


@dataclass(frozen=True)
class Interconnect:
    """The network between nodes; each key becomes the NCCL variable named beside it."""

    kind: Literal["infiniband", "roce", "ethernet"] = doc(
        "infiniband, roce (RoCE v2 needs gid_index) or ethernet (sets NCCL_IB_DISABLE=1)", "ethernet")
    ib_hca: Optional[Annotated[str, ONE_LINE]] = doc("NCCL_IB_HCA: HCAs NCCL may use, e.g. mlx5_0,mlx5_1", None)
    socket_ifname: Optional[Annotated[str, ONE_LINE]] = doc(
        "NCCL_SOCKET_IFNAME: interface for NCCL's bootstrap/socket traffic, e.g. ib0 or ^lo,docker", None)
    gid_index: Optional[Annotated[int, Min(0)]] = doc("NCCL_IB_GID_INDEX: the RoCE v2 GID index (often 3)", None)
    gdr_level: Optional[Annotated[str, ONE_LINE]] = doc("NCCL_NET_GDR_LEVEL: GPUDirect RDMA level (LOC, PIX, PXB, PHB, SYS)", None)
    nccl_debug: Optional[Literal["VERSION", "WARN", "INFO", "TRACE"]] = doc("NCCL_DEBUG", None)
    link_gbps: Optional[Annotated[float, Above(0)]] = doc(
        "the declared speed of one node's link in Gbit/s (e.g. 200 for HDR InfiniBand); `hpcvod sites check` "
        "compares the measured bandwidth with it (null = nothing declared)", None)
    env: EnvMap = doc("other NCCL_*/UCX_* settings", factory=dict)


@dataclass(frozen=True)
class Container:
    """Running the ranks inside a container image."""

    runtime: Optional[Literal["apptainer", "singularity", "charliecloud", "podman", "pyxis"]] = doc(
        "apptainer/singularity (`apptainer exec IMAGE ...` per rank), charliecloud (`ch-run IMAGE -- ...`), "
        "podman (`podman run ... IMAGE ...`) or pyxis (`srun --container-image`); null = --container is refused",
        None)
    image: Optional[Annotated[str, ONE_LINE]] = doc("image used when --container is not given (null = no container)", None)
    mounts: list[Line] = doc("bind mounts, SRC[:DST] (apptainer --bind, ch-run -b, podman -v, pyxis "
                             "--container-mounts)", factory=list)
    args: list[Line] = doc("extra arguments for `apptainer exec`, `ch-run`, `podman run` or srun's pyxis options",
                           factory=list)
    python: Annotated[str, ONE_LINE] = doc("the Python inside the image that runs .py scripts", "python3")


@dataclass(frozen=True)
class Directives:
    """The override point for scheduler directives (as in dask-jobqueue)."""

    extra: list[Line] = doc("directives added verbatim after the generated ones, without the #SBATCH/#PBS prefix",
                            factory=list)
    skip: list[Line] = doc("generated directives containing any of these strings are left out", factory=list)


@dataclass(frozen=True)
class Jobs:
    """Job folders (the script, request.json, job.json, output.log) on this site, and watching their jobs."""

    shared_with_group: bool = doc(
        "make job folders readable by the owner's group (folders 0750, files 0640) instead of the owner only "
        "(0700/0600); never by others. `submit --shared-job-dir` does the same for one job", False)
    poll_interval: Optional[Annotated[float, Above(0)]] = doc(
        "seconds between questions to the scheduler while `--wait`, `submit --follow` or `logs -f` watch a job, "
        "right after it changed (null = the scheduler's own: 2 for slurm and sge, 5 for pbs, 0.2 for local)", None)
    poll_max: Annotated[float, Above(0)] = doc(
        "the longest wait between two questions: while nothing changes each wait is half as long again as the one "
        "before, up to this; a change (state, new output) starts again from poll_interval", 30.0)


@dataclass(frozen=True)
class SiteProfile:
    """One cluster (or one machine): its scheduler, partitions, launcher, MPI, interconnect and setup."""

    scheduler: Annotated[str, SCHEDULERS] = doc("the batch scheduler module that submits jobs")
    partitions: dict[Annotated[str, NAME_PATTERN], Partition] = doc(
        "partitions (Slurm) or queues (PBS) jobs may use, by name")
    launcher: Launcher = doc("how ranks are started")
    mpi: Mpi = doc("the MPI library and its settings")
    description: Line = doc("one line shown by `hpcvod sites list`", "")
    extends: Optional[Annotated[str, ONE_LINE]] = doc(
        "another profile (name or path relative to this file) whose keys this one starts from; mappings merge, "
        "other values are replaced", None)
    hostnames: list[Line] = doc("shell patterns (fnmatch) of login-node hostnames that select this profile", factory=list)
    default_partition: Optional[Annotated[str, NAME_PATTERN]] = doc(
        "partition used when --partition is not given (null = the first one listed)", None)
    account: Optional[Annotated[str, NAME_PATTERN]] = doc("account/project charged when --account is not given", None)
    interconnect: Interconnect = doc("the network and its NCCL settings", factory=Interconnect)
    modules: list[Line] = doc("environment modules to load (`module load ...`), in order", factory=list)
    module_purge: bool = doc("run `module purge` before loading modules", False)
    setup: list[Line] = doc("shell lines run before the launch (conda activate, source a venv, ...); trusted, not quoted",
                            factory=list)
    python: Optional[Annotated[str, ONE_LINE]] = doc(
        "the Python that runs .py scripts on the nodes (null = the Python running hpcvod)", None)
    container: Container = doc("container support", factory=Container)
    directives: Directives = doc("extra and skipped scheduler directives", factory=Directives)
    jobs: Jobs = doc("who may read job folders; how often waiting for a job asks the scheduler", factory=Jobs)
    env: EnvMap = doc("any other environment variables for every job", factory=dict)
    # values: scalars, or a mapping/list of them (kubernetes: node_selector, tolerations); each scheduler's own
    # Options dataclass checks them precisely
    scheduler_options: dict[Annotated[str, ONE_LINE], Union[EnvValue, bool, dict[Line, EnvValue],
                                                            list[dict[Line, EnvValue]], None]] = doc(
        "options of the scheduler module (see docs/sites.md: slurm, pbs, local)", factory=dict)


def check_profile(profile: SiteProfile, schedulers: Schedulers) -> None:
    """Rules that tie keys together (the schema checks each key alone), with what ``schedulers`` say they can:
    raises the first one the profile breaks (``profile_problems`` gives them all)."""
    problems = profile_problems(profile, schedulers)
    if problems:
        raise problems[0]


def profile_problems(profile: SiteProfile, schedulers: Schedulers) -> list[ProfileError]:
    """Every rule that ties keys together and that the profile breaks, in the order of the file's sections."""
    problems: list[ProfileError] = []

    def problem(key_path: tuple[str | int, ...], message: str) -> None:
        problems.append(ProfileError(key_path, message))

    if not profile.partitions:
        problem(("partitions",), "expected at least one partition")
    if profile.default_partition is not None and profile.default_partition not in profile.partitions:
        problem(("default_partition",),
                f"{profile.default_partition!r} is not one of the partitions: {', '.join(profile.partitions)}")
    launcher = profile.launcher
    traits = schedulers[profile.scheduler]
    if launcher.kind not in traits.launcher_kinds():
        fits = [name for name, other in sorted(schedulers.items()) if launcher.kind in other.launcher_kinds()]
        problem(("launcher", "kind"), f"{launcher.kind} needs scheduler {_either(fits)}, "
                f"not {profile.scheduler!r}")
    if launcher.kind == "srun":
        if launcher.mpi_plugin is None:
            problem(("launcher", "mpi_plugin"),
                    "missing: srun needs --mpi=PLUGIN (pmix for Open MPI 5, pmi2 for MPICH/Intel MPI)")
        if profile.mpi.flavour == "intelmpi" and not profile.mpi.pmi_library:
            problem(("mpi", "pmi_library"),
                    "missing: Intel MPI under srun needs the path of libpmi2.so (I_MPI_PMI_LIBRARY)")
    elif launcher.mpi_plugin is not None:
        problem(("launcher", "mpi_plugin"), f"only applies to kind 'srun', not {launcher.kind!r}")
    if profile.interconnect.gid_index is not None and profile.interconnect.kind != "roce":
        problem(("interconnect", "gid_index"), f"only applies to kind 'roce', not {profile.interconnect.kind!r}")
    if traits.runs_in_image:  # nothing of this machine's is there: the MPI and the Python are the image's
        if profile.mpi.flavour == AUTO:
            problem(("mpi", "flavour"), f"'auto' finds the MPI of this machine; scheduler {profile.scheduler!r} "
                    "runs the ranks in its image: name the image's MPI (openmpi, intelmpi or mpich)")
        if launcher.executable == AUTO:
            problem(("launcher", "executable"), f"'auto' finds this machine's launcher; scheduler "
                    f"{profile.scheduler!r} runs it in its image: give its name (mpirun, mpiexec) or path there")
        if profile.python is None:
            problem(("python",), f"missing: scheduler {profile.scheduler!r} runs the program in its image, not with "
                    "the Python running hpcvod: give the image's Python (e.g. python3)")
    if profile.container.runtime == "pyxis" and launcher.kind != "srun":
        problem(("container", "runtime"), "pyxis runs through srun: it needs launcher.kind 'srun'")
    if profile.container.runtime == "charliecloud":
        for i, mount in enumerate(profile.container.mounts):
            if mount.count(":") > 1:  # ch-run -b takes no options
                problem(("container", "mounts", i), f"{mount!r}: ch-run binds SRC[:DST], without options")
    for name, part in profile.partitions.items():
        for key in ("cpus_per_node", "gpus_per_node"):
            if getattr(part, key) == AUTO and not traits.single_host:
                here = [name for name, other in sorted(schedulers.items()) if other.single_host]
                problem(("partitions", name, key),
                        f"'auto' counts this machine's resources and only fits scheduler {_either(here)}")
        try:
            check_job_options(part.job_defaults)
        except UserError as err:
            problem(("partitions", name, "job_defaults"), str(err))
        if part.max_time is not None and time_seconds(part.default_time) > time_seconds(part.max_time):
            problem(("partitions", name, "default_time"),
                    f"{part.default_time} is longer than max_time {part.max_time}")
    return problems


def time_seconds(text: str) -> int:
    """Seconds in ``[D-]HH:MM:SS`` or whole minutes (already validated by TIME_PATTERN)."""
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = int(day_text)
    parts = [int(p) for p in text.split(":")]
    if len(parts) == 1:
        return days * 86400 + parts[0] * 60
    hours, minutes, seconds = parts
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


def interconnect_env(ic: Interconnect) -> dict[str, str]:
    """The NCCL variables the interconnect keys stand for, then its free-form env."""
    out: dict[str, str] = {}
    if ic.kind == "ethernet":
        out["NCCL_IB_DISABLE"] = "1"
    for key, var in (("ib_hca", "NCCL_IB_HCA"), ("socket_ifname", "NCCL_SOCKET_IFNAME"),
                     ("gid_index", "NCCL_IB_GID_INDEX"), ("gdr_level", "NCCL_NET_GDR_LEVEL"),
                     ("nccl_debug", "NCCL_DEBUG")):
        value = getattr(ic, key)
        if value is not None:
            out[var] = str(value)
    out.update(ic.env)
    return out


def replace(profile: SiteProfile, **changes: Any) -> SiteProfile:
    return dataclasses.replace(profile, **changes)
