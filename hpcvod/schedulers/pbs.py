"""PBS Pro / OpenPBS: qsub to submit, ``qstat -f -x`` (finished jobs too) to watch, qdel to cancel."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Mapping, Sequence

from hpcvod.schedulers.base import (CANCELLED, COMPLETED, FAILED, JOB_ENV, JOB_LOG, PENDING, RUNNING, TIMEOUT,
                                    UNKNOWN, JobRequest, JobStatus, Scheduler, SchedulerError, Submitted,
                                    read_cancel_marker, qsub_begin_and_mail, qsub_range, run_command,
                                    status_from_exit_file)
from hpcvod.support.errors import UserError
from hpcvod.sites.spec import Pattern, doc


_QUEUED = set("QHWTSMU")  # queued, held, waiting, in transit, suspended, moved, user-suspended
_ACTIVE = set("REB")  # running, exiting, array begun
_KILLED_WALLTIME = -29  # JOB_EXEC_KILL_WALLTIME
_LAYOUT = "the select= chunk holds it: use --nodes, --tasks-per-node, --cpus-per-task, --gpus-per-node"


@dataclass(frozen=True)
class PbsOptions:
    """scheduler_options of a PBS Pro / OpenPBS site."""

    place: Annotated[str, Pattern(r"[a-z:=_A-Z0-9]+", "a PBS place spec, e.g. scatter or scatter:excl")] = doc(
        "the -l place= spec: 'scatter' puts each chunk on its own node; add ':excl' for whole nodes", "scatter")
    gpu_resource: Annotated[str, Pattern(r"[A-Za-z_]\w*", "a resource name")] = doc(
        "the chunk resource that counts GPUs (ngpus on most sites)", "ngpus")


def pbs_walltime(seconds: int) -> str:
    """PBS walltime: HH:MM:SS with as many hours as needed."""
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def pbs_size(size: str) -> str:
    """``--mem`` SIZE (megabytes unless K, M, G or T follows) -> PBS's ``64gb``."""
    number, unit = (size[:-1], size[-1]) if size[-1] in "KMGT" else (size, "M")
    return f"{number}{unit.lower()}b"


def parse_qstat_full(text: str) -> dict[str, str]:
    """``qstat -f`` output -> {attribute: value}; long values continue on tab-indented lines."""
    out: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if line.startswith("Job Id:"):
            out["Job Id"] = line.split(":", 1)[1].strip()
            key = None
            continue
        match = re.match(r"^\s+([\w.]+) = (.*)$", line)
        if match:
            key = match.group(1)
            out[key] = match.group(2)
        elif key and line.startswith("\t"):
            out[key] += line.strip()
    return out


def pbs_state(job_state: str, exit_status: int | None) -> str:
    if job_state in _QUEUED:
        return PENDING
    if job_state in _ACTIVE:
        return RUNNING
    if job_state in ("F", "X", "C"):  # finished (PBS Pro), subjob finished, completed (Torque)
        if exit_status is None:
            return UNKNOWN
        if exit_status == 0:
            return COMPLETED
        if exit_status == _KILLED_WALLTIME:
            return TIMEOUT
        if exit_status >= 256 and exit_status - 256 in (9, 15):  # killed by SIGKILL/SIGTERM: qdel
            return CANCELLED
        return FAILED
    return UNKNOWN


