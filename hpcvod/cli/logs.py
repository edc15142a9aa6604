"""``hpcvod logs [-f] [--rank N] JOB``: a job's output, each line labelled ``[RANK]<stdout|stderr>``."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from hpcvod.cli.command import Command
from hpcvod.cli.options import EXIT_OK, job_ref
from hpcvod.support.errors import UserError, one_line


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("logs", help="print a job's output (each line labelled [RANK]<stdout|stderr>)")
    p.add_argument("job", metavar="JOB", help="job id or job folder")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends (also across "
                   "a requeue)")
    p.add_argument("--rank", type=int, metavar="N", help="only the lines of rank N")
    return p


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod.jobs.submission import job_has_data_service, job_world_size, scheduler_of
    from hpcvod.jobs.watch import follow_output, log_files
    from hpcvod.schedulers.base import DATA_SERVICE_LOG

    if args.rank is not None and args.rank < 0:
        raise UserError(f"logs: --rank {args.rank}: expected a rank number >= 0")
    ref = job_ref(args.job)
    if ref.job_dir is None:
        raise UserError(f"JOB {args.job!r}: logs need the job folder (no folder records this id)")
    size = job_world_size(ref)
    if args.rank is not None and size is not None and args.rank >= size and not job_has_data_service(ref):
        ranks = "rank 0 only" if size == 1 else f"ranks 0-{size - 1}"
        raise UserError(f"logs: --rank {args.rank}: job {ref.job_id} has {ranks}")
    scheduler_of(ref).refresh_output(ref.job_id, ref.job_dir)  # kubernetes: the launcher pod's log, fetched
    logs = log_files(ref)
    if not args.follow and not logs[0][1].exists():
        print(one_line(f"(no output yet: {ref.output})"), file=sys.stderr)
        return EXIT_OK
    try:
        for index, path in logs:  # an array job: each task's log in turn, under a header
            if index is not None:
                print(one_line(f"==> array task {index}: {path.name} <=="), flush=True)
            follow_output(ref, sys.stdout, follow=args.follow, rank=args.rank, path=path)
        compute_log = ref.job_dir / DATA_SERVICE_LOG  # submit --data-service-nodes: the compute job's own log
        if compute_log.exists():
            print(f"==> tf.data service compute job: {DATA_SERVICE_LOG} <==", flush=True)
            follow_output(ref, sys.stdout, follow=False, rank=args.rank, path=compute_log)
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


COMMAND = Command("logs", add_parser, run, flush_stdout=True)
