"""An elastic batch job's side of ``hpcvod submit --min-nodes`` (docs/elastic.md, "Batch jobs"), met through the
environment only (docs/contract.md), never through the submission side's code:

* ``HPCVOD_ELASTIC_MIN_NODES``: after a reset, a world on fewer nodes than this ends the job, on every rank, with
  one line and a non-zero status (the survivors would otherwise train on, ever slower, on what is left).
* ``HPCVOD_ELASTIC_EVENTS``: a file (in the job folder) that rank 0 appends one JSON line to when ``hvd.elastic.run``
  starts and after each reset: the world's size, its nodes, and the ranks' hosts; and ``{"event": "exit"}`` when
  that process exits normally. ``hpcvod status`` reads it; the job script checks the last line: mpirun can end
  every rank and still exit 0 when Slurm takes a failed node's daemons away (docs/elastic.md).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

from . import context
from .config import number

EVENTS_ENV = "HPCVOD_ELASTIC_EVENTS"
MIN_NODES = number("ELASTIC_MIN_NODES", 0, 1 << 24, "nodes", whole=True, horovod=False, blank_is_unset=True,
                   note="0 = no minimum")
EXIT_TOO_FEW_NODES = 75   # the reset limit's is Horovod's; this one is hpcvod's own, told apart in the log


def world_changed(resets: int) -> None:
    """Collective over the current world, called when ``hvd.elastic.run`` starts (``resets`` 0) and after each
    reset: record the world (rank 0, when HPCVOD_ELASTIC_EVENTS is set) and end the job on every rank, in one
    line, when it spans fewer nodes than HPCVOD_ELASTIC_MIN_NODES. Nothing happens without either variable."""
    path = os.environ.get(EVENTS_ENV) or None
    least = int(MIN_NODES.read(0))
    if path is None and not least:
        return
    from . import collectives   # here: importing it loads mpi4py.MPI, and importing elastic must not start MPI
    hosts = collectives.allgather_object(context.runtime().info.hostname, name="hpcvod.elastic.hosts")
    nodes = sorted(set(hosts))
    if path is not None and context.rank() == 0:
        _append(path, {"time": round(time.time(), 3), "event": "reset" if resets else "start", "reset": resets,
                       "size": len(hosts), "nodes": nodes, "hosts": hosts})
        if not resets:   # registered after the runtime's own exit hook, so it runs before it (and its hard exits)
            atexit.register(_append, path, {"event": "exit"})
    if resets and len(nodes) < least:   # every rank sees the same hosts: all end together, cleanly
        print(f"hpcvod: rank {context.rank()}: elastic job: {len(nodes)} node{'s' if len(nodes) != 1 else ''} left "
              f"({', '.join(nodes)}), fewer than the {least} it needs (HPCVOD_ELASTIC_MIN_NODES, submit --min-nodes); "
              f"ending the job", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_TOO_FEW_NODES)


def _append(path: str, event: dict) -> None:
    """One line, in one write, to a file only this user can read (it names the job's hosts)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(event, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)
