"""`hpcvod image`: a Containerfile for a site profile, and building it where a builder runs (docs/containers.md).

The image holds the site's MPI from the same PyPI wheel the site's hosts use (the launcher on the host and the MPI
inside must speak one PMI), mpi4py, the frameworks, hpcvod, and /etc/hpcvod-image.json, which records them for
the checks at submit (hpcvod/containers/image_check.py). GPU partitions get a CUDA base.

Two builders: podman (`podman build`; pulls FROM from its registry) and `debootstrap`, which needs no registry: it
makes the FROM line's Debian root with debootstrap from the Debian mirror apt uses, and runs each RUN in it with
`ch-run -w`, giving a folder image that ch-run (container.runtime charliecloud) runs as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Sequence

from hpcvod import __version__
from hpcvod.machine.flavour import PIP_NAMES, MpiNotFound, detect_mpi
from hpcvod.sites.loader import Site
from hpcvod.sites.profile import AUTO
from hpcvod.support.errors import UserError

VENV = "/opt/hpcvod"
PYTHON = f"{VENV}/bin/python"
DEBIAN_BASE = "debian:bookworm-slim"
# The CUDA runtime bases for GPU partitions (cuDNN and NCCL come with the frameworks' and CuPy's wheels)
CUDA_BASES = {"12": "nvidia/cuda:12.8.1-runtime-ubuntu24.04", "13": "nvidia/cuda:13.0.1-runtime-ubuntu24.04"}
FRAMEWORK_PACKAGES = {"torch": "torch", "tensorflow": "tensorflow-cpu", "mxnet": "mxnet"}
EXTRA_OF_FLAVOUR = {"mpich": "mpich", "openmpi": "openmpi", "intelmpi": "impi"}
DEBIAN_FROM = re.compile(r"^(?:docker\.io/)?(?:library/)?debian:(?P<suite>[a-z]+)(?:-slim)?$")


@dataclass(frozen=True)
class ImageRecipe:
    """What goes into a site's image: rendered as a Containerfile, recorded as /etc/hpcvod-image.json."""

    site: str
    base: str
    mpi_flavour: str
    requirements: tuple[str, ...]  # pip requirements, pinned where this machine has them installed
    cuda: str | None
    mount_points: tuple[str, ...] = ()  # container.mounts' targets: ch-run cannot create them in a read-only image

    def label(self) -> dict:
        return {"hpcvod_image": 1, "site": self.site, "base": self.base, "mpi_flavour": self.mpi_flavour,
                "mpi_wheel": next(r for r in self.requirements if r.startswith(PIP_NAMES[self.mpi_flavour] + "==")
                                  or r == PIP_NAMES[self.mpi_flavour]),
                "requirements": list(self.requirements), "cuda": self.cuda, "python": PYTHON, "hpcvod": __version__}

    def containerfile(self) -> str:
        reqs = " ".join(shlex.quote(r) for r in self.requirements)
        return "\n".join([
            f"# hpcvod image for site {self.site!r}: `hpcvod image --site {self.site}` wrote it (docs/containers.md).",
            f"# Its MPI is {self.mpi_flavour}, from the same wheel as the site's hosts: the launcher there starts the",
            "# ranks in here through PMI, which only works with the same MPI. Profile: container.python: " + PYTHON,
            f"FROM {self.base}",
            "ENV DEBIAN_FRONTEND=noninteractive",
            "RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates"
            " && rm -rf /var/lib/apt/lists/*",
            f"RUN python3 -m venv {VENV}",
            "# wheels/: pre-downloaded wheels (hpcvod image --download); empty: pip takes them from the index",
            "COPY wheels /opt/hpcvod-wheels",
            f"RUN {VENV}/bin/pip install --no-cache-dir --find-links /opt/hpcvod-wheels {reqs}"
            " && rm -rf /opt/hpcvod-wheels",
            "# hpcvod itself last: a new hpcvod rebuilds only what follows (the debootstrap builder keeps the root",
            "# as it was before the last COPY)",
            "COPY hpcvod-dist /opt/hpcvod-src",
            f"RUN {VENV}/bin/pip install --no-cache-dir --no-deps /opt/hpcvod-src/*.whl"
            " && mv /opt/hpcvod-src/hpcvod-image.json /etc/hpcvod-image.json && rm -rf /opt/hpcvod-src"
            + "".join(f" && mkdir -p {shlex.quote(target)}" for target in self.mount_points),
            f"LABEL org.hpcvod.site={self.site} org.hpcvod.mpi-flavour={self.mpi_flavour}",
            f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ""])


def _installed(name: str) -> str:
    """``name==VERSION`` as installed beside this Python (without a local label such as +cpu), else ``name``."""
    try:
        return f"{name}=={metadata.version(name).split('+', 1)[0]}"
    except metadata.PackageNotFoundError:
        return name


