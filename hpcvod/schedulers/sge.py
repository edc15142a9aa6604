"""(Son of) Grid Engine / Univa / Altair GE: ``qsub -terse`` to submit, ``qstat`` (queued and running jobs) then
``qacct -j`` (finished jobs, from the accounting file) to watch, ``qdel`` to cancel.

The ranks live in a parallel environment (``-pe NAME SLOTS``); the rendered script turns ``$PE_HOSTFILE``
("host slots queue processors" lines) into one line per slot, the host list mpirun/mpiexec read. How the slots
spread over hosts is the parallel environment's ``allocation_rule`` (``$fill_up``, ``$round_robin``, or a fixed
number per host: set it to the tasks per node for an exact layout).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Mapping, Sequence

from hpcvod.schedulers.base import (CANCELLED, COMPLETED, FAILED, JOB_ENV, JOB_FOLDER, JOB_LOG, PENDING, RUNNING,
                                    TIMEOUT, UNKNOWN, JobRequest, JobStatus, Scheduler, SchedulerError, Submitted,
                                    read_cancel_marker, qsub_begin_and_mail, qsub_range, run_command,
                                    status_from_exit_file)
from hpcvod.sites.spec import Pattern, doc


_NAME = Pattern(r"[A-Za-z_][\w.-]*", "a Grid Engine object name")


@dataclass(frozen=True)
class SgeOptions:
    """scheduler_options of a Grid Engine site."""

    parallel_environment: Annotated[str, _NAME] = doc(
        "the parallel environment whose slots hold the ranks (`qconf -spl`); its allocation_rule decides how "
        "slots spread over hosts", "mpi")
    gpu_resource: Annotated[str, _NAME] = doc(
        "the consumable complex that counts GPUs (`qconf -sc`), requested per slot: -l NAME=<GPUs per rank>", "gpu")


def sge_time(seconds: int) -> str:
    """h_rt as HH:MM:SS with as many hours as needed."""
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def sge_hold(scheduler: Scheduler, expression: str) -> str:
    """``--dependency afterany:ID[:ID]`` -> ``-hold_jid ID,ID``: Grid Engine waits for the end, whatever the exit
    status; the other kinds are refused."""
    ids = []
    for part in expression.split(","):
        kind, *found = part.split(":")
        if kind != "afterany":
            raise scheduler.refuse("dependency", expression, f"{kind}: Grid Engine's -hold_jid only waits for the "
                                   "end (afterany)")
        ids += found
    return ",".join(ids)


def sge_state(letters: str) -> str:
    """hpcvod's state for qstat's state letters (qw, hqw, r, t, Rr, s, dr, Eqw...)."""
    if "E" in letters:
        return FAILED  # error state: the job cannot start until an admin clears it
    if "d" in letters:
        return RUNNING  # being deleted: not over yet
    if "q" in letters or "w" in letters or "h" in letters:
        return PENDING
    if letters and set(letters) <= set("rtRsSTz"):
        return RUNNING
    return UNKNOWN


def parse_qstat_listing(text: str, job_id: str) -> str | None:
    """The state letters of job_id in plain ``qstat`` output (None when it is not listed)."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0] == job_id:
            return fields[4]
    return None


def parse_qacct(text: str) -> dict[str, str]:
    """``qacct -j ID`` -> {field: value} of its last record (a requeued/rescheduled job has several)."""
    record: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("=" * 10):
            record = {}
            continue
        key, _, value = line.partition(" ")
        if key:
            record[key] = value.strip()
    return record


def qacct_state(record: dict[str, str], cancelled: bool) -> JobStatus:
    """A finished job's state from its accounting record."""
    try:
        code = int(record.get("exit_status", ""))
    except ValueError:
        code = None
    failed = record.get("failed", "0").split()[0] if record.get("failed") else "0"
    limit = re.search(r"h_rt=(\d+)", record.get("category", ""))
    wallclock = float(re.sub(r"[^\d.]", "", record.get("ru_wallclock", "") or "0") or 0)
    if code == 0 and failed == "0":
        state = COMPLETED
    elif cancelled:
        state = CANCELLED
    elif limit and code in (137, 152) and wallclock >= int(limit.group(1)) - 1:
        state = TIMEOUT  # h_rt reached: SIGKILL (137) or SIGXCPU (152)
    else:
        state = FAILED
    return JobStatus(state, raw=f"failed={record.get('failed', '?')} exit_status={code}", exit_code=code,
                     source="qacct -j")