class PbsScheduler(Scheduler):
    name = "pbs"
    script_name = "job.pbs"
    directive_prefix = "#PBS"
    Options = PbsOptions
    # 123.server, an array job 123[].server, one of its subjobs 123[4].server (the server part is optional)
    job_id_pattern = re.compile(r"[0-9]+(?:\[[0-9]*\])?(?:\.[A-Za-z0-9_][A-Za-z0-9_.-]*)?")
    job_id_example = "1234.server, 1234[].server or 1234[5].server"
    job_options = frozenset({"exclusive", "mem", "begin", "mail_type", "mail_user", "dependency", "array",
                             "sched_opt"})
    refusal_hints = {"reservation": "a PBS reservation is a queue of its own: --partition R1234",
                     "qos": "Slurm only", "mem_per_gpu": "Slurm only; PBS takes --mem per node",
                     "constraint": "ask for a host resource with --sched-opt 'l=RESOURCE=VALUE'",
                     "nodelist": "Slurm only", "exclude": "Slurm only"}
    # qsub's options are single letters (getopt: "lselect=1" would be -l select=1)
    sched_opt_key = Pattern(r"[A-Za-z]", "one letter, a qsub option without its dash (l=software=matlab: "
                            "-l software=matlab)")
    computed_directives = {"N": "use --job-name", "q": "use --partition", "A": "use --account", "J": "use --array",
                           "a": "use --begin", "m": "use --mail-type", "M": "use --mail-user", "j": JOB_LOG,
                           "o": JOB_LOG, "e": JOB_LOG, "k": JOB_LOG, "R": JOB_LOG, "v": JOB_ENV, "V": JOB_ENV}
    computed_resources = {
        "l": {"select": _LAYOUT, "place": "use --exclusive; the rest is the site's scheduler_options.place",
              "walltime": "use --time", "ncpus": _LAYOUT, "mpiprocs": _LAYOUT, "ompthreads": _LAYOUT,
              "nodes": _LAYOUT, "nodect": _LAYOUT, "mem": "use --mem"},
        "W": {"depend": "use --dependency", "sandbox": JOB_LOG, "block": "hpcvod submit would wait for the job's end"}}
    gpu_resource_key = "l"
    array_index_var = "PBS_ARRAY_INDEX"
    hostfile = '"$PBS_NODEFILE"'
    array_output = "output.^array_index^.log"

    # the compute part's chunks come first in select=, so their hosts are the first lines of PBS_NODEFILE
    data_service_layout = "hostfiles"
    part_hostfiles = ('"$HPCVOD_JOB_DIR/hosts.data-service"', '"$HPCVOD_JOB_DIR/hosts.training"')

    def _chunk(self, plan: JobRequest) -> str:
        """``N:ncpus=..:mpiprocs=..``: N chunks of one node's share of the job."""
        chunk = [str(plan.nodes), f"ncpus={plan.tasks_per_node * plan.cpus_per_task}",
                 f"mpiprocs={plan.tasks_per_node}", f"ompthreads={plan.cpus_per_task}"]
        if plan.gpus_per_node:
            chunk.append(f"{self.options.gpu_resource}={plan.gpus_per_node}")
        if plan.options.mem is not None:  # a chunk is a node here: memory per node
            chunk.append(f"mem={pbs_size(plan.options.mem)}")
        return ":".join(chunk)

    def directives(self, plan: JobRequest) -> list[str]:
        return self._directives(plan, [self._chunk(plan)])

    def data_service_directives(self, compute: JobRequest, training: JobRequest) -> list[str]:
        """One job, two chunk kinds: ``select=<compute chunks>+<training chunks>``, both from the job's queue."""
        if compute.partition != training.partition:
            raise UserError(f"--data-service-partition {compute.partition!r}: a PBS job runs in one queue "
                            f"({training.partition!r}); both chunk kinds come from it")
        return self._directives(training, [self._chunk(compute), self._chunk(training)])

    def _directives(self, plan: JobRequest, chunks: list[str]) -> list[str]:
        job = plan.options
        place = self.options.place
        if job.exclusive and "excl" not in place:
            place += ":excl"
        out = [
            f"-N {plan.scheduler_job_name}",
            "-l select=" + "+".join(chunks),
            f"-l place={place}",
            f"-l walltime={pbs_walltime(plan.time_seconds)}",
            f"-q {plan.partition}",
        ]
        if plan.account:
            out.append(f"-A {plan.account}")
        out += qsub_begin_and_mail(self, job)
        if job.dependency is not None:
            if "singleton" in job.dependency.split(","):
                raise self.refuse("dependency", job.dependency, "singleton is Slurm's only")
            out.append(f"-W depend={job.dependency}")  # PBS reads after/afterok/afternotok/afterany:ID[:ID]
        if job.array is not None:
            indexes, limit = qsub_range(self, job.array, 0)
            out.append(f"-J {indexes}" + (f"%{limit}" if limit else ""))
        out += ["-j oe", f"-o {self.output_file(plan)}"]  # relative to qsub's working directory = the job folder
        return out + self.sched_opt_directives(job.sched_opt)

    def task_job_id(self, job_id: str, index: int) -> str | None:
        return job_id.replace("[]", f"[{index}]", 1) if "[]" in job_id else None

    @staticmethod
    def parse_job_id(text: str) -> str:
        line = text.strip().splitlines()[-1].strip() if text.strip() else ""
        if not PbsScheduler.job_id_pattern.fullmatch(line):
            raise SchedulerError(f"qsub printed {text.strip()!r}, expected a job id like 1234.server")
        return line

    def submit_argv(self, script_name: str, secret_names: Sequence[str] = ()) -> list[str]:
        # -v NAME without =VALUE: qsub takes the value from its own environment (the value is never an argument)
        return ["qsub", *(["-v", ",".join(secret_names)] if secret_names else []), script_name]

    def submit(self, job_dir: Path, script: Path, secret_env: Mapping[str, str] | None = None) -> Submitted:
        done = self._run_submit(job_dir, self.submit_argv(script.name, list(secret_env or {})), secret_env)
        if done.returncode != 0:
            raise SchedulerError(f"qsub refused the job: {' '.join((done.stderr or done.stdout).split())}")
        return Submitted(self.parse_job_id(done.stdout))

    def status(self, job_id: str, job_dir: Path | None) -> JobStatus:
        done = run_command(["qstat", "-f", "-x", job_id])
        if done.returncode != 0 and "invalid option" in (done.stderr + done.stdout).lower():
            done = run_command(["qstat", "-f", job_id])  # Torque-style qstat: no -x
        attrs = parse_qstat_full(done.stdout) if done.returncode == 0 else {}
        if "job_state" not in attrs:
            return status_from_exit_file(job_dir) or JobStatus(UNKNOWN, reason="PBS no longer knows this job",
                                                               source="none")
        word = attrs["job_state"].strip()
        try:
            code: int | None = int(attrs.get("Exit_status", "").strip())
        except ValueError:
            code = None
        state = pbs_state(word, code)
        if state in (FAILED, UNKNOWN) and read_cancel_marker(job_dir):
            state = CANCELLED
        return JobStatus(state, raw=word, exit_code=code, reason=attrs.get("comment", ""), source="qstat -f")

    def cancel(self, job_id: str, job_dir: Path | None) -> None:
        done = run_command(["qdel", job_id])
        if done.returncode != 0:
            raise SchedulerError(f"qdel {job_id}: {' '.join((done.stderr or done.stdout).split())}")


SCHEDULER = PbsScheduler
