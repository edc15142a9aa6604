"""The words that start one rank inside a container, per `container.runtime` (docs/containers.md).

apptainer/singularity, charliecloud and podman wrap the program: the launcher (mpiexec, srun) starts the runtime on
the host, which starts the rank inside the image, so the launcher's PMI reaches the rank through the environment
and the inherited PMI socket. pyxis is different: srun itself starts the container (``--container-image``), so it
adds srun options instead of wrapping.
"""

from __future__ import annotations

from typing import Sequence

# Variables podman must copy into the container (it passes none by default, unlike the other runtimes): the
# launchers' PMI and placement (hydra PMI_*/MPI_LOCAL*, srun SLURM_*/PMI_*, Open MPI OMPI_*/PMIX_*/PRTE_*), the MPI
# and network settings a profile sets, and the job contract's HPCVOD_*. A trailing * is podman's prefix match.
PODMAN_ENV_PREFIXES = ("PMI_*", "PMIX_*", "MPI_*", "SLURM_*", "OMPI_*", "PRTE_*", "HYDRA_*", "I_MPI_*", "MPIR_CVAR_*",
                       "FI_*", "UCX_*", "NCCL_*", "CUDA_*", "HPCVOD_*")
# The PMI socket that hydra and srun's pmi2 hand each rank (PMI_FD) is an inherited descriptor, often 9-12:
# podman closes every descriptor past stderr unless told to keep the first N after it.
PODMAN_PRESERVED_FDS = 32


def wrap_words(runtime: str, image: str, mounts: Sequence[str], args: Sequence[str], gpus: int,
               forward_env: Sequence[str] = (), workdir: str | None = None) -> list[str]:
    """The words before the rank's program for a wrapping runtime (not pyxis): the runtime, its GPU flags, the
    site's bind mounts, the profile's extra arguments, the image; ch-run and podman start the program in
    ``workdir`` (the launch line's folder; apptainer keeps the folder it was started in)."""
    if runtime in ("apptainer", "singularity"):
        words = [runtime, "exec"] + (["--nv"] if gpus else [])
        for mount in mounts:
            words += ["--bind", mount]
        return words + [*args, image]
    if runtime == "charliecloud":
        # ch-run has no GPU flag: the host's driver libraries go into the image once, when it is prepared
        # (`ch-fromhost --nvidia IMAGE`, see docs/containers.md); each rank then sees /dev/nvidia* as ch-run binds /dev
        words = ["ch-run"] + (["-c", workdir] if workdir else [])
        for mount in mounts:
            words += ["-b", mount]
        return words + [*args, image, "--"]
    if runtime == "podman":
        # the host's network, IPC (shared memory between ranks) and PIDs, as the ranks' MPI expects of a node
        words = ["podman", "run", "--rm", "--network=host", "--ipc=host", "--pid=host",
                 f"--preserve-fds={PODMAN_PRESERVED_FDS}"] + (["-w", workdir] if workdir else [])
        if gpus:
            words += ["--device", "nvidia.com/gpu=all"]  # CDI: `nvidia-ctk cdi generate` made the spec on the node
        covered = tuple(prefix[:-1] for prefix in PODMAN_ENV_PREFIXES)
        for name in (*PODMAN_ENV_PREFIXES, *(n for n in forward_env if not n.startswith(covered))):
            words += ["--env", name]
        for mount in mounts:
            words += ["-v", mount]
        # a folder image (hpcvod image's debootstrap build, an unpacked root) runs as it is, no registry
        return words + [*args, *(["--rootfs", image] if image.startswith("/") else [image])]
    raise ValueError(f"not a wrapping container runtime: {runtime!r}")


def pyxis_srun_args(image: str, mounts: Sequence[str], args: Sequence[str]) -> list[str]:
    """srun's options that start each rank in a pyxis/enroot container (pyxis exposes the job's GPUs itself)."""
    words = [f"--container-image={image}"]
    if mounts:
        words.append(f"--container-mounts={','.join(mounts)}")
    return words + list(args)
