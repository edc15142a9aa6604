"""Checks at submit that the ranks can start in the container image at all (docs/containers.md, "Checked at
submit"): the image is there, and its MPI (recorded by `hpcvod image` in /etc/hpcvod-image.json) is the one the
site's launcher and PMI plugin start. A job that fails these would queue, then die in MPI_Init on every rank or,
worse, start every rank as a world of size 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hpcvod.machine.flavour import FLAVOUR_NAMES
from hpcvod.sites.crosscheck import mounted
from hpcvod.sites.profile import SiteProfile
from hpcvod.support.errors import UserError

LABEL_PATH = "etc/hpcvod-image.json"  # inside the image, written by `hpcvod image` (hpcvod/containers/image.py)
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://")  # docker://, library://, oras://: apptainer pulls these itself


def local_image_path(runtime: str, image: str) -> Path | None:
    """The file or folder the image is on this filesystem, None when the runtime fetches it by name (a registry
    reference, an image in podman's or ch-image's storage)."""
    if _URI.match(image):
        return None
    if runtime in ("apptainer", "singularity"):
        return Path(image)  # a .sif file or a sandbox folder
    if runtime in ("charliecloud", "pyxis", "podman") and image.startswith(("/", "./", "../", "~")):
        return Path(image).expanduser()  # a folder image, a SquashFS file; pyxis/enroot: a .sqsh file
    return None


def image_label(image_dir: Path) -> dict | None:
    """What `hpcvod image` recorded in a folder image, None when the image has no record (another builder)."""
    path = image_dir / LABEL_PATH
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise UserError(f"container image {image_dir}: {path} is not readable JSON ({err}); rebuild it with "
                        f"`hpcvod image --build`") from None


# What each wrapping runtime shows of the host without a mount (ch-run: /dev, /proc, /sys, /tmp and a few files
# of /etc; apptainer by default also $HOME and the folder it starts in; podman nothing)
SEEN_WITHOUT_MOUNTS = {"charliecloud": ("/tmp",), "podman": ()}


def check_image(site_name: str, profile: SiteProfile, image: str, flavour: str, workdir: str) -> None:
    """Raises UserError (one line) when the image is missing, records an MPI other than ``flavour`` (the one
    the site's launcher and its PMI plugin start: `sites validate` ties the plugin to the flavour), or when the
    runtime would start the ranks in a folder (``workdir``: the program, the job folder) the container does not see."""
    runtime = profile.container.runtime or ""
    seen = SEEN_WITHOUT_MOUNTS.get(runtime)
    if seen is not None and not any(mounted(workdir, m) for m in (*seen, *profile.container.mounts)):
        top = "/" + workdir.strip("/").split("/")[0]
        raise UserError(f"the job starts in {workdir}, which a {runtime} container of site {site_name!r} does not "
                        f"see: expected a container.mounts entry that binds it or a folder above it at the same "
                        f"path (e.g. {top})")
    path = local_image_path(runtime, image)
    if path is None:
        return
    if not path.exists():
        kind = "folder (ch-convert/ch-image output)" if runtime == "charliecloud" else "file or folder"
        raise UserError(f"container image {image}: no such {kind} on this machine (container.runtime {runtime}, "
                        f"site {site_name!r}): expected the path of a built image (`hpcvod image --site "
                        f"{site_name} --build`)")
    label = image_label(path) if path.is_dir() else None
    if label is None:
        return  # built elsewhere: the job's own check (hvd.init() against HPCVOD_MPI_FLAVOUR) catches a mismatch
    inside = label.get("mpi_flavour")
    launcher = profile.launcher
    how = (f"srun --mpi={launcher.mpi_plugin}" if launcher.kind == "srun"
           else f"{launcher.kind} ({launcher.executable or 'auto'})")
    if inside != flavour:
        raise UserError(f"container image {image} has {FLAVOUR_NAMES.get(inside, inside)} ({LABEL_PATH}: "
                        f"{label.get('mpi_wheel', inside)}), but site {site_name!r} starts "
                        f"{FLAVOUR_NAMES.get(flavour, flavour)} ranks with {how}: expected an image built for this "
                        f"site (`hpcvod image --site {site_name}`)")
