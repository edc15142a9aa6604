"""``hpcvod cancel JOB``: cancel a job that has not ended (JOB: a job id or a job folder)."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from hpcvod.cli.command import Command
from hpcvod.cli.options import EXIT_OK, job_ref
from hpcvod.support.errors import one_line


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("cancel", help="cancel a job")
    p.add_argument("job", metavar="JOB", help="job id or job folder")
    p.add_argument("--site", help="site to ask when JOB is an id no job folder records")
    return p


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod.jobs.submission import cancel_job

    ref = job_ref(args.job, args.site)
    ended = cancel_job(ref)
    if ended is not None:  # nothing was asked of the scheduler, and the job keeps the end it had
        exit_text = f", exit {ended.exit_code}" if ended.exit_code is not None else ""
        print(one_line(f"job {ref.job_id} already ended ({ended.state}{exit_text}): nothing to cancel"))
        return EXIT_OK
    print(one_line(f"cancel requested for job {ref.job_id} ({ref.scheduler})"))
    return EXIT_OK


COMMAND = Command("cancel", add_parser, run)