def _wants_gpu(site: Site) -> bool:
    parts = site.profile.partitions.values()
    return any(p.gpus_per_node == AUTO and _host_gpus() or isinstance(p.gpus_per_node, int) and p.gpus_per_node > 0
               for p in parts)


def _host_gpus() -> int:
    from hpcvod.machine.host import detect_host

    return detect_host().gpu_count


def _site_flavour(site: Site) -> str:
    flavour = site.profile.mpi.flavour
    if flavour != AUTO:
        return flavour
    try:
        return detect_mpi().flavour
    except MpiNotFound as err:
        raise UserError(f"image: site {site.name!r} has mpi.flavour auto and this machine has no MPI to tell it "
                        f"({err}): expected mpi.flavour in the profile") from None


def recipe(site: Site, frameworks: Sequence[str], cuda: str | None, base: str | None) -> ImageRecipe:
    """The site's image: its MPI's wheel (the version installed here, if any), mpi4py, the frameworks, hpcvod."""
    flavour = _site_flavour(site)
    unknown = [f for f in frameworks if f not in FRAMEWORK_PACKAGES]
    if unknown:
        raise UserError(f"image --framework {unknown[0]}: expected one of {', '.join(FRAMEWORK_PACKAGES)}")
    if cuda is None and _wants_gpu(site):
        cuda = "12"
    if cuda is not None and cuda not in CUDA_BASES:
        raise UserError(f"image --cuda {cuda}: expected one of {', '.join(CUDA_BASES)}")
    requirements = [_installed(PIP_NAMES[flavour]), _installed("mpi4py"), _installed("numpy"),
                    _installed("jinja2"), _installed("pyyaml")]
    requirements += [_installed(FRAMEWORK_PACKAGES[f]) for f in frameworks]
    if cuda:
        requirements.append(f"cupy-cuda{cuda}x")
    return ImageRecipe(site=site.name, base=base or (CUDA_BASES[cuda] if cuda else DEBIAN_BASE), mpi_flavour=flavour,
                       requirements=tuple(requirements), cuda=cuda, mount_points=tuple(
                           dict.fromkeys((m.split(":") + [m.split(":")[0]])[1] for m in site.profile.container.mounts)))


def write_context(rec: ImageRecipe, out: Path, download: bool) -> None:
    """``out``/Containerfile, hpcvod-dist/ (hpcvod's wheel, the label) and wheels/ (every requirement's wheel for
    this Python with ``download``, so that the build needs no index; else empty)."""
    (out / "wheels").mkdir(parents=True, exist_ok=True)
    own = out / "hpcvod-dist"  # not "hpcvod": such a folder in the current one would shadow the package
    if own.exists():
        shutil.rmtree(own)
    own.mkdir()
    source = Path(__file__).resolve().parents[2]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    if (source / "pyproject.toml").is_file():  # a source tree (an editable install): its wheel as it is now
        had_build = (source / "build").exists()
        _run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(own), str(source)], "hpcvod's wheel",
             cwd=out)
        if not had_build:  # setuptools' scratch folder, which this build made in the tree
            shutil.rmtree(source / "build", ignore_errors=True)
    else:
        _run(pip + ["download", "--no-deps", "-d", str(own), f"hpcvod=={__version__}"], "hpcvod's wheel")
    (own / "hpcvod-image.json").write_text(json.dumps(rec.label(), indent=1) + "\n")
    if download:
        _run(pip + ["download", "-d", str(out / "wheels"), *rec.requirements], "the requirements' wheels")
    (out / "Containerfile").write_text(rec.containerfile())


