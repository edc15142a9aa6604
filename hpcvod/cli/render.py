"""``hpcvod render [OPTIONS] [-o FILE [--force]] SCRIPT [ARGS...]``: write the batch script without submitting."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from hpcvod.cli.command import Command
from hpcvod.cli.options import EXIT_OK, add_job_options, prepare_job, print_json
from hpcvod.support.errors import UserError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("render", help="write the batch script without submitting",
                       usage="hpcvod render [OPTIONS] [-o FILE [--force]] [--] SCRIPT [ARGS...]")
    add_job_options(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write the script here (default: stdout); an existing "
                   "file only if hpcvod rendered it, never the program the script launches")
    p.add_argument("--force", action="store_true", help="with -o: overwrite FILE even if hpcvod did not render it")
    return p


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    if args.force and not args.output:
        raise UserError("render: --force goes with -o FILE (it allows overwriting FILE)")
    prepared = prepare_job(args, program, argv)
    if args.output:
        from hpcvod.jobs.render import write_script

        write_script(Path(args.output), prepared.script, prepared.plan, force=args.force)
        print(f"wrote {args.output} ({prepared.plan.scheduler} script for site {prepared.plan.site})", file=sys.stderr)
    elif args.json:
        print_json({"plan": prepared.plan.to_dict(), "script": prepared.script})
    else:
        sys.stdout.write(prepared.script)
    return EXIT_OK


COMMAND = Command("render", add_parser, run, takes_program=True)
