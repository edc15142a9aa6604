"""What every rank of a `hpcvod sites check` job runs: ``hpcvod.runtime.sitecheck.probe`` on the request given as
the one argument (JSON), its record written to ``$HPCVOD_JOB_DIR/sitecheck/<rank>.json`` for the submitter. Plain
files, not the Python API's pickles: the check must work in a job Python without submitit."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from hpcvod.runtime.sitecheck import ENDED_IN_MPI, RECORDS_DIR, probe
from hpcvod.runtime.world import launcher_rank


def main() -> int:
    out = Path(os.environ["HPCVOD_JOB_DIR"], RECORDS_DIR)
    out.mkdir(exist_ok=True)
    rank = launcher_rank() or 0

    def write(record: dict) -> None:
        tmp = out / f".{rank}.json.tmp"
        tmp.write_text(json.dumps(record))
        tmp.rename(out / f"{rank}.json")

    try:
        # replaced by the full record below unless the MPI ends this process first
        record = probe(json.loads(sys.argv[1]), before_mpi=lambda early: write({**early, ENDED_IN_MPI: True}))
    except Exception:  # the submitter shows it as evidence; the job's exit status says it failed
        traceback.print_exc()
        record = {"error": traceback.format_exc()[-3000:]}
    write(record)
    return 1 if "error" in record or "init_error" in record else 0


if __name__ == "__main__":
    sys.exit(main())
