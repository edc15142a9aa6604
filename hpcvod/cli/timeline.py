"""``hpcvod timeline summary FILE...``: a timeline's top collectives, negotiation against transfer per rank, and
stalls, as tables (and a picture with -o); the reading itself is hpcvod/jobs/timeline_summary.py."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from hpcvod.cli.command import Command


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from hpcvod.jobs.timeline_summary import DEFAULT_MAX_MIB

    p = sub.add_parser("timeline", help="read a timeline (HPCVOD_TIMELINE): hpcvod timeline summary FILE")
    verbs = p.add_subparsers(dest="timeline_command", metavar="summary", required=True)
    q = verbs.add_parser("summary", help="top collectives by time, negotiation against transfer per rank, stalls")
    q.add_argument("files", nargs="+", metavar="FILE",
                   help="timeline file(s): one per rank where HPCVOD_TIMELINE held {rank}")
    q.add_argument("-o", "--output", metavar="PNG", help="also draw the summary into this PNG file (needs "
                   "matplotlib: pip install 'hpcvod[plots]')")
    q.add_argument("--top", type=int, default=10, help="rows of the collectives and stalls tables (default 10)")
    q.add_argument("--stall-ms", type=float, default=100.0,
                   help="a negotiation this long or longer is a stall (default 100)")
    q.add_argument("--max-mib", type=float, default=DEFAULT_MAX_MIB,
                   help=f"refuse a file larger than this (default {DEFAULT_MAX_MIB})")
    return p


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod.jobs.timeline_summary import summary_command

    return summary_command(args)


COMMAND = Command("timeline", add_parser, run)
