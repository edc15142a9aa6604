"""``hpcvod jobs [--json]``: the job folders, newest first, and where each job stands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from hpcvod.cli.command import Command
from hpcvod.cli.options import EXIT_OK, print_json


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("jobs", help="the job folders, newest first: name, id, site, state, submitted, elapsed, exit")
    p.add_argument("--output-dir", metavar="DIR", action="append",
                   help="where the job folders are (repeatable; default: $HPCVOD_JOBS_DIR, then ./hpcvod-jobs)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return p


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod.jobs.watch import format_rows, job_folders, job_rows

    roots = [Path(d) for d in args.output_dir] if args.output_dir else None
    rows = job_rows(job_folders(roots))
    if args.json:
        print_json([row.to_dict() for row in rows])
    elif not rows:
        from hpcvod.jobs.jobdir import default_roots

        print(f"(no job folders under {', '.join(map(str, roots or default_roots()))})", file=sys.stderr)
    else:
        print("\n".join(format_rows(rows)))
    return EXIT_OK


COMMAND = Command("jobs", add_parser, run, flush_stdout=True)
