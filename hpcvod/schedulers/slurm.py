"""Slurm: sbatch --parsable to submit; squeue, scontrol and (when accounting exists) sacct to watch; scancel."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping, Sequence

from hpcvod.schedulers.base import (CANCELLED, COMPLETED, FAILED, JOB_ENV, JOB_FOLDER, JOB_LOG, PENDING, RUNNING,
                                    TIMEOUT, UNKNOWN, JobRequest, JobStatus, Scheduler, SchedulerError, Submitted,
                                    run_command, status_from_exit_file)
from hpcvod.sites.joboptions import JobOptions, flag
from hpcvod.sites.spec import doc


_STATES = {
    COMPLETED: ("COMPLETED",),
    RUNNING: ("RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "RESIZING", "SUSPENDED", "STOPPED"),
    PENDING: ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"),
    CANCELLED: ("CANCELLED",),
    TIMEOUT: ("TIMEOUT",),
    FAILED: ("FAILED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT"),
}
_STATE_OF = {word: state for state, words in _STATES.items() for word in words}
_REQUEUE = "hpcvod's stop-and-requeue cycle needs it, docs/preemption.md"


@dataclass(frozen=True)
class SlurmOptions:
    """scheduler_options of a Slurm site."""

    gpu_request: Literal["gres", "gpus-per-node"] = doc(
        "how GPUs are asked for: --gres=gpu[:TYPE]:N (every Slurm) or --gpus-per-node=[TYPE:]N (Slurm >= 19.05)", "gres")
    exclusive: bool = doc("ask for whole nodes (--exclusive)", False)
    sacct: Literal["auto", "never"] = doc(
        "ask sacct about jobs squeue and scontrol no longer know ('never' where accounting is off)", "auto")
    requeue_warning: int = doc(
        "seconds before the time limit at which Slurm warns the job script (--signal=B:USR1@N, at most half the "
        "walltime), so ranks using hpcvod.runtime.checkpoint save and the job requeues itself "
        "(docs/preemption.md); 0 = no warning", 120)


def script_export(script: Path) -> str | None:
    """The value of the last ``#SBATCH --export=`` directive of a rendered script (None: it has none)."""
    from hpcvod.support.files import read_text_bounded

    found = None
    for line in read_text_bounded(script, 1 << 20, "job script").splitlines()[1:]:
        if line.startswith("#SBATCH"):
            words = line.split()
            if len(words) > 1 and words[1].startswith("--export="):
                found = words[1].removeprefix("--export=")
        elif line.strip() and not line.startswith("#"):
            break  # sbatch reads directives up to the first command
    return found


def slurm_state(word: str) -> str:
    """hpcvod's state for a Slurm state word ("CANCELLED by 0" -> CANCELLED)."""
    head = word.strip().split()[0].rstrip("+") if word.strip() else ""
    return _STATE_OF.get(head, UNKNOWN)


def slurm_time(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hms}" if days else hms


def _exit_code(text: str) -> int | None:
    """Slurm's "EXIT:SIGNAL" pair -> a shell-style exit status (128+signal when killed by one)."""
    match = re.match(r"(\d+):(\d+)", text.strip())
    if not match:
        return None
    code, signal = int(match.group(1)), int(match.group(2))
    return 128 + signal if signal and not code else code


