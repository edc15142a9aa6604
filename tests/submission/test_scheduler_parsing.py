"""What the scheduler modules read from sbatch/squeue/scontrol/sacct and qsub/qstat output.

The texts below are the formats Slurm 22.05 and PBS Pro print (the Slurm ones were captured from the test
cluster of tests/cluster; no PBS server exists for Debian, so the PBS text follows the PBS Pro reference guide).
Running against the real Slurm is tests/cluster's job.
"""

from __future__ import annotations

import pytest

from hpcvod.schedulers import available_schedulers, scheduler_class
from hpcvod.schedulers.base import (CANCELLED, COMPLETED, FAILED, PENDING, RUNNING, TIMEOUT, UNKNOWN,
                                    apply_directive_overrides)
from hpcvod.schedulers.pbs import PbsScheduler, parse_qstat_full, pbs_state, pbs_walltime
from hpcvod.schedulers.slurm import SlurmScheduler, _exit_code, _json_exit_code, parse_scontrol, slurm_state, slurm_time
from hpcvod.schedulers.base import Scheduler, SchedulerError

SCONTROL = ("JobId=43 JobName=s UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 Nice=0 Account=(null) "
            "QOS=(null) JobState=CANCELLED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
            "ExitCode=0:15 RunTime=00:00:03 TimeLimit=00:05:00 TimeMin=N/A SubmitTime=2026-11-22T06:50:32 "
            "Command=/tmp/sl/hpcvod-jobs/s 1/job.sbatch WorkDir=/tmp/sl/hpcvod-jobs/s 1 StdOut=/tmp/out.log")

QSTAT = """Job Id: 1234.pbs01
    Job_Name = train
    Job_Owner = alice@login1
    resources_used.walltime = 00:10:05
    job_state = F
    queue = gpu
    Exit_status = 0
    comment = Job run at Mon Nov 20 at 10:00 on (n1:ncpus=64:mpiprocs=4:ngpus=4)+(n2:ncpus=64:mpiprocs=4:n
\tgpus=4) and finished
    Resource_List.select = 2:ncpus=64:mpiprocs=4:ngpus=4
"""


def test_every_scheduler_module_is_complete():
    assert {"slurm", "pbs", "local"} <= set(available_schedulers())
    for name in available_schedulers():
        cls = scheduler_class(name)
        assert cls.name == name and cls.script_name
        for method in ("submit", "status", "cancel", "parse_job_id"):
            assert getattr(cls, method) is not getattr(Scheduler, method), (name, method)
        # the one job id check (Scheduler.check_job_id) needs both; no id may start like an option
        assert cls.job_id_pattern.pattern and cls.job_id_example, name
        assert not cls.job_id_pattern.fullmatch("-1") and not cls.job_id_pattern.fullmatch("--user=root"), name


@pytest.mark.parametrize("text,job_id", [("42\n", "42"), ("42;cluster\n", "42"), ("7_3\n", "7_3")])
def test_sbatch_parsable(text, job_id):
    assert SlurmScheduler.parse_job_id(text) == job_id


def test_sbatch_garbage_is_an_error():
    with pytest.raises(SchedulerError, match="expected a job id"):
        SlurmScheduler.parse_job_id("sbatch: error: Batch job submission failed\n")


def test_scontrol_fields_with_spaces():
    fields = parse_scontrol(SCONTROL)
    assert fields["JobState"] == "CANCELLED" and fields["ExitCode"] == "0:15"
    assert fields["Command"] == "/tmp/sl/hpcvod-jobs/s 1/job.sbatch"
    assert _exit_code(fields["ExitCode"]) == 143 and _exit_code("2:0") == 2


@pytest.mark.parametrize("word,state", [
    ("PENDING", PENDING), ("CONFIGURING", RUNNING), ("RUNNING", RUNNING), ("COMPLETING", RUNNING),
    ("COMPLETED", COMPLETED), ("FAILED", FAILED), ("OUT_OF_MEMORY", FAILED), ("NODE_FAIL", FAILED),
    ("CANCELLED by 0", CANCELLED), ("CANCELLED+", CANCELLED), ("TIMEOUT", TIMEOUT), ("WHATEVER", UNKNOWN)])
def test_slurm_states(word, state):
    assert slurm_state(word) == state


def test_squeue_json_exit_code_shapes():
    assert _json_exit_code(0) == 0
    assert _json_exit_code(768) == 3          # 22.05: a raw wait status, exit 3 (seen on the sandbox cluster)
    assert _json_exit_code(9) == 128 + 9      # killed by SIGKILL
    assert _json_exit_code({"status": ["SUCCESS"], "return_code": 3}) == 3
    assert _json_exit_code({"return_code": {"set": True, "infinite": False, "number": 1}}) == 1
    assert _json_exit_code(None) is None


def test_times():
    assert slurm_time(3600) == "01:00:00" and slurm_time(2 * 86400 + 5) == "2-00:00:05"
    assert pbs_walltime(2 * 86400 + 5) == "48:00:05"


def test_qstat_full():
    attrs = parse_qstat_full(QSTAT)
    assert attrs["Job Id"] == "1234.pbs01" and attrs["job_state"] == "F" and attrs["Exit_status"] == "0"
    assert attrs["comment"].endswith("(n2:ncpus=64:mpiprocs=4:ngpus=4) and finished")


@pytest.mark.parametrize("job_state,exit_status,state", [
    ("Q", None, PENDING), ("H", None, PENDING), ("R", None, RUNNING), ("E", None, RUNNING),
    ("F", 0, COMPLETED), ("F", 1, FAILED), ("F", 271, CANCELLED), ("F", -29, TIMEOUT), ("C", 0, COMPLETED)])
def test_pbs_states(job_state, exit_status, state):
    assert pbs_state(job_state, exit_status) == state


@pytest.mark.parametrize("text,ok", [("1234.pbs01\n", True), ("77[].server\n", True), ("qsub: illegal -N\n", False)])
def test_qsub_job_id(text, ok):
    if ok:
        assert PbsScheduler.parse_job_id(text) == text.strip()
    else:
        with pytest.raises(SchedulerError):
            PbsScheduler.parse_job_id(text)


def test_directive_overrides():
    generated = ["--nodes=2", "--cpus-per-task=4", "--output=output.log"]
    assert apply_directive_overrides(generated, ["cpus-per-task"], ["--qos=x"]) == \
        ["--nodes=2", "--output=output.log", "--qos=x"]
