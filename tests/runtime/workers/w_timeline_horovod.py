"""Horovod's test/parallel/test_timeline.py on hpcvod, then more of the same file read while the job runs.

Usage: w_timeline_horovod.py TIMELINE_PATH  (the test sets HOROVOD_TIMELINE/HPCVOD_TIMELINE and *_MARK_CYCLES)

As Horovod's test: one allreduce named test_allreduce, 0.1 s, then rank 0 opens the timeline. Then a grouped
(fused) allreduce, a broadcast and an allgather, and rank 0 reads the file again, still before shutdown(). Rank 0
prints ``LOOK <json>`` per look: what it found when it first opened the file, how long the events took to arrive
(polled; the test asserts that they arrive while the job runs, never a time), whether the text was complete JSON,
the file's mode, and the rows with their spans as ``hpcvod timeline summary``'s reader pairs them.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time

from hpcvod.jobs.timeline_summary import Tally, spans_of

try:   # Horovod's test uses PyTorch; the venvs of the other MPI flavours have NumPy only (the same engine below)
    import torch

    import hpcvod.torch as hvd
    ones, tensor = torch.ones, (lambda values: torch.tensor(values, dtype=torch.float32))
except ImportError:
    import numpy as np

    import hpcvod.runtime as hvd
    ones, tensor = (lambda *shape: np.ones(shape, np.float32)), (lambda values: np.array(values, np.float32))

path = sys.argv[1]


def look(wanted: list[str]) -> None:
    """Rank 0: open the timeline now, then poll until every ``wanted`` text is in it (30 s at most)."""
    with open(path) as f:
        first = f.read()
    started = time.monotonic()
    text = first
    while not all(w in text for w in wanted) and time.monotonic() - started < 30:
        time.sleep(0.005)
        with open(path) as f:
            text = f.read()
    try:
        events = json.loads(text)
        complete = True
    except ValueError:
        events, complete = [], False
    rows: dict[str, list[list]] = {}
    for span in spans_of(path, events, Tally()):
        rows.setdefault(span.tensor, []).append([span.name, span.start, span.end, span.operation])
    report = {"first_bytes": len(first), "first_has": [w for w in wanted if w in first],
              "has": [w for w in wanted if w in text], "waited": time.monotonic() - started,
              "complete_json": complete, "mode": stat.S_IMODE(os.stat(path).st_mode), "rows": rows,
              "cycle_marks": sum(1 for e in events if e.get("name") == "CYCLE_START" and e.get("ph") == "i")}
    print("LOOK " + json.dumps(report), flush=True)


hvd.init()
# Horovod's test_timeline, as it is
hvd.allreduce(tensor([1, 2, 3]), name="test_allreduce")
time.sleep(0.1)
if hvd.rank() == 0:
    look(["allreduce.test_allreduce", "NEGOTIATE_ALLREDUCE", '"ALLREDUCE"', "MPI_ALLREDUCE"]
         + (["CYCLE_START"] if os.environ.get("EXPECT_CYCLES") == "1" else []))
hvd.barrier()

# more of the job, read again before it ends
hvd.grouped_allreduce([ones(8) for _ in range(3)], name="bias")
hvd.broadcast(ones(5), root_rank=0, name="weights")
hvd.allgather(ones(2, 3), name="metrics")
if hvd.rank() == 0:
    look(["allreduce.bias.2", "MEMCPY_IN_FUSION_BUFFER", "NEGOTIATE_BROADCAST", '"BROADCAST"', "MPI_BCAST",
          "allgather.metrics", "MPI_ALLGATHERV"])
hvd.barrier()
rank = hvd.rank()
hvd.shutdown()
print(f"rank {rank} done", flush=True)
