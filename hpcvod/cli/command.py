"""One ``hpcvod`` command: its name, how it adds its parser, and what it runs. Each module of hpcvod/cli defines
one ``COMMAND``; hpcvod/cli/__init__.py lists them once, in the order ``hpcvod --help`` shows them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Command:
    name: str
    # the sub-parsers action of `hpcvod` -> this command's parser, with its arguments
    add_parser: Callable[[Any], argparse.ArgumentParser]
    # (parsed options, the program and its arguments, the whole argv) -> exit status
    run: Callable[[argparse.Namespace, list[str], Sequence[str]], int]
    # the command takes a program: options end at its first word, which with its arguments is passed untouched
    takes_program: bool = False
    # stdout is flushed before main() returns, so that a reader gone early (`| head`) is seen there
    flush_stdout: bool = False
