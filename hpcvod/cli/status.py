"""``hpcvod status [--wait] [--json] JOB``: where a job stands (JOB: a job id or a job folder)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from hpcvod.cli.command import Command
from hpcvod.cli.options import EXIT_FAILED, EXIT_OK, job_ref, print_json, wait_for_job
from hpcvod.support.errors import one_line


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("status", help="where a job stands")
    p.add_argument("job", metavar="JOB", help="job id or job folder")
    p.add_argument("--site", help="site to ask when JOB is an id no job folder records")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--wait", "-W", action="store_true", help="wait for the job to end (a live line on a "
                   "terminal); exit 1 if it failed; Ctrl-C stops waiting, not the job")
    return p


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod.jobs.elastic import job_min_nodes, job_worlds, status_lines
    from hpcvod.jobs.submission import array_task_states, component_states, job_status

    ref = job_ref(args.job, args.site)
    if args.wait:
        status = wait_for_job(ref, sys.stderr)
        if status is None:
            return 130
    else:
        status = job_status(ref)
    tasks = array_task_states(ref)
    parts = component_states(ref)
    min_nodes = job_min_nodes(ref.job_dir)  # an elastic job (submit --min-nodes): its worlds, as its ranks wrote them
    worlds = job_worlds(ref.job_dir) if min_nodes else []
    if args.json:
        print_json({"job_id": ref.job_id, "state": status.state, "raw": status.raw, "exit_code": status.exit_code,
                     "reason": status.reason, "source": status.source, "site": ref.site, "scheduler": ref.scheduler,
                     "job_dir": str(ref.job_dir) if ref.job_dir else None,
                     # epoch seconds where the scheduler says: started (pending: expected to start), ended
                     "start_time": status.start_time, "end_time": status.end_time,
                     **({"tasks": [{"index": i, "state": t.state, "exit_code": t.exit_code, "raw": t.raw}
                                   for i, t in tasks]} if tasks else {}),
                     **({"components": [{"part": name, "state": c.state, "exit_code": c.exit_code, "raw": c.raw}
                                        for name, c in parts]} if parts else {}),
                     **({"elastic": {"min_nodes": min_nodes, "worlds": [
                         {"time": w.time, "reset": w.reset, "size": w.size, "nodes": list(w.nodes)} for w in worlds]}}
                        if min_nodes else {})})
        return EXIT_OK
    line = f"{ref.job_id}  {status.state}"
    if status.exit_code is not None:
        line += f"  exit={status.exit_code}"
    line += f"  site={ref.site}  scheduler={ref.scheduler}"
    if status.raw and status.raw != status.state:
        line += f"  ({ref.scheduler}: {status.raw}"
        line += f", {status.reason})" if status.reason and status.reason not in ("None", "(null)") else ")"
    if ref.job_dir:
        line += f"  folder={ref.job_dir}"
    print(one_line(line))  # what the job folder and the scheduler said, escaped: no terminal escape, one line
    for index, task in tasks:  # an array job: each task's own state and exit status
        print(one_line(f"  task {index}  {task.state}"
                       + (f"  exit={task.exit_code}" if task.exit_code is not None else "")))
    for index, (name, part) in enumerate(parts):  # a heterogeneous job: the compute part and the training
        print(one_line(f"  component {index} ({name})  {part.state}"
                       + (f"  exit={part.exit_code}" if part.exit_code is not None else "")))
    for line in status_lines(min_nodes, worlds) if min_nodes else []:
        print(one_line(line))
    return EXIT_FAILED if args.wait and status.state != "COMPLETED" else EXIT_OK


COMMAND = Command("status", add_parser, run, flush_stdout=True)
