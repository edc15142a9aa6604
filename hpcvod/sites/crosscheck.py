"""Rules across a profile's sections that the schema cannot see and that would otherwise pass `sites validate` and
fail later on the cluster, silently or not: the MPI and its srun plugin, settings of another MPI, RoCE without its
GID index, and a PMI library that a container does not see (docs/sites.md, "What validate checks")."""

from __future__ import annotations

from hpcvod.sites.profile import AUTO, SiteProfile
from hpcvod.support.errors import ProfileError

# The srun --mpi= plugins each MPI can use (docs/measured.md: a wrong one aborts, or starts every rank as a world
# of size 1 without a word: Open MPI 5 under pmi2, Intel MPI and Debian's MPICH under pmix).
MPI_PLUGINS: dict[str, tuple[str, ...]] = {"openmpi": ("pmix",), "mpich": ("pmi2", "pmi"), "intelmpi": ("pmi2", "pmi")}
# Variable prefixes only one MPI reads: under another MPI they do nothing, or the profile names the wrong flavour.
FLAVOUR_PREFIXES: dict[str, str] = {"OMPI_": "openmpi", "I_MPI_": "intelmpi", "MPIR_CVAR_": "mpich"}
# Intel MPI is built on MPICH and reads MPIR_CVAR_* too
READS_TOO: dict[str, tuple[str, ...]] = {"intelmpi": ("mpich",)}


def cross_problems(profile: SiteProfile) -> list[ProfileError]:
    """Every such rule the profile breaks (each one ProfileError naming the key and what was expected)."""
    return _plugin_problems(profile) + _foreign_env_problems(profile) + _roce_problems(profile) + \
        _container_pmi_problems(profile)


def _plugin_problems(profile: SiteProfile) -> list[ProfileError]:
    plugin, flavour = profile.launcher.mpi_plugin, profile.mpi.flavour
    if profile.launcher.kind != "srun" or plugin is None or flavour not in MPI_PLUGINS:
        return []
    if plugin in MPI_PLUGINS[flavour]:
        return []
    return [ProfileError(("launcher", "mpi_plugin"),
                         f"{plugin!r} does not start one {flavour} world under srun (it aborts, or starts every rank "
                         f"as a world of size 1): expected {' or '.join(map(repr, MPI_PLUGINS[flavour]))}")]


def _foreign_env_problems(profile: SiteProfile) -> list[ProfileError]:
    """Variables of another MPI than the one the jobs run, in mpi.env, env, each partition's env and each
    mpi.flavour_env (flavour: auto tells only which flavour_env goes with which MPI)."""
    places = [(("mpi", "flavour_env", used), env, used) for used, env in profile.mpi.flavour_env.items()]
    used = profile.mpi.flavour
    if used != AUTO:
        places += [(("mpi", "env"), profile.mpi.env, used), (("env",), profile.env, used)]
        places += [(("partitions", name, "env"), part.env, used) for name, part in profile.partitions.items()]
    problems = []
    for key_path, env, used in places:
        for var in env:
            owner = next((f for prefix, f in FLAVOUR_PREFIXES.items() if var.startswith(prefix)), used)
            if owner != used and owner not in READS_TOO.get(used, ()):
                problems.append(ProfileError(key_path + (var,),
                                             f"an {owner} variable, but the jobs run {used}, which ignores it: "
                                             f"expected {used}'s own settings (or mpi.flavour: {owner})"))
    return problems


def _roce_problems(profile: SiteProfile) -> list[ProfileError]:
    ic = profile.interconnect
    if ic.kind != "roce" or ic.gid_index is not None or "NCCL_IB_GID_INDEX" in ic.env:
        return []
    return [ProfileError(("interconnect", "gid_index"),
                         "missing: RoCE v2 needs its GID index (NCCL_IB_GID_INDEX; `show_gids` on a node lists it, "
                         "often 3), else NCCL picks a RoCE v1 or link-local GID and fails or crawls: expected an "
                         "integer >= 0")]


def _container_pmi_problems(profile: SiteProfile) -> list[ProfileError]:
    """Intel MPI under srun loads I_MPI_PMI_LIBRARY inside the container: a path no mount brings in is missing."""
    library = profile.mpi.pmi_library
    if (profile.container.runtime is None or profile.launcher.kind != "srun" or profile.mpi.flavour != "intelmpi"
            or not library or any(mounted(library, mount) for mount in profile.container.mounts)):
        return []
    folder = library.rsplit("/", 1)[0] or "/"
    return [ProfileError(("mpi", "pmi_library"),
                         f"{library} is not in the container (container.runtime {profile.container.runtime}), where "
                         f"the ranks load it: expected a container.mounts entry that binds it or its folder "
                         f"(e.g. {folder})")]


def mounted(path: str, mount: str) -> bool:
    """Whether a mount ``SRC[:DST[:OPTIONS]]`` shows the host's ``path`` at the same path in the container."""
    parts = mount.split(":")
    source = parts[0].rstrip("/") or "/"
    target = (parts[1] if len(parts) > 1 and parts[1] else parts[0]).rstrip("/") or "/"
    return source == target and (target == "/" or path == target or path.startswith(target + "/"))
