"""The ``hpcvod`` command.

  hpcvod submit [OPTIONS] SCRIPT [ARGS...]    render a batch script for the site and submit it
  hpcvod render [OPTIONS] [-o FILE] SCRIPT    write the script without submitting
  hpcvod status [--wait]|logs [-f] [--rank N]|cancel JOB    JOB = job id or job folder
  hpcvod jobs [--json]                        the job folders here, newest first, and where each job stands
  hpcvod sites list|show NAME|validate FILE...|schema
  hpcvod run -np N [...] COMMAND...           start ranks here (or on -H hosts), like horovodrun
  hpcvod doctor [--site S]                    what MPI, launcher and frameworks this machine (and S's jobs) have

Exit status: 0 success, 1 the job or the scheduler failed, 2 bad input (one line on stderr, no traceback).
Nothing here imports MPI or a framework: submitting must stay fast on a login node.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from hpcvod import __version__
from hpcvod.cli import cancel, doctor, image, jobs, logs, render, run, sites, status, submit, timeline
from hpcvod.cli.command import Command
from hpcvod.cli.options import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Parser, split_program
from hpcvod.support.errors import UserError, one_line

# Every command, once, in the order `hpcvod --help` lists them
COMMANDS: tuple[Command, ...] = tuple(module.COMMAND for module in (submit, render, status, cancel, logs, jobs, sites,
                                                                     run, timeline, doctor, image))
COMMAND_BY_NAME = {command.name: command for command in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The `hpcvod` parser with every command's sub-parser."""
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `hpcvod` parser, and each command's own parser by name (split_program reads a program-taking
    command's options from it)."""
    parser = Parser(prog="hpcvod", description="Horovod-style training that knows Slurm and PBS.")
    parser.add_argument("--version", action="version", version=f"hpcvod {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    return parser, {command.name: command.add_parser(sub) for command in COMMANDS}


def _parse(parser: argparse.ArgumentParser, argv: list[str],
           command_parsers: dict[str, argparse.ArgumentParser]) -> argparse.Namespace:
    """parse_args, whose 'unrecognized arguments' line also names the command's nearest flag to each (difflib):
    a typo, or another tool's flag (horovodrun's, sbatch's) hpcvod spells differently."""
    import difflib

    args, extras = parser.parse_known_args(argv)
    if extras:
        own = [flag for action in command_parsers[args.command]._actions for flag in action.option_strings]
        near = [f"{extra} -> {match[0]}" for extra in extras if extra.startswith("-")
                for match in [difflib.get_close_matches(extra.split("=", 1)[0], own, n=1, cutoff=0.7)] if match]
        parser.error(f"unrecognized arguments: {' '.join(extras)}" + (f"; nearest: {', '.join(near)}" if near else ""))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, command_parsers = _build()
    try:
        word = next((w for w in argv if not w.startswith("-")), None)
        program: list[str] = []
        if word in COMMAND_BY_NAME and COMMAND_BY_NAME[word].takes_program:
            at = argv.index(word)
            options, program = split_program(command_parsers[word], argv[at + 1:])
            args = _parse(parser, argv[:at + 1] + options, command_parsers)
        else:
            args = _parse(parser, argv, command_parsers)
        command = COMMAND_BY_NAME[args.command]
        code = command.run(args, program, argv)
        if command.flush_stdout:
            sys.stdout.flush()  # a reader gone early is seen here, inside main() (BrokenPipeError)
        return code
    except UserError as err:
        print(f"hpcvod: error: {one_line(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `hpcvod jobs | head -1`: the reader has what it wanted; no error, and no message
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return EXIT_OK
    except Exception as err:  # a scheduler command that failed, a full disk...: one line, not a traceback
        from hpcvod.schedulers.base import SchedulerError

        if isinstance(err, (SchedulerError, OSError)) and not os.environ.get("HPCVOD_DEBUG"):
            print(f"hpcvod: {one_line(str(err))}", file=sys.stderr)
            return EXIT_FAILED
        raise


if __name__ == "__main__":
    sys.exit(main())