def _run(argv: list[str], what: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        tail = " | ".join(done.stdout.strip().splitlines()[-3:])
        raise UserError(f"image: {what} failed (exit {done.returncode}: {shlex.join(argv[:6])} ...): {tail}")


# ---- building ------------------------------------------------------------------------------------------------

def instructions(containerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per line; the Containerfiles hpcvod writes have one instruction a line."""
    steps = []
    for line in containerfile.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            steps.append((word.upper(), rest.strip()))
    return steps


def _debian_mirror() -> str:
    """The Debian mirror apt uses on this machine (deb822 or one-line sources), else deb.debian.org."""
    for path in sorted(Path("/etc/apt").glob("sources.list*")) + sorted(Path("/etc/apt/sources.list.d").glob("*")):
        if not path.is_file():
            continue
        for match in re.finditer(r"(?:URIs:|^deb)\s+(?:\[[^\]]*\]\s+)?(\S+/debian)/?\s", path.read_text(), re.M):
            return match.group(1)
    return "http://deb.debian.org/debian"


def _digest(steps: list[tuple[str, str]], context: Path) -> str:
    """What a build of ``steps`` depends on: the instructions and every file COPY takes from the context."""
    h = hashlib.sha256()
    for word, rest in steps:
        h.update(f"{word} {rest}\n".encode())
        if word == "COPY":
            source = context / rest.split()[0]
            for path in sorted(source.rglob("*")) if source.is_dir() else [source]:
                if path.is_file():
                    h.update(str(path.relative_to(context)).encode())
                    with open(path, "rb") as f:
                        for block in iter(lambda: f.read(1 << 20), b""):
                            h.update(block)
    return h.hexdigest()[:16]


def build_debootstrap(context: Path, offline: bool, log: Callable[[str], None]) -> Path:
    """Build ``context``/Containerfile into the folder image ``context``/image with debootstrap and ch-run; the
    root before the last COPY is kept (``context``/.base) so that a new hpcvod wheel rebuilds in seconds."""
    for tool in ("debootstrap", "ch-run"):
        if shutil.which(tool) is None:
            raise UserError(f"image --builder debootstrap: no {tool} on PATH (Debian: apt-get install debootstrap "
                            f"charliecloud-runtime)")
    steps = instructions((context / "Containerfile").read_text())
    if not steps or steps[0][0] != "FROM" or not DEBIAN_FROM.match(steps[0][1]):
        raise UserError(f"image --builder debootstrap: {context / 'Containerfile'} starts FROM "
                        f"{steps[0][1] if steps else '(nothing)'}: debootstrap makes Debian roots only "
                        f"(FROM debian:SUITE); build a CUDA base with podman, docker or apptainer")
    last_copy = max(i for i, (word, _) in enumerate(steps) if word == "COPY")
    image, base = context / "image", context / ".base"
    full, prefix = _digest(steps, context), _digest(steps[:last_copy], context)
    if (context / "image.digest").is_file() and (context / "image.digest").read_text() == full and image.is_dir():
        log(f"image {image}: up to date ({full})")
        return image
    env: dict[str, str] = {}
    if not ((context / ".base.digest").is_file() and (context / ".base.digest").read_text() == prefix
            and base.is_dir()):
        shutil.rmtree(base, ignore_errors=True)
        (context / ".base.digest").unlink(missing_ok=True)
        suite = DEBIAN_FROM.match(steps[0][1]).group("suite")
        mirror = _debian_mirror()
        log(f"debootstrap --variant=minbase {suite} {base} {mirror}")
        _run(["debootstrap", "--variant=minbase", suite, str(base), mirror], "debootstrap")
        # ch-run -w maps root to root without the capabilities apt's sandbox user (_apt) needs
        (base / "etc/apt/apt.conf.d/99hpcvod-no-sandbox").write_text('APT::Sandbox::User "root";\n')
        _apply(steps[1:last_copy], base, context, env, offline, log)
        (context / ".base.digest").write_text(prefix)
    else:
        log(f"reusing {base} (everything before the last COPY is unchanged)")
        _apply([s for s in steps[1:last_copy] if s[0] == "ENV"], base, context, env, offline, log)
    shutil.rmtree(image, ignore_errors=True)
    (context / "image.digest").unlink(missing_ok=True)
    # hard links: instant, and what the last steps change (pip writes new files) leaves the base as it was
    _run(["cp", "-al", str(base), str(image)], "copying the base root")
    _apply(steps[last_copy:], image, context, env, offline, log)
    (context / "image.digest").write_text(full)
    return image


def _apply(steps: list[tuple[str, str]], root: Path, context: Path, env: dict[str, str], offline: bool,
           log: Callable[[str], None]) -> None:
    for word, rest in steps:
        if word == "ENV":
            key, _, value = rest.partition("=")
            env[key] = value
        elif word == "COPY":
            source, target = rest.split()
            destination = root / target.lstrip("/")
            shutil.rmtree(destination, ignore_errors=True)
            if (context / source).is_dir():
                shutil.copytree(context / source, destination)
            else:
                shutil.copy2(context / source, destination)
        elif word == "RUN":
            log(f"RUN {rest[:100]}")
            run_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                       "USER": os.environ.get("USER") or "root", "LANG": "C.UTF-8", **env}
            if offline:
                run_env["PIP_NO_INDEX"] = "1"
            _run(["ch-run", "-w", str(root), "--", "/bin/sh", "-ec", rest], f"RUN {rest[:60]}", env=run_env)
        elif word not in ("LABEL",):
            raise UserError(f"image --builder debootstrap: {word} is not an instruction it runs")


def build_podman(context: Path, tag: str) -> None:
    _run(["podman", "build", "-t", tag, "-f", str(context / "Containerfile"), str(context)], "podman build")
