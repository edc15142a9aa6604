"""No batch system: run the rendered script in the background on this machine.

The script runs in its own session (so its whole process tree is one process group that cancel can signal),
with stdout+stderr in the job folder's output.log; its pid and start time go to job.json, and the script
itself records its exit status in the folder. Status, logs and cancel then work as they do on Slurm.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpcvod.launchers import without_outer_launch
from hpcvod.schedulers.base import (CANCELLED, COMPLETED, FAILED, OUTPUT_FILE, RUNNING, UNKNOWN, JobStatus, Scheduler,
                                    Submitted, read_cancel_marker, read_exit_file)
from hpcvod.support.errors import UserError
from hpcvod.sites.joboptions import option_names

PID_MAX = 1 << 22  # Linux's largest pid_max
SCRIPT_ARGV = ("bash", "job.sh")  # what submit starts, in the job folder: the only process cancel may signal
GONE = "is not running"  # _why_not_the_job's answer for a process that has ended


def _parse_stat(text: str) -> tuple[str, int, int, int]:
    """(state, parent pid, process group, start time in clock ticks) from a /proc/PID/stat line."""
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks) of a live process, from /proc."""
    try:
        state, _, group, started = _parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None
    return state, group, started


def _alive(pid: int, start_time: int | None) -> bool:
    stat = _proc_stat(pid)
    if stat is None:
        return False
    state, _, started = stat
    return state != "Z" and (start_time is None or started == start_time)


def _why_not_the_job(pid: int, record: dict) -> str | None:
    """None if ``pid`` is the job script that submit started and job.json recorded; else why it is not (it has
    ended, or the pid now belongs to another process: the OS reuses pids, and job.json can be edited)."""
    stat = _proc_stat(pid)
    if stat is None or stat[0] == "Z":
        return GONE
    _, group, started = stat
    if record.get("start_time") is None:
        return "cannot be told from a process that got the pid later (job.json records no start time)"
    if started != record["start_time"]:
        return (f"started at clock tick {started}, not at {record['start_time']} as job.json records "
                "(the pid was reused)")
    if group != record["pgid"]:
        return f"is in process group {group}, not in {record['pgid']} as job.json records"
    try:
        argv = tuple(os.fsdecode(w) for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1])
    except OSError:
        return GONE
    if argv and argv != SCRIPT_ARGV:  # empty: the kernel is still in the exec of bash (its pid and start match)
        return f"runs {' '.join(argv)[:80]!r}, not the job script ({' '.join(SCRIPT_ARGV)})"
    return None


def _job_processes(roots: "set[int]", pgid: int) -> list[int]:
    """Live (non-zombie) processes of the job: its process group and every descendant of ``roots`` (MPI
    launchers put ranks in sessions of their own, out of the group's reach)."""
    stats = {}
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            state, parent, group, _ = _parse_stat(Path(f"/proc/{entry.name}/stat").read_text())
        except OSError:
            continue
        child = int(entry.name)
        stats[child] = (state, group)
        parents.setdefault(parent, []).append(child)
    found = {p for p, (_, group) in stats.items() if group == pgid} | set(roots)
    todo = list(found)
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(p for p in found if p in stats and stats[p][0] != "Z")


