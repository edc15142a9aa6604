"""No batch system: run the rendered script in the background on this machine.

The script runs in its own session (so its whole process tree is one process group that cancel can signal),
with stdout+stderr in the job folder's output.log; its pid and start time go to job.json, and the script
itself records its exit status in the folder. Status, logs and cancel then work as they do on Slurm.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from hpcvod.launchers import without_outer_launch
from hpcvod.schedulers.base import (CANCELLED, COMPLETED, FAILED, OUTPUT_FILE, RUNNING, UNKNOWN, JobStatus, Scheduler,
                                    SchedulerError, Submitted, read_cancel_marker, read_exit_file)

def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks) of a live process, from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[2]), int(fields[19])


def _alive(pid: int, start_time: int | None) -> bool:
    stat = _proc_stat(pid)
    if stat is None:
        return False
    state, _, started = stat
    return state != "Z" and (start_time is None or started == start_time)


def _job_processes(roots: "set[int]", pgid: int) -> list[int]:
    """Live (non-zombie) processes of the job: its process group and every descendant of ``roots`` (MPI
    launchers put ranks in sessions of their own, out of the group's reach)."""
    stats = {}
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        child = int(entry.name)
        stats[child] = (fields[0], int(fields[2]))
        parents.setdefault(int(fields[1]), []).append(child)
    found = {p for p, (_, group) in stats.items() if group == pgid} | set(roots)
    todo = list(found)
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(p for p in found if p in stats and stats[p][0] != "Z")


def _job_record(job_dir: Path | None) -> dict:
    if job_dir is None:
        return {}
    try:
        return json.loads((job_dir / "job.json").read_text())
    except (OSError, ValueError):
        return {}


def _pid_of(job_id: str, job_dir: Path | None) -> tuple[int, int | None]:
    record = _job_record(job_dir)
    if "pid" in record:
        return int(record["pid"]), record.get("start_time")
    if job_id.startswith("local-") and job_id[6:].isdigit():
        return int(job_id[6:]), None
    raise SchedulerError(f"job {job_id!r}: not a local job id (local-PID) and no job folder records it")


class LocalScheduler(Scheduler):
    name = "local"
    script_name = "job.sh"
    poll_seconds = 0.2

    @staticmethod
    def parse_job_id(text: str) -> str:
        return text.strip()

    def submit(self, job_dir: Path, script: Path) -> Submitted:
        env = without_outer_launch(os.environ)
        with open(job_dir / OUTPUT_FILE, "ab") as log:
            proc = subprocess.Popen(["bash", script.name], cwd=job_dir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        stat = _proc_stat(proc.pid)
        # reap it when it ends if this process lives that long (Python API); the CLI exits long before
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
        return Submitted(f"local-{proc.pid}", {"pid": proc.pid, "pgid": proc.pid,
                                               "start_time": stat[2] if stat else None})

    def status(self, job_id: str, job_dir: Path | None) -> JobStatus:
        code = read_exit_file(job_dir)
        cancelled = read_cancel_marker(job_dir)
        if code is not None:
            if code == 0:
                return JobStatus(COMPLETED, raw="exited 0", exit_code=0, source="exitcode file")
            return JobStatus(CANCELLED if cancelled else FAILED, raw=f"exited {code}", exit_code=code,
                             source="exitcode file")
        pid, start_time = _pid_of(job_id, job_dir)
        if _alive(pid, start_time):
            return JobStatus(RUNNING, raw=f"pid {pid} running", source="/proc")
        if cancelled:
            return JobStatus(CANCELLED, raw=f"pid {pid} ended", reason="cancelled", source="cancel marker")
        if job_dir is None:
            return JobStatus(UNKNOWN, raw=f"pid {pid} not running", source="/proc")
        return JobStatus(FAILED, raw=f"pid {pid} ended", reason="the job ended without recording an exit status",
                         source="/proc")

    def cancel(self, job_id: str, job_dir: Path | None, grace_seconds: float = 5.0) -> None:
        """SIGTERM to the job's process group and every process it started (MPI launchers put ranks in sessions
        of their own), SIGKILL to whatever is left after the grace time. The tree is looked at again on every
        round: a launcher that was still starting when cancel came is caught as well, and a process that lost
        its parent stays known (by pid and start time, so a reused pid is never hit)."""
        pid, start_time = _pid_of(job_id, job_dir)
        pgid = _job_record(job_dir).get("pgid", pid)
        if not _alive(pid, start_time):
            return  # already over (or the pid now belongs to someone else)
        known: dict[int, int] = {}  # pid -> start time
        signalled: dict[int, int] = {}  # pid -> last signal sent
        sig = signal.SIGTERM
        deadline = time.monotonic() + grace_seconds
        while True:
            for target in _job_processes({pid, *known}, pgid):
                stat = _proc_stat(target)
                if stat:
                    known.setdefault(target, stat[2])
            live = [p for p, started in known.items() if _alive(p, started)]
            if not live:
                return
            try:
                os.killpg(pgid, sig)  # also reaches what starts between two looks at the tree
            except (ProcessLookupError, PermissionError):
                pass
            for target in live:
                if signalled.get(target) != sig:
                    try:
                        os.kill(target, sig)
                    except ProcessLookupError:
                        pass
                    signalled[target] = sig
            if time.monotonic() > deadline:
                if sig == signal.SIGKILL:
                    return
                sig, deadline = signal.SIGKILL, time.monotonic() + grace_seconds
            time.sleep(0.05)


SCHEDULER = LocalScheduler
