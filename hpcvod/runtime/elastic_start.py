"""``python -m hpcvod.runtime.elastic_start [--assign RANK:HOST,HOST,...] -- PROGRAM ARGS...``: how ``hpcvod run``'s
elastic driver starts each rank. It sets Horovod's worker variables (HOROVOD_RANK as the rank the worker starts
with, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_HOSTNAME, ...; elastic_link.horovod_variables) and then becomes
the program (exec), so that the rank's process is the program's.

Ranks of the first world find their rank in the launcher's variables and the hosts in HPCVOD_ELASTIC_SLOTS;
a rank spawned into a running world at a reset gets both with ``--assign`` (its new rank, and every rank's host
in the merged world) and merges with that world at ``hvd.init()`` (HPCVOD_ELASTIC_JOIN).
"""

from __future__ import annotations

import os
import sys

from .elastic_link import JOIN_VARIABLE, SLOTS_VARIABLE, expand_slots, horovod_variables
from .world import launcher_rank


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.exit("usage: python -m hpcvod.runtime.elastic_start [--assign RANK:HOST,...] -- PROGRAM ARGS...")
    split = argv.index("--")
    options, program = argv[:split], argv[split + 1:]
    if options[:1] == ["--assign"] and len(options) == 2:
        rank_text, _, hosts = options[1].partition(":")
        rank, rank_hosts = int(rank_text), hosts.split(",")
        os.environ[JOIN_VARIABLE] = "1"
    else:
        rank_hosts = expand_slots(os.environ[SLOTS_VARIABLE])
        rank = launcher_rank() or 0
        os.environ.pop(JOIN_VARIABLE, None)
    os.environ.update(horovod_variables(rank, rank_hosts))
    sys.stdout.flush()
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
