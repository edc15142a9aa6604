"""What every rank of a Python-API job runs (``hpcvod.jobs.python_api``): load the pickled call, run it, pickle
the outcome for the caller. Started by the rendered script like any other program; it finds everything in
``$HPCVOD_JOB_DIR`` (the job folder): the job id in job.json, the call in ``<job id>_submitted.pkl``, and it
writes ``<job id>_<rank>_result.pkl`` in submitit's format.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from submitit.core import utils

from hpcvod.runtime.world import launcher_rank

WAIT_SECONDS = 120  # for job.json and the pickle: the submitter writes them right after the scheduler said yes


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear within {WAIT_SECONDS} s")
        time.sleep(0.05)


def main() -> int:
    job_dir = Path(os.environ["HPCVOD_JOB_DIR"])
    _wait_for(job_dir / "job.json")
    job_id = json.loads((job_dir / "job.json").read_text())["job_id"]
    paths = utils.JobPaths(job_dir, job_id=job_id, task_id=launcher_rank() or 0)
    _wait_for(paths.submitted_pickle)
    delayed = utils.DelayedSubmission.load(paths.submitted_pickle)
    try:
        outcome = ("success", delayed.result())
        status = 0
    except Exception:  # the caller gets the traceback; the job's exit status says it failed
        outcome = ("error", traceback.format_exc())
        traceback.print_exc()
        status = 1
    with utils.temporary_save_path(paths.result_pickle) as tmp:
        utils.cloudpickle_dump(outcome, tmp)
    return status


if __name__ == "__main__":
    sys.exit(main())