class SgeScheduler(Scheduler):
    name = "sge"
    script_name = "job.sge"
    directive_prefix = "#$"
    poll_seconds = 2.0
    Options = SgeOptions
    # 123, a task 123.4, a task range 123.1-10:1 (what qsub -terse prints for an array job)
    job_id_pattern = re.compile(r"[0-9]+(?:\.[0-9]+(?:-[0-9]+(?::[0-9]+)?)?)?")
    job_id_example = "1234 or 1234.5"
    job_options = frozenset({"exclusive", "reservation", "begin", "mail_type", "mail_user", "dependency", "array",
                             "sched_opt"})
    refusal_hints = {"mem": "Grid Engine asks for memory per slot: --sched-opt 'l=h_vmem=4G'",
                     "mem_per_gpu": "Slurm only", "qos": "Slurm only", "nodelist": "Slurm only",
                     "exclude": "Slurm only", "constraint": "ask for a complex with --sched-opt 'l=NAME=VALUE'"}
    # Grid Engine's qsub matches whole option names (-pe, -hold_jid), without getopt's abbreviations
    sched_opt_key = Pattern(r"[A-Za-z][A-Za-z_]*", "a qsub option without its dash (l=h_vmem=4G: -l h_vmem=4G)")
    computed_directives = {
        "N": "use --job-name", "pe": "use --nodes and --tasks-per-node; the parallel environment is the site's "
        "scheduler_options.parallel_environment", "q": "use --partition", "A": "use --account",
        "ar": "use --reservation", "a": "use --begin", "m": "use --mail-type", "M": "use --mail-user",
        "hold_jid": "use --dependency", "hold_jid_ad": "use --dependency", "t": "use --array", "tc": "use --array",
        "j": JOB_LOG, "o": JOB_LOG, "e": JOB_LOG, "cwd": JOB_FOLDER, "wd": JOB_FOLDER, "v": JOB_ENV, "V": JOB_ENV,
        "S": "the job script is bash", "b": "the job is hpcvod's script",
        "clear": "it would drop every directive before it"}
    computed_resources = {"l": {"h_rt": "use --time", "exclusive": "use --exclusive", "excl": "use --exclusive"}}
    gpu_resource_key = "l"
    array_index_var = "SGE_TASK_ID"
    hostfile = '"$HPCVOD_JOB_DIR/hostfile"'  # sge.j2 writes it from $PE_HOSTFILE
    array_output = "output.$TASK_ID.log"
    data_service_refusal = ("a Grid Engine job has one parallel environment: submit the compute job (python -m "
                            "hpcvod.tensorflow.data.compute_worker CONFIG) and the training job as two jobs, "
                            "docs/data-service.md")

    def directives(self, plan: JobRequest) -> list[str]:
        out = [
            f"-N {plan.scheduler_job_name}",
            f"-pe {self.options.parallel_environment} {plan.world_size}",
            f"-l h_rt={sge_time(plan.time_seconds)}",
            f"-q {plan.partition}",
        ]
        if plan.gpus_per_node:
            # consumables are per slot: GPUs per rank
            out.append(f"-l {self.options.gpu_resource}={max(1, plan.gpus_per_node // plan.tasks_per_node)}")
        if plan.account:
            out.append(f"-A {plan.account}")
        job = plan.options
        if job.exclusive:
            out.append("-l exclusive=true")  # the exclusive complex (relop EXCL) of Son of Grid Engine
        if job.reservation is not None:
            if not job.reservation.isdigit():
                raise self.refuse("reservation", job.reservation, "Grid Engine names an advance reservation by "
                                  "its number (qrstat)")
            out.append(f"-ar {job.reservation}")
        out += qsub_begin_and_mail(self, job)
        if job.dependency is not None:
            out.append(f"-hold_jid {sge_hold(self, job.dependency)}")
        if job.array is not None:
            indexes, limit = qsub_range(self, job.array, 1)
            out.append(f"-t {indexes}")
            if limit:
                out.append(f"-tc {limit}")
        # run in the submit directory (the job folder), one log, bash as the job shell
        out += ["-cwd", "-j y", f"-o {self.output_file(plan)}", "-S /bin/bash"]
        return out + self.sched_opt_directives(job.sched_opt)

    @staticmethod
    def parse_job_id(text: str) -> str:
        line = text.strip().splitlines()[-1].strip() if text.strip() else ""
        if not SgeScheduler.job_id_pattern.fullmatch(line):
            raise SchedulerError(f"qsub -terse printed {text.strip()!r}, expected a job id")
        return line.split(".")[0]  # an array job as a whole

    def submit_argv(self, script_name: str, secret_names: Sequence[str] = ()) -> list[str]:
        # -v NAME without =VALUE: qsub takes the value from its own environment (the value is never an argument)
        return ["qsub", "-terse", *(["-v", ",".join(secret_names)] if secret_names else []), script_name]

    def submit(self, job_dir: Path, script: Path, secret_env: Mapping[str, str] | None = None) -> Submitted:
        done = self._run_submit(job_dir, self.submit_argv(script.name, list(secret_env or {})), secret_env)
        if done.returncode != 0:
            raise SchedulerError(f"qsub refused the job: {' '.join((done.stderr or done.stdout).split())}")
        return Submitted(self.parse_job_id(done.stdout))

    def status(self, job_id: str, job_dir: Path | None) -> JobStatus:
        listing = run_command(["qstat", "-u", "*"])
        letters = parse_qstat_listing(listing.stdout, job_id) if listing.returncode == 0 else None
        if letters is not None:
            return JobStatus(sge_state(letters), raw=letters, source="qstat")
        # finished: the accounting file (written within the qmaster's accounting_flush_time), else the job folder
        done = run_command(["qacct", "-j", job_id])
        record = parse_qacct(done.stdout) if done.returncode == 0 else {}
        if "exit_status" in record:
            return qacct_state(record, read_cancel_marker(job_dir))
        found = status_from_exit_file(job_dir)
        if found is not None and found.state == FAILED and read_cancel_marker(job_dir):
            return JobStatus(CANCELLED, raw=found.raw, exit_code=found.exit_code, source=found.source)
        return found or JobStatus(UNKNOWN, reason="Grid Engine no longer knows this job", source="none")

    def cancel(self, job_id: str, job_dir: Path | None) -> None:
        done = run_command(["qdel", job_id])
        if done.returncode != 0:
            raise SchedulerError(f"qdel {job_id}: {' '.join((done.stderr or done.stdout).split())}")


SCHEDULER = SgeScheduler