def _check_pid(value: object, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 < value <= PID_MAX:
        raise UserError(f"{where}: {key}: expected the process id hpcvod recorded (a whole number 2-{PID_MAX}), "
                        f"got {value!r}")
    return value


def _read_record(job_dir: Path, job_id: str) -> tuple[dict, str]:
    from hpcvod.schedulers.jobfiles import RECORD_FILE, read_json

    where = str(job_dir / RECORD_FILE)
    record = read_json(job_dir / RECORD_FILE)
    LocalScheduler.check_record(record, where)
    if record["job_id"] != job_id:
        raise UserError(f"{where}: records job {record['job_id']!r}, not {job_id!r}")
    return record, where


def _job_record(job_id: str, job_dir: Path | None) -> tuple[dict, str]:
    """The job's checked record (pid, pgid, start_time) and the file it came from. For a bare ``local-PID`` the
    folder is the one of the process's own output.log (submit points its stdout there); a process that has none
    gets an empty record: it cannot be shown to be a job hpcvod started."""
    if job_dir is not None:
        return _read_record(job_dir, job_id)
    pid = int(job_id.removeprefix("local-"))
    try:
        output = Path(os.readlink(f"/proc/{pid}/fd/1"))
    except OSError:  # gone, or another user's process
        return {}, ""
    if output.name != OUTPUT_FILE:
        return {}, ""
    try:
        return _read_record(output.parent, job_id)
    except (UserError, FileNotFoundError):
        return {}, ""  # a folder nobody named: its state is not this command's business


class LocalScheduler(Scheduler):
    name = "local"
    script_name = SCRIPT_ARGV[1]
    poll_seconds = 0.2
    job_id_pattern = re.compile(r"local-[1-9][0-9]{0,6}")  # local-PID
    job_id_example = "local-12345"
    job_id_prefix = "local-"
    single_host = True
    data_service_layout = "here"  # the compute job and the training, two launches on this machine
    refusal_hints = dict.fromkeys(option_names(), "it runs jobs on this machine, without a batch scheduler")

    @staticmethod
    def parse_job_id(text: str) -> str:
        return text.strip()

    @classmethod
    def check_record(cls, record: dict[str, Any], where: str) -> None:
        pid = _check_pid(record.get("pid"), "pid", where)
        _check_pid(record.get("pgid"), "pgid", where)
        start = record.get("start_time")
        if start is not None and (isinstance(start, bool) or not isinstance(start, int) or start < 0):
            raise UserError(f"{where}: start_time: expected the process start time in clock ticks (a whole number "
                            f">= 0), got {start!r}")
        if record.get("job_id") != f"local-{pid}":
            raise UserError(f"{where}: job_id {record.get('job_id')!r} does not name the recorded pid {pid}")

    def submit_argv(self, script_name: str, secret_names: Sequence[str] = ()) -> list[str]:
        return [SCRIPT_ARGV[0], script_name]  # secrets: in the child's environment (submit)

    def submit(self, job_dir: Path, script: Path, secret_env: Mapping[str, str] | None = None) -> Submitted:
        from hpcvod.schedulers.jobfiles import modes_of, open_job_log

        env = {**without_outer_launch(os.environ), **(secret_env or {})}
        with open_job_log(job_dir / OUTPUT_FILE) as log:
            proc = subprocess.Popen(self.submit_argv(script.name), cwd=job_dir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                    umask=modes_of(job_dir).umask)
        stat = _proc_stat(proc.pid)  # Popen returns once bash runs: /proc shows the script, not this Python
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
        record, _ = _job_record(job_id, job_dir)
        pid = record.get("pid") or int(job_id.removeprefix("local-"))
        if record and _why_not_the_job(pid, record) is None:
            return JobStatus(RUNNING, raw=f"pid {pid} running", source="/proc")
        if read_exit_file(job_dir) is not None:  # it wrote its exit status and ended since the first look
            return self.status(job_id, job_dir)
        if cancelled:
            return JobStatus(CANCELLED, raw=f"pid {pid} ended", reason="cancelled", source="cancel marker")
        if job_dir is None:
            return JobStatus(UNKNOWN, raw=f"pid {pid} is no hpcvod job script running here", source="/proc")
        return JobStatus(FAILED, raw=f"pid {pid} ended", reason="the job ended without recording an exit status",
                         source="/proc")

    def cancel(self, job_id: str, job_dir: Path | None, grace_seconds: float = 5.0) -> None:
        """SIGTERM to the job's process group and every process it started (MPI launchers put ranks in sessions
        of their own), SIGKILL to whatever is left after the grace time. The tree is looked at again on every
        round: a launcher that was still starting when cancel came is caught as well, and a process that lost
        its parent stays known (by pid and start time, so a reused pid is never hit).

        Only the job script that submit started is ever signalled: a pid whose start time, process group or
        command line is not what job.json recorded (a reused pid, an edited file, a bare local-PID of some other
        process) is refused with a UserError, and nothing is killed."""
        record, where = _job_record(job_id, job_dir)
        pid = record.get("pid") or int(job_id.removeprefix("local-"))
        if not _alive(pid, None):
            return  # already over: nothing to signal
        why_not = _why_not_the_job(pid, record) if record else "is not a job script that hpcvod started"
        if why_not == GONE:
            return  # it ended a moment ago
        if why_not is not None:
            raise UserError(f"job {job_id}{f' ({where})' if where else ''}: not signalling pid {pid}: it {why_not}; "
                            "nothing was killed")
        pgid = record["pgid"]  # the script's own group (it leads its session): checked equal above
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
