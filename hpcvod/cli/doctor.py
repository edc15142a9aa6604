"""``hpcvod doctor [--site S]``: what MPI, launcher, mpi4py and frameworks this machine (and S's jobs) have."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from hpcvod.cli.command import Command


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("doctor", help="what MPI, launcher, mpi4py and frameworks this machine has")
    p.add_argument("--site", help="the site whose jobs to check (default: the one a submit from here would use)")
    return p


def site_job_mpi(site) -> tuple[str, str]:
    """`doctor`'s view of submit's MPI check: a job of ``site`` run from here (a .py script, the defaults)."""
    import dataclasses
    import tempfile

    from hpcvod.machine.host import detect_host
    from hpcvod.jobs.plan import resolve
    from hpcvod.jobs.spec import JobSpec

    with tempfile.TemporaryDirectory(prefix="hpcvod-doctor-") as tmp:
        (Path(tmp) / "train.py").write_text("")
        plan = resolve(JobSpec(program="train.py"), site, dataclasses.replace(detect_host(), cwd=tmp))
    from hpcvod.jobs.submission import job_mpi_verdict

    return job_mpi_verdict(plan)


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod.machine.doctor import doctor
    from hpcvod.schedulers import profile_options
    from hpcvod.sites.loader import discover_site

    return doctor(sys.stdout, lambda hostname: discover_site(args.site, hostname, schedulers=profile_options()),
                  site_job_mpi)


COMMAND = Command("doctor", add_parser, run)
