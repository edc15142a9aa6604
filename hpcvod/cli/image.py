"""``hpcvod image --site SITE [-o DIR] [--build]``: a Containerfile for a site's ranks, built where a builder runs."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from hpcvod.cli.command import Command
from hpcvod.cli.options import EXIT_OK
from hpcvod.support.errors import UserError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("image", help="write (and build) a container image for a site: its MPI wheel, the "
                       "frameworks, a CUDA base for GPU partitions, hpcvod; docs/containers.md")
    p.add_argument("--site", required=True, help="the site profile (name or path) the image is for")
    p.add_argument("-o", "--output", metavar="DIR", help="the build folder (default: ./hpcvod-image-SITE)")
    p.add_argument("--framework", action="append", default=[], metavar="NAME",
                   help="torch, tensorflow or mxnet, at the version installed here (repeat for several)")
    p.add_argument("--cuda", choices=("12", "13"), help="a CUDA base of this major version (default: 12 when a "
                   "partition has GPUs, else Debian)")
    p.add_argument("--base", metavar="IMAGE", help="another FROM image (it needs apt-get and python3)")
    p.add_argument("--download", action="store_true", help="put every requirement's wheel for this Python into "
                   "DIR/wheels, so that the build needs no package index")
    p.add_argument("--build", action="store_true", help="build it too: a folder image DIR/image (builder "
                   "debootstrap, for Debian bases) or a podman image")
    p.add_argument("--builder", choices=("debootstrap", "podman"),
                   help="default: debootstrap for a Debian base when debootstrap and ch-run are here, else podman")
    p.add_argument("--tag", help="podman's image name (default: hpcvod-SITE)")
    return p


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod.containers import image
    from hpcvod.schedulers import profile_options
    from hpcvod.sites.loader import load_site

    site = load_site(args.site, schedulers=profile_options())
    rec = image.recipe(site, args.framework, args.cuda, args.base)
    out = Path(args.output or f"hpcvod-image-{site.name}")
    if (args.builder or args.tag) and not args.build:
        raise UserError("image: --builder and --tag go with --build")
    builder = None
    if args.build:
        debian = image.DEBIAN_FROM.match(rec.base) is not None
        builder = args.builder or ("debootstrap" if debian and shutil.which("debootstrap") and shutil.which("ch-run")
                                   else "podman")
        if builder == "debootstrap" and not debian:  # refused before anything is written
            raise UserError(f"image --builder debootstrap: FROM {rec.base}: debootstrap makes Debian roots only "
                            f"(FROM debian:SUITE); build a CUDA base with podman, docker or apptainer")
        if builder == "podman" and shutil.which("podman") is None:
            raise UserError(f"image --build: no builder here for FROM {rec.base} (podman is not on PATH; "
                            f"debootstrap builds Debian bases only): write the Containerfile without --build and "
                            f"build it with podman, docker or apptainer where one runs")
    image.write_context(rec, out, download=args.download)
    print(f"wrote {out / 'Containerfile'} (site {site.name}, {rec.mpi_flavour}, FROM {rec.base})", file=sys.stderr)
    if builder is None:
        return EXIT_OK
    if builder == "podman":
        tag = args.tag or f"hpcvod-{site.name}"
        image.build_podman(out, tag)
        print(f"built podman image {tag}; profile: container.runtime: podman, container.image: {tag}, "
              f"container.python: {image.PYTHON}", file=sys.stderr)
        return EXIT_OK
    built = image.build_debootstrap(out, offline=args.download, log=lambda line: print(line, file=sys.stderr))
    print(f"built folder image {built.resolve()}; profile: container.runtime: charliecloud, container.image: "
          f"{built.resolve()}, container.python: {image.PYTHON}", file=sys.stderr)
    return EXIT_OK


COMMAND = Command("image", add_parser, run)