class SlurmScheduler(Scheduler):
    name = "slurm"
    script_name = "job.sbatch"
    directive_prefix = "#SBATCH"
    poll_seconds = 2.0
    Options = SlurmOptions
    # 123, an array task 123_4, a heterogeneous job component 123+1
    job_id_pattern = re.compile(r"[0-9]+(?:_[0-9]+|\+[0-9]+)?")
    job_id_example = "1234, 1234_5 or 1234+1"
    job_options = frozenset({"exclusive", "mem", "mem_per_gpu", "constraint", "qos", "reservation", "nodelist",
                             "exclude", "begin", "mail_type", "mail_user", "dependency", "array", "sched_opt"})
    # sbatch's own name for each of these is the hpcvod option's (--qos -> --qos)
    computed_directives = {
        **{flag(name)[2:]: f"use {flag(name)}" for name in job_options if name != "sched_opt"},
        "job-name": "use --job-name", "J": "use --job-name", "nodes": "use --nodes", "N": "use --nodes",
        "ntasks": "use --nodes and --tasks-per-node", "n": "use --nodes and --tasks-per-node",
        "ntasks-per-node": "use --tasks-per-node", "cpus-per-task": "use --cpus-per-task",
        "c": "use --cpus-per-task", "gres": "use --gpus-per-node; a site's other GRES go in directives.extra",
        "gpus-per-node": "use --gpus-per-node", "gpus": "use --gpus-per-node", "G": "use --gpus-per-node",
        "time": "use --time", "t": "use --time", "partition": "use --partition", "p": "use --partition",
        "account": "use --account", "A": "use --account", "a": "use --array", "d": "use --dependency",
        "b": "use --begin", "C": "use --constraint", "q": "use --qos", "w": "use --nodelist", "x": "use --exclude",
        "output": JOB_LOG, "o": JOB_LOG, "error": JOB_LOG, "e": JOB_LOG, "open-mode": JOB_LOG,
        "requeue": _REQUEUE, "no-requeue": _REQUEUE, "signal": _REQUEUE,
        "export": JOB_ENV, "export-file": JOB_ENV, "get-user-env": JOB_ENV,
        "chdir": JOB_FOLDER, "D": JOB_FOLDER, "wrap": "the job is hpcvod's script"}
    long_option_prefixes = True
    array_index_var = "SLURM_ARRAY_TASK_ID"
    array_output = "output.%a.log"  # %a: the array task's index

    own_launcher = "srun"
    short_q_is_qos = True  # sbatch -q is --qos
    data_service_layout = "components"

    def directives(self, plan: JobRequest) -> list[str]:
        out = [f"--job-name={plan.scheduler_job_name}", *self._resources(plan)]
        job = plan.options
        for name, value in (("begin", job.begin), ("mail-type", job.mail_type), ("mail-user", job.mail_user),
                            ("dependency", job.dependency), ("array", job.array)):
            if value is not None:
                out.append(f"--{name}={value}")
        out.append(f"--output={self.output_file(plan)}")  # relative to the submit dir = the job folder
        # preemption, `scontrol requeue` and the script's own requeue put the job back in the queue; each run
        # adds to output.log instead of wiping the one before (docs/preemption.md)
        out.append("--requeue")
        out.append("--open-mode=append")
        warning = min(self.options.requeue_warning, plan.time_seconds // 2)
        if warning > 0:
            out.append(f"--signal=B:USR1@{warning}")
        return out + self.sched_opt_directives(job.sched_opt)

    def data_service_directives(self, compute: JobRequest, training: JobRequest) -> list[str]:
        """One heterogeneous job: component 0 the compute part (the batch script runs on its first node) with the
        job-wide requests (name, log, dependency, begin, mail, requeue), component 1 the training ranks with the
        per-node ones (--exclusive, --mem, --constraint...) and --sched-opt."""
        job = training.options
        whole = JobOptions(begin=job.begin, mail_type=job.mail_type, mail_user=job.mail_user,
                           dependency=job.dependency)
        first = self.directives(dataclasses.replace(compute, options=whole))  # type: ignore[type-var]
        return [*first, "hetjob", *self._resources(training), *self.sched_opt_directives(job.sched_opt)]

    def _resources(self, plan: JobRequest) -> list[str]:
        """What one component asks for: nodes, tasks, CPUs, GPUs, time, partition, account, per-node options."""
        out = [
            f"--nodes={plan.nodes}",
            f"--ntasks={plan.world_size}",  # sbatch needs -n for the srun inside to start more than one task
            f"--ntasks-per-node={plan.tasks_per_node}",
            f"--cpus-per-task={plan.cpus_per_task}",
        ]
        if plan.gpus_per_node:
            kind = f"gpu:{plan.gpu_type}" if plan.gpu_type else "gpu"
            if self.options.gpu_request == "gres":
                out.append(f"--gres={kind}:{plan.gpus_per_node}")
            else:
                typed = f"{plan.gpu_type}:" if plan.gpu_type else ""
                out.append(f"--gpus-per-node={typed}{plan.gpus_per_node}")
        out.append(f"--time={slurm_time(plan.time_seconds)}")
        out.append(f"--partition={plan.partition}")
        if plan.account:
            out.append(f"--account={plan.account}")
        job = plan.options
        if self.options.exclusive or job.exclusive:
            out.append("--exclusive")
        for name, value in (("mem", job.mem), ("mem-per-gpu", job.mem_per_gpu), ("constraint", job.constraint),
                            ("qos", job.qos), ("reservation", job.reservation), ("nodelist", job.nodelist),
                            ("exclude", job.exclude)):
            if value is not None:
                out.append(f"--{name}={value}")
        return out

    def sched_opt_directive(self, key: str, value: str | None) -> str:
        """sbatch's ``--KEY=VALUE``, or ``-K VALUE`` for a one-letter KEY."""
        if len(key) == 1:
            return f"-{key}" if value is None else f"-{key} {value}"
        return f"--{key}" if value is None else f"--{key}={value}"

    def task_job_id(self, job_id: str, index: int) -> str | None:
        return f"{job_id}_{index}"

    def component_job_id(self, job_id: str, index: int) -> str | None:
        return f"{job_id}+{index}"

    @staticmethod
    def parse_job_id(text: str) -> str:
        line = text.strip().splitlines()[-1].strip() if text.strip() else ""
        job_id = line.split(";")[0]  # "ID;CLUSTER" on a multi-cluster setup
        if not SlurmScheduler.job_id_pattern.fullmatch(job_id):
            raise SchedulerError(f"sbatch --parsable printed {text.strip()!r}, expected a job id")
        return job_id

    def submit_argv(self, script_name: str, secret_names: Sequence[str] = (), script_export: str | None = None
                    ) -> list[str]:
        """sbatch hands its own environment to the job (srun then to the ranks) as far as --export lets it: with
        secret variables, --export on the command line (which wins over the script's and $SBATCH_EXPORT) keeps
        what the script's own ``#SBATCH --export=`` asked (``script_export``) and adds their names."""
        if not secret_names:
            return ["sbatch", "--parsable", script_name]
        words = [w for w in (script_export or "ALL").split(",") if w]
        if words[0] == "ALL":
            export = ",".join(words)  # ALL already carries them
        else:  # NONE/NIL (only SLURM_* variables) or a list of names: those, plus the secrets
            kept = [w for w in words if w not in ("NONE", "NIL")]
            export = ",".join([*kept, *(n for n in secret_names if n not in kept)])
        return ["sbatch", "--parsable", f"--export={export}", script_name]

    def submit(self, job_dir: Path, script: Path, secret_env: Mapping[str, str] | None = None) -> Submitted:
        names = list(secret_env or {})
        argv = self.submit_argv(script.name, names, script_export(script) if names else None)
        done = self._run_submit(job_dir, argv, secret_env)
        if done.returncode != 0:
            raise SchedulerError(f"sbatch refused the job: {_one_line(done.stderr or done.stdout)}")
        return Submitted(self.parse_job_id(done.stdout))

    def status(self, job_id: str, job_dir: Path | None) -> JobStatus:
        for ask in (self._squeue, self._scontrol, self._sacct):
            found = ask(job_id)
            if found is not None:
                return found
        return status_from_exit_file(job_dir) or JobStatus(UNKNOWN, reason="Slurm no longer knows this job",
                                                           source="none")

    def cancel(self, job_id: str, job_dir: Path | None) -> None:
        done = run_command(["scancel", "--", job_id])  # scancel reads options with getopt_long: "--" ends them
        if done.returncode != 0:
            raise SchedulerError(f"scancel {job_id}: {_one_line(done.stderr or done.stdout)}")

    # -- the three ways to ask, newest information first ---------------------------------------------------

    def statuses(self, jobs: Sequence[tuple[str, Path | None]]) -> dict[str, JobStatus]:
        """Many jobs at once (`hpcvod jobs`): one squeue for all, one sacct for those it no longer lists, then the
        job folder's exit file; scontrol only for a job none of these knows."""
        found = self._squeue_many([job_id for job_id, _ in jobs])
        rest = [job_id for job_id, _ in jobs if job_id not in found]
        if rest:
            found.update(self._sacct_many(rest))
        for job_id, job_dir in jobs:
            if job_id not in found:
                found[job_id] = (status_from_exit_file(job_dir) or self._scontrol(job_id)
                                 or JobStatus(UNKNOWN, reason="Slurm no longer knows this job", source="none"))
        return found

    def _squeue(self, job_id: str) -> JobStatus | None:
        return self._squeue_many([job_id]).get(job_id)

    def _squeue_many(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        done = run_command(["squeue", "--json", "--jobs", ",".join(job_ids)])
        if done.returncode == 0:
            try:
                jobs = json.loads(done.stdout).get("jobs", [])
            except ValueError:
                jobs = None
            if jobs is not None:
                return {job_id: _squeue_status(job) for job_id in job_ids
                        if (job := next((j for j in jobs if _is_job(j, job_id)), None)) is not None}
        elif "Invalid job id" in done.stderr:
            return {}  # none of them is in the queue any more
        # squeue without JSON support (built without the serializer) answers in plain text; %S is the start, or
        # for a pending job the expected start (what `squeue --start` shows), N/A when Slurm does not know it
        done = run_command(["squeue", "--noheader", "--jobs", ",".join(job_ids), "--format", "%i|%T|%r|%S"])
        if done.returncode != 0:
            return {}
        found: dict[str, JobStatus] = {}
        for line in done.stdout.splitlines():
            listed, word, reason, start = (line.strip().split("|") + ["", "", ""])[:4]
            job_id = next((j for j in job_ids if listed == j or listed.startswith(f"{j}_")), None)
            if job_id is not None and job_id not in found:
                found[job_id] = JobStatus(slurm_state(word), raw=word, reason=reason, source="squeue",
                                          start_time=slurm_epoch(start))
        return found

    def _scontrol(self, job_id: str) -> JobStatus | None:
        done = run_command(["scontrol", "show", "job", "--oneliner", job_id])
        if done.returncode != 0 or "JobState=" not in done.stdout:
            return None
        fields = parse_scontrol(done.stdout.splitlines()[0])
        word = fields.get("JobState", "")
        code = _exit_code(fields.get("ExitCode", ""))
        return JobStatus(slurm_state(word), raw=word, exit_code=code, reason=fields.get("Reason", ""),
                         source="scontrol show job", start_time=slurm_epoch(fields.get("StartTime")),
                         end_time=slurm_epoch(fields.get("EndTime")))

    def _sacct(self, job_id: str) -> JobStatus | None:
        return self._sacct_many([job_id], first_row=True).get(job_id)

    def _sacct_many(self, job_ids: Sequence[str], first_row: bool = False) -> dict[str, JobStatus]:
        """What accounting says of each job (``first_row``: of the one job asked, whatever id its row shows)."""
        if self.options.sacct == "never" or shutil.which("sacct") is None:
            return {}
        done = run_command(["sacct", "--jobs", ",".join(job_ids), "--allocations", "--noheader", "--parsable2",
                            "--format", "JobID,State,ExitCode,Start,End"])
        if done.returncode != 0:
            return {}
        found: dict[str, JobStatus] = {}
        for line in done.stdout.splitlines():
            if not line.strip():
                continue
            listed, word, code, start, end = (line.split("|") + ["", "", "", ""])[:5]
            job_id = job_ids[0] if first_row else next(
                (j for j in job_ids if listed == j or listed.startswith(f"{j}_")), None)
            if job_id is not None and job_id not in found:
                found[job_id] = JobStatus(slurm_state(word), raw=word, exit_code=_exit_code(code), source="sacct",
                                          start_time=slurm_epoch(start), end_time=slurm_epoch(end))
        return found


def _squeue_status(job: dict) -> JobStatus:
    """One entry of ``squeue --json``."""
    word = job.get("job_state")
    word = " ".join(word) if isinstance(word, list) else str(word)
    return JobStatus(slurm_state(word), raw=word, exit_code=_json_exit_code(job.get("exit_code")),
                     reason=str(job.get("state_reason") or ""), source="squeue --json",
                     start_time=slurm_epoch(job.get("start_time")), end_time=slurm_epoch(job.get("end_time")))


def _is_job(job: dict, job_id: str) -> bool:
    """Whether an entry of ``squeue --json --jobs job_id`` is that job: ``123``, an array task ``123_4``, or a
    heterogeneous job's component ``123+1`` (squeue lists it under its own job id, 124)."""
    leader, _, offset = job_id.partition("+")
    if offset:
        return str(job.get("het_job_id")) == leader and str(job.get("het_job_offset")) == offset
    return str(job.get("job_id")) == job_id.split("_")[0] or str(job.get("array_job_id")) == job_id


def _json_exit_code(value: object) -> int | None:
    """squeue --json's exit_code: an int (Slurm 22.05) or {"status": [...], "return_code": N, "signal": {...}}.

    22.05's int is slurmctld's raw wait status (exit 3 -> 768, SIGTERM -> 15), the same number scontrol prints as
    "3:0" / "0:15": decode it the same way.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return _exit_code(f"{(value >> 8) & 0xFF}:{value & 0x7F}")
    if isinstance(value, dict):
        code = value.get("return_code")
        if isinstance(code, dict):  # 23.11+: {"set": true, "number": N}
            code = code.get("number") if code.get("set", True) else None
        return code if isinstance(code, int) else None
    return None


def slurm_epoch(value: object) -> float | None:
    """A Slurm time as epoch seconds: squeue --json's int (22.05) or {"set": true, "number": N} (23.x+), or the
    text of scontrol/sacct/squeue (2026-11-24T07:38:18, local time); None for 0, Unknown, N/A, None."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if value > 0 else None
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", value.strip()):
        return time.mktime(time.strptime(value.strip(), "%Y-%m-%dT%H:%M:%S"))
    return None


def parse_scontrol(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value two`` (scontrol --oneliner) -> dict; values may contain spaces."""
    out: dict[str, str] = {}
    for match in re.finditer(r"(\w[\w:/]*)=(.*?)(?=\s+\w[\w:/]*=|$)", line.strip()):
        out.setdefault(match.group(1), match.group(2))
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(no message)"


SCHEDULER = SlurmScheduler
