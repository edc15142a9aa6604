"""``hpcvod submit [OPTIONS] SCRIPT [ARGS...]``: render a batch script for the site and submit it (or print it:
--dry-run); --wait, --follow and --show-output wait for the job."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from hpcvod.cli.command import Command
from hpcvod.cli.options import EXIT_FAILED, EXIT_OK, add_job_options, prepare_job, print_json, wait_for_job
from hpcvod.support.errors import UserError, one_line


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("submit", help="submit a job (a .py script runs under the job's Python)",
                       usage="hpcvod submit [OPTIONS] [--] SCRIPT [ARGS...]")
    add_job_options(p)
    p.add_argument("--output-dir", metavar="DIR", help="where job folders are created (default ./hpcvod-jobs)")
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    p.add_argument("--wait", "-W", action="store_true", help="wait for the job to end; exit 1 if it failed")
    p.add_argument("--show-output", action="store_true", help="with --wait: print the job's output at the end")
    p.add_argument("--follow", action="store_true", help="wait, and print rank 0's output as it comes (the live "
                   "line on stderr shows the time left of --time)")
    return p


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod.jobs.jobdir import DEFAULT_ROOT
    from hpcvod.jobs.submission import refuse_another_mpi, secret_values, submit_prepared
    from hpcvod.jobs.watch import follow_output, progress

    waits = [flag for flag, given in (("--wait", args.wait), ("--follow", args.follow),
                                      ("--show-output", args.show_output)) if given]
    if args.dry_run and waits:
        raise UserError(f"submit: {waits[0]} waits for a job, and --dry-run submits none: give one of them")
    if args.follow and args.show_output:
        raise UserError("submit: --follow prints the output as it comes, --show-output at the end: give one of them")
    prepared = prepare_job(args, program, argv)
    secret_values(prepared.plan.secret_env)  # a secret not set here is refused by a dry run too
    from hpcvod.jobs.plan import world_line

    if args.dry_run:
        print(world_line(prepared.plan), file=sys.stderr)  # what -N/-G/--tasks-per-node add up to
        if args.json:
            print_json({"plan": prepared.plan.to_dict(), "script": prepared.script})
        else:
            sys.stdout.write(prepared.script)
        return EXIT_OK
    with progress(sys.stderr, "checking which MPI the job's Python loads"):
        refuse_another_mpi(prepared.plan)
    with progress(sys.stderr, f"submitting to {prepared.plan.scheduler}"):
        ref = submit_prepared(prepared, Path(args.output_dir or DEFAULT_ROOT),
                              root_option="--output-dir" if args.output_dir else "jobs folder")
    print(world_line(prepared.plan), file=sys.stderr)
    if not args.json:
        print(one_line(f"submitted job {ref.job_id} to site {ref.site} ({ref.scheduler}); folder: {ref.job_dir}"))
        sys.stdout.flush()
    status = None
    if args.wait or args.show_output or args.follow:
        status = wait_for_job(ref, sys.stderr, follow=sys.stdout if args.follow else None,
                       time_limit=prepared.plan.time_seconds)
        if status is None:
            return 130
        if args.show_output:
            follow_output(ref, sys.stdout, follow=False)
    if args.json:
        out = {"job_id": ref.job_id, "job_dir": str(ref.job_dir), "site": ref.site, "scheduler": ref.scheduler}
        if status is not None:
            out.update(state=status.state, exit_code=status.exit_code)
        print_json(out)
    if status is not None and status.state != "COMPLETED":
        return EXIT_FAILED
    return EXIT_OK


COMMAND = Command("submit", add_parser, run, takes_program=True)
