"""Scheduler directives checked against each scheduler's grammar, and the site's skip/extra override point."""

from __future__ import annotations

import os
import re

import pytest

from submission_helpers import NO_USER_CONFIG, golden_host, load_site
from hpcvod.jobs.plan import resolve
from hpcvod.jobs.render import render
from hpcvod.jobs.spec import JobSpec
from hpcvod.schedulers import scheduler_for
from hpcvod.sites import UserError, shipped_dir

GOLDEN_SITES = shipped_dir()

# PBS Pro (Reference Guide, qsub): a chunk is resource=value pairs joined by ':' after select=N
PBS_NAME = re.compile(r"^[A-Za-z][^\s@:]{0,235}$")
PBS_SELECT = re.compile(r"^select=(?P<n>[1-9]\d*)(?P<chunk>(?::[a-z_]+=[^:\s]+)+)$")
PBS_WALLTIME = re.compile(r"^walltime=(\d+):([0-5]\d):([0-5]\d)$")
PBS_PLACE = re.compile(r"^place=(free|pack|scatter|vscatter)(:(excl|shared|exclhost|group=\w+))*$")
PBS_QUEUE_ACCOUNT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+@-]*$")


def _directives(text: str, prefix: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            lines.append(line[len(prefix) + 1:])
        elif line and not line.startswith("#"):
            break  # qsub/sbatch stop reading directives at the first command
    return lines


def _plan(site_name: str, nodes: int, gpus: int, workdir, **spec):
    site = load_site(site_name, environ=NO_USER_CONFIG)
    plan = resolve(JobSpec(program="train.py", nodes=nodes, gpus_per_node=gpus, **spec), site, golden_host(gpus=gpus))
    return site, plan, render(plan, scheduler_for(site).template)


@pytest.mark.parametrize("site_name", ["pbs-ib-openmpi", "pbs-roce-intelmpi"])
@pytest.mark.parametrize("nodes,gpus", [(1, 0), (4, 4), (2, 2)])
def test_pbs_pro_grammar(golden_workdir, site_name, nodes, gpus):
    _, plan, text = _plan(site_name, nodes, gpus, golden_workdir, account="proj-42", time="1-02:03:04")
    seen = {"select": 0, "walltime": 0, "place": 0}
    flags = []
    for directive in _directives(text, "#PBS"):
        flag, _, value = directive.partition(" ")
        flags.append(flag)
        if flag == "-l":
            if value.startswith("select="):
                match = PBS_SELECT.match(value)
                assert match, value
                chunk = dict(kv.split("=") for kv in match.group("chunk")[1:].split(":"))
                assert int(match.group("n")) == plan.nodes
                assert int(chunk["mpiprocs"]) == plan.tasks_per_node
                assert int(chunk["ncpus"]) == plan.tasks_per_node * plan.cpus_per_task
                assert int(chunk.get("ngpus", 0)) == plan.gpus_per_node
                seen["select"] += 1
            elif value.startswith("walltime="):
                match = PBS_WALLTIME.match(value)
                assert match, value
                h, m, s = map(int, match.groups())
                assert h * 3600 + m * 60 + s == 26 * 3600 + 3 * 60 + 4
                seen["walltime"] += 1
            else:
                assert PBS_PLACE.match(value), value
                seen["place"] += 1
        elif flag == "-N":
            assert PBS_NAME.match(value), value
        elif flag in ("-q", "-A"):
            assert PBS_QUEUE_ACCOUNT.match(value), value
        elif flag == "-j":
            assert value == "oe"
        elif flag == "-o":
            assert value == "output.log"
        else:
            pytest.fail(f"unexpected PBS directive {directive!r}")
    assert seen == {"select": 1, "walltime": 1, "place": 1}
    assert sorted(set(flags)) == sorted(["-N", "-l", "-q", "-A", "-j", "-o"])
    assert "-A proj-42" in _directives(text, "#PBS")


SBATCH_OPTION = re.compile(r"^--(?P<opt>[a-z-]+)(=(?P<val>\S+))?$")
SBATCH_KNOWN = {"job-name", "nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "gres", "gpus-per-node",
                "time", "partition", "account", "exclusive", "output", "requeue", "open-mode", "signal"}


@pytest.mark.parametrize("site_name", ["slurm-ib-openmpi", "slurm-roce-intelmpi"])
@pytest.mark.parametrize("nodes,gpus", [(1, 0), (4, 4)])
def test_sbatch_directives(golden_workdir, site_name, nodes, gpus):
    _, plan, text = _plan(site_name, nodes, gpus, golden_workdir)
    options = {}
    for directive in _directives(text, "#SBATCH"):
        match = SBATCH_OPTION.match(directive)
        assert match and match.group("opt") in SBATCH_KNOWN, directive
        options[match.group("opt")] = match.group("val")
    assert int(options["nodes"]) == nodes
    assert int(options["ntasks"]) == plan.world_size == nodes * plan.tasks_per_node
    assert int(options["ntasks-per-node"]) == plan.tasks_per_node
    if gpus:
        gpu_request = options.get("gres") or options.get("gpus-per-node")
        assert gpu_request.endswith(f":{gpus}") or gpu_request == str(gpus)
        assert plan.tasks_per_node == gpus  # one rank per GPU
    else:
        assert "gres" not in options and "gpus-per-node" not in options
    assert re.fullmatch(r"(\d+-)?\d\d:\d\d:\d\d", options["time"])


def test_directive_skip_and_extra(golden_workdir, tmp_path):
    profile = tmp_path / "site.yaml"
    profile.write_text(
        "extends: slurm-ib-openmpi\n"
        "directives:\n  skip: ['--cpus-per-task']\n  extra: ['--constraint=ib&hdr', '--qos=high']\n")
    site = load_site(str(profile), environ=NO_USER_CONFIG)
    plan = resolve(JobSpec(program="train.py", nodes=2, gpus_per_node=4), site, golden_host(gpus=4))
    text = render(plan, scheduler_for(site).template)
    directives = _directives(text, "#SBATCH")
    assert not any(d.startswith("--cpus-per-task") for d in directives)
    assert directives[-2:] == ["--constraint=ib&hdr", "--qos=high"]
    # srun still gets the CPUs per task: skipping a directive only changes the allocation request
    assert "--cpus-per-task=16" in text


def test_gpu_request_styles(golden_workdir):
    _, _, ib = _plan("slurm-ib-openmpi", 2, 4, golden_workdir)
    _, _, roce = _plan("slurm-roce-intelmpi", 2, 4, golden_workdir)
    assert "#SBATCH --gres=gpu:a100:4\n" in ib
    assert "#SBATCH --gpus-per-node=h100:4\n" in roce


def test_intel_mpi_under_srun_gets_pmi_library(golden_workdir):
    _, plan, text = _plan("slurm-roce-intelmpi", 2, 8, golden_workdir)
    assert plan.env["I_MPI_PMI_LIBRARY"].endswith("libpmi2.so.0")
    assert "srun --mpi=pmi2 " in text
    _, plan, text = _plan("slurm-ib-openmpi", 2, 4, golden_workdir)
    assert "srun --mpi=pmix " in text and "I_MPI_PMI_LIBRARY" not in plan.env


def test_roce_sets_gid_index_and_ethernet_disables_ib(golden_workdir):
    _, plan, _ = _plan("pbs-roce-intelmpi", 1, 0, golden_workdir)
    assert plan.env["NCCL_IB_GID_INDEX"] == "3"
    _, plan, _ = _plan("local", 1, 0, golden_workdir)
    assert plan.env["NCCL_IB_DISABLE"] == "1"


def test_layout_defaults(golden_workdir):
    _, plan, _ = _plan("slurm-ib-openmpi", 2, 4, golden_workdir)
    assert (plan.tasks_per_node, plan.cpus_per_task, plan.world_size) == (4, 16, 8)  # 64 cores / 4 GPU ranks
    _, plan, _ = _plan("slurm-ib-openmpi", 1, 0, golden_workdir, partition="cpu")
    assert (plan.tasks_per_node, plan.cpus_per_task) == (128, 1)  # one rank per slot
    _, plan, _ = _plan("slurm-ib-openmpi", 1, 0, golden_workdir, partition="cpu", cpus_per_task=4)
    assert (plan.tasks_per_node, plan.cpus_per_task) == (32, 4)


def test_containers(golden_workdir):
    _, plan, text = _plan("slurm-ib-openmpi", 1, 4, golden_workdir, container="nvcr.io/nvidia/pytorch:24.05-py3")
    assert "--container-image=nvcr.io/nvidia/pytorch:24.05-py3" in plan.launch_argv
    assert "--container-mounts=/scratch:/scratch" in plan.launch_argv
    assert plan.program_argv[0] == "python3"  # the image's Python, not the login node's
    profile_text = "extends: pbs-ib-openmpi\ncontainer:\n  runtime: apptainer\n  mounts: [/scratch]\n"
    path = golden_workdir / "apptainer-site.yaml"
    path.write_text(profile_text)
    site = load_site(str(path), environ=NO_USER_CONFIG)
    image = golden_workdir / "t.sif"   # an image file that exists: a missing one is refused (test_container_checks)
    image.write_bytes(b"")
    plan = resolve(JobSpec(program="train.py", nodes=1, gpus_per_node=2, container=str(image)), site,
                   golden_host(gpus=2))
    assert plan.program_argv[:6] == ("apptainer", "exec", "--nv", "--bind", "/scratch", str(image))


# ---- per-job scheduler options (hpcvod/sites/joboptions.py) ------------------------------------------------

def _options(**values):
    from hpcvod.sites.joboptions import job_options

    return job_options(values)


@pytest.mark.parametrize("site_name,values,refused", [
    ("pbs-ib-openmpi", {"qos": "high"}, "--qos 'high': pbs has no such request (Slurm only)"),
    ("pbs-ib-openmpi", {"mem_per_gpu": "8G"}, "--mem-per-gpu '8G': pbs has no such request"),
    ("pbs-ib-openmpi", {"reservation": "R1"}, "a PBS reservation is a queue of its own"),
    ("pbs-ib-openmpi", {"array": "1,3,5"}, "--array '1,3,5': pbs has no such request (it takes one range"),
    ("pbs-ib-openmpi", {"begin": "now+60"}, "--begin 'now+60': pbs has no such request (qsub takes a date"),
    ("pbs-ib-openmpi", {"dependency": "singleton"}, "singleton is Slurm's only"),
    ("pbs-ib-openmpi", {"mail_type": "TIME_LIMIT"}, "TIME_LIMIT is Slurm's only"),
    ("sge-sandbox", {"mem": "4G"}, "Grid Engine asks for memory per slot"),
    ("sge-sandbox", {"array": "0-9"}, "its task indexes start at 1"),
    ("sge-sandbox", {"dependency": "afterok:12"}, "afterok: Grid Engine's -hold_jid only waits for the end"),
    ("sge-sandbox", {"reservation": "maint"}, "by its number"),
    ("sge-sandbox", {"constraint": "a100"}, "--constraint 'a100': sge has no such request"),
    ("local", {"exclusive": True}, "--exclusive: local has no such request (it runs jobs on this machine"),
])
def test_options_a_scheduler_lacks_are_refused_in_one_line(golden_workdir, site_name, values, refused):
    with pytest.raises(UserError) as err:
        _plan(site_name, 1, 0, golden_workdir, options=_options(**values))
    assert refused in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("flag,value,expected", [
    ("--mem", "64X", "expected a size"), ("--mem-per-gpu", "0", "expected a size"),
    ("--begin", "tomorrow", "expected a start time"), ("--begin", "2026-02-30", "a date and time that exist"),
    ("--array", "9-1", "END >= START"), ("--array", "0-3%0", "%MAX >= 1"), ("--array", "1,1", "each index once"),
    ("--array", "a-b", "array indexes as a range"), ("--dependency", "afterok", "Slurm's dependency grammar"),
    ("--dependency", "afterok:1;rm", "Slurm's dependency grammar"), ("--mail-type", "BEGIN,LUNCH", "mail events"),
    ("--mail-user", "a b@c", "whitespace (U+0020) at character 2"),
    ("--constraint", "a100 && ib", "expected one directive value; whitespace"),
    ("--nodelist", "n1;n2", "host names or ranges"), ("--qos", "-high", "a name of letters"),
    ("--sched-opt", "comment=a;b", "';' outside quotes is not allowed"),
    ("--sched-opt", "--comment=x", "without leading dashes"), ("--sched-opt", "comment=$(id)", "'$' outside quotes"),
    ("--sched-opt", "comment=\"a\nb\"", "whitespace (U+000A)"),
])
def test_bad_option_values_name_flag_value_and_expectation(golden_workdir, flag, value, expected):
    from hpcvod.sites.joboptions import job_options

    with pytest.raises(UserError) as err:
        job_options({flag[2:].replace("-", "_"): [value] if flag == "--sched-opt" else value})
    text = str(err.value)
    assert text.startswith(f"{flag} {value!r}"), text
    assert expected in text, text


def test_bad_option_on_the_command_line_is_one_line_exit_2(golden_workdir):
    from submission_helpers import hpcvod, one_error_line

    done = hpcvod("render", "--site", "slurm-ib-openmpi", "--array", "5-1", "train.py", cwd=golden_workdir)
    one_error_line(done.returncode, done.stderr, "--array '5-1'", "END >= START")
    done = hpcvod("render", "--site", "pbs-ib-openmpi", "--qos", "high", "train.py", cwd=golden_workdir)
    one_error_line(done.returncode, done.stderr, "--qos 'high': pbs has no such request")


def _with_defaults(tmp_path, lines: str):
    """slurm-ib-openmpi with these job_defaults lines for its partition gpu."""
    profile = tmp_path / "defaults.yaml"
    profile.write_text(f"extends: {GOLDEN_SITES / 'slurm-ib-openmpi.yaml'}\npartitions:\n  gpu:\n    job_defaults:\n"
                       + lines)
    return profile


def test_partition_defaults_and_the_user_flag_beats_them(golden_workdir, tmp_path):
    profile = _with_defaults(tmp_path, "      exclusive: true\n      qos: normal\n      mem_per_gpu: 8G\n"
                                       "      sched_opt: [comment=site]\n")
    site = load_site(str(profile), environ=NO_USER_CONFIG)
    host = golden_host(gpus=4)
    plan = resolve(JobSpec(program="train.py", gpus_per_node=4), site, host)
    assert {"--exclusive", "--qos=normal", "--mem-per-gpu=8G", "--comment=site"} <= set(plan.directives)
    mine = _options(qos="high", mem="100G", sched_opt=["comment=mine"])
    plan = resolve(JobSpec(program="train.py", gpus_per_node=4, options=mine), site, host)
    assert {"--exclusive", "--qos=high", "--mem=100G"} <= set(plan.directives)
    assert "--qos=normal" not in plan.directives and not any(d.startswith("--mem-per-gpu") for d in plan.directives)
    assert plan.directives.index("--comment=site") < plan.directives.index("--comment=mine")  # the user's last


def test_bad_partition_default_names_the_key(golden_workdir, tmp_path):
    profile = _with_defaults(tmp_path, "      mem: lots\n")
    with pytest.raises(UserError, match=r"defaults.yaml:\d+: partitions.gpu.job_defaults.mem: expected a size"):
        load_site(str(profile), environ=NO_USER_CONFIG)
    profile = _with_defaults(tmp_path, "      array: 0-3\n")
    with pytest.raises(UserError, match=r"partitions.gpu.job_defaults.array: unknown key"):
        load_site(str(profile), environ=NO_USER_CONFIG)


def test_dependency_on_a_job_folder_becomes_its_job_id(golden_workdir, tmp_path, monkeypatch):
    import json

    folder = tmp_path / "hpcvod-jobs" / "prep-20261124-101010"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"job_id": "4242", "scheduler": "slurm"}))
    (folder / "request.json").write_text(json.dumps({"plan": {"site": "slurm-ib-openmpi", "site_source": ""}}))
    monkeypatch.chdir(tmp_path)
    for given in (str(folder), folder.name):
        _, plan, _ = _plan("slurm-ib-openmpi", 1, 0, golden_workdir,
                           options=_options(dependency=f"afterok:{given}:77,singleton"))
        assert "--dependency=afterok:4242:77,singleton" in plan.directives
    with pytest.raises(UserError, match=r"'nosuch': expected a slurm job id like .* or an hpcvod job folder"):
        _plan("slurm-ib-openmpi", 1, 0, golden_workdir, options=_options(dependency="afterok:nosuch"))
    with pytest.raises(UserError, match=r"is a slurm job; this site's jobs run under pbs"):
        _plan("pbs-ib-openmpi", 1, 0, golden_workdir, options=_options(dependency=f"afterok:{folder.name}"))


def test_array_index_reaches_the_ranks(golden_workdir):
    for site_name, var in (("slurm-ib-openmpi", "SLURM_ARRAY_TASK_ID"), ("pbs-ib-openmpi", "PBS_ARRAY_INDEX"),
                           ("sge-sandbox", "SGE_TASK_ID")):
        _, plan, text = _plan(site_name, 1, 0, golden_workdir, options=_options(array="1-3"))
        assert f'export HPCVOD_ARRAY_INDEX="${var}"' in text
        assert "exitcode.$HPCVOD_ARRAY_INDEX" in text
        _, _, plain = _plan(site_name, 1, 0, golden_workdir)
        assert "HPCVOD_ARRAY_INDEX" not in plain


# ---- one value, one directive (issue 23: directives smuggled in values) -----------------------------------

SITES_WITH_DIRECTIVES = ["slurm-ib-openmpi", "pbs-ib-openmpi", "sge-sandbox"]


@pytest.mark.parametrize("value,named", [
    ("comment=x --uid=0", "whitespace (U+0020) at character 10"),
    ("comment=x\f--uid=0", "whitespace (U+000C)"), ("comment=x\v--uid=0", "whitespace (U+000B)"),
    ("comment=x\t--uid=0", "whitespace (U+0009)"), ("comment=x\u00a0--uid=0", "whitespace (U+00A0)"),
    ("comment=x\u2028--uid=0", "whitespace (U+2028)"), ("comment=x\u3000y", "whitespace (U+3000)"),
    ("comment=x\x1cy", "whitespace (U+001C)"), ("comment=x\x00y", "a control character (U+0000)"),
    ("comment=x\x1b[2Jy", "a control character (U+001B)"), ("comment=x\u200b--uid=0", "invisible format character"),
    ("comment=\"x --uid=0\"", "whitespace (U+0020)"),  # sbatch reads quotes; qsub's families need not
])
def test_sched_opt_with_whitespace_or_control_characters_is_refused(value, named):
    with pytest.raises(UserError) as err:
        _options(sched_opt=[value])
    text = str(err.value)
    assert text.startswith(f"--sched-opt {value!r}: expected one directive value; ") and named in text, text
    assert "\n" not in text


@pytest.mark.parametrize("site_name", SITES_WITH_DIRECTIVES)
def test_a_value_starting_with_a_dash_is_no_second_option(golden_workdir, site_name):
    # `-h -V` (qsub) and `-H --export=NONE` (sbatch): a one-letter option without an argument, then another one
    for value in ("h=-V", "H=--export=NONE"):
        with pytest.raises(UserError, match="a VALUE that starts with '-'"):
            _options(sched_opt=[value])


def test_sched_opt_cannot_change_the_export_that_carries_the_secrets(golden_workdir):
    """The issue's case: --secret-env with a --sched-opt carrying --export=NONE changed the export sbatch ran
    with, and the job lost its secret; neither the smuggled word nor the directive itself gets through."""
    from submission_helpers import hpcvod, one_error_line

    env = {**os.environ, "TOKEN": "s3cret"}
    for opt, expected in (("comment=x --export=NONE", "whitespace (U+0020)"),
                          ("export=NONE", "--export is left to hpcvod on slurm (the job's environment is --env and "
                                          "--secret-env)"),
                          ("expo=NONE", "--export is left to hpcvod on slurm")):
        done = hpcvod("submit", "--dry-run", "--site", "slurm-ib-openmpi", "--secret-env", "TOKEN", "--sched-opt",
                      opt, "train.py", cwd=golden_workdir, env=env)
        one_error_line(done.returncode, done.stderr, f"--sched-opt {opt!r}", expected)


@pytest.mark.parametrize("site_name,value,expected", [
    ("slurm-ib-openmpi", "ntasks=64", "--ntasks is left to hpcvod on slurm (use --nodes and --tasks-per-node)"),
    ("slurm-ib-openmpi", "N=3", "-N is left to hpcvod on slurm (use --nodes)"),
    ("slurm-ib-openmpi", "output=/tmp/x", "--output is left to hpcvod on slurm (the job's log is output.log"),
    ("slurm-ib-openmpi", "e=err.log", "-e is left to hpcvod"), ("slurm-ib-openmpi", "no-requeue", "preemption"),
    ("slurm-ib-openmpi", "qos=high", "--qos is left to hpcvod on slurm (use --qos)"),
    ("slurm-ib-openmpi", "part=debug", "--partition is left to hpcvod"),  # getopt_long's abbreviation
    ("slurm-ib-openmpi", "get-user-env", "--get-user-env is left to hpcvod"),
    ("pbs-ib-openmpi", "V", "-V is left to hpcvod on pbs (the job's environment is --env and --secret-env)"),
    ("pbs-ib-openmpi", "l=software=x,walltime=99:00:00", "-l walltime is left to hpcvod on pbs (use --time)"),
    ("pbs-ib-openmpi", "l=select=1:ncpus=1", "-l select is left to hpcvod"),
    ("pbs-ib-openmpi", "l=ngpus=8", "-l ngpus is left to hpcvod on pbs (use --gpus-per-node)"),
    ("pbs-ib-openmpi", "W=depend=afterok:1", "-W depend is left to hpcvod on pbs (use --dependency)"),
    ("pbs-ib-openmpi", "o=elsewhere", "-o is left to hpcvod on pbs (the job's log"),
    ("pbs-ib-openmpi", "lselect=1", "expected one letter, a qsub option"),
    ("sge-sandbox", "l=h_vmem=4G,h_rt=99:00:00", "-l h_rt is left to hpcvod on sge (use --time)"),
    ("sge-sandbox", "pe=mpi", "-pe is left to hpcvod on sge (use --nodes and --tasks-per-node"),
    ("sge-sandbox", "V", "-V is left to hpcvod on sge"), ("sge-sandbox", "clear", "-clear is left to hpcvod"),
    ("sge-sandbox", "l=gpu=4", "-l gpu is left to hpcvod on sge (use --gpus-per-node)"),
    ("sge-sandbox", "S=/bin/sh", "-S is left to hpcvod on sge (the job script is bash)"),
])
def test_sched_opt_cannot_override_a_directive_hpcvod_computes(golden_workdir, site_name, value, expected):
    with pytest.raises(UserError) as err:
        _plan(site_name, 1, 0, golden_workdir, options=_options(sched_opt=[value]))
    text = str(err.value)
    assert text.startswith(f"--sched-opt {value!r}: ") and expected in text and "\n" not in text, text


@pytest.mark.parametrize("site_name,value,line", [
    ("slurm-ib-openmpi", "comment=\"a;b\"", "#SBATCH --comment=\"a;b\""),
    ("slurm-ib-openmpi", "H", "#SBATCH -H"), ("slurm-ib-openmpi", "time-min=10", "#SBATCH --time-min=10"),
    ("pbs-ib-openmpi", "W=group_list=proj", "#PBS -W group_list=proj"), ("pbs-ib-openmpi", "h", "#PBS -h"),
    ("sge-sandbox", "l=h_vmem=4G", "#$ -l h_vmem=4G"), ("sge-sandbox", "ac=sweep=1", "#$ -ac sweep=1"),
])
def test_other_directives_still_pass(golden_workdir, site_name, value, line):
    _, _, text = _plan(site_name, 1, 0, golden_workdir, options=_options(sched_opt=[value]))
    assert text.count(f"\n{line}\n") == 1, text


def test_a_partition_default_that_names_a_computed_directive_names_its_key(golden_workdir, tmp_path):
    profile = _with_defaults(tmp_path, "      sched_opt: [export=NONE]\n")
    site = load_site(str(profile), environ=NO_USER_CONFIG)
    with pytest.raises(UserError) as err:
        resolve(JobSpec(program="train.py", gpus_per_node=4), site, golden_host(gpus=4))
    assert str(err.value).startswith("site 'defaults': partitions.gpu.job_defaults: --sched-opt 'export=NONE': "
                                     "--export is left to hpcvod on slurm"), err.value


@pytest.mark.parametrize("line", ["      sched_opt: [\"comment=a\\0b\"]\n", "      sched_opt: [\"comment=a b\"]\n",
                                  "      sched_opt: [\"comment=a\\u2029b\"]\n", "      qos: \"a\\x0bb\"\n"])
def test_sites_validate_refuses_a_nul_or_space_in_a_partition_default(golden_workdir, tmp_path, line):
    profile = _with_defaults(tmp_path, line)
    key = "partitions.gpu.job_defaults." + line.split(":")[0].strip()
    text = _validate_error(golden_workdir, profile, key + ("[0]" if "sched_opt" in key else ""), "expected")
    assert re.match(rf"{re.escape(str(profile))}:\d+: {re.escape(key)}", text), text


def _validate_error(cwd, profile, *pieces: str) -> str:
    """`sites validate PROFILE` refuses it: exit 2, one line naming the file and line, each piece, printable."""
    from submission_helpers import hpcvod

    done = hpcvod("sites", "validate", str(profile), cwd=cwd)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(f"{profile}:"), done.stderr
    assert done.stderr.rstrip("\n").isprintable(), repr(done.stderr)
    for piece in pieces:
        assert piece in done.stderr, done.stderr
    return done.stderr


@pytest.mark.parametrize("key,text", [("directives", "  extra: [\"--comment=a\\0b\"]\n"),
                                      ("setup", "  - \"echo a\\0b\"\n"), ("description", " \"a\\x1b[2Jb\"\n")])
def test_no_profile_line_holds_a_control_character(golden_workdir, tmp_path, key, text):
    profile = tmp_path / "ctl.yaml"
    profile.write_text(f"extends: {GOLDEN_SITES / 'slurm-ib-openmpi.yaml'}\n{key}:"
                       + (text if text.startswith(" \"") else "\n" + text))
    _validate_error(golden_workdir, profile, key, "expected one line of text")


# ---- dates, expressions and host lists a scheduler cannot read (issue 23, item 14) -----------------------

@pytest.mark.parametrize("site_name", SITES_WITH_DIRECTIVES)
def test_begin_before_1970_is_refused_everywhere(golden_workdir, site_name):
    for value in ("0001-01-01", "1969-12-31T23:59:59"):
        with pytest.raises(UserError, match=re.escape(f"--begin {value!r}: expected a time from 1970-01-01 on")):
            _plan(site_name, 1, 0, golden_workdir, options=_options(begin=value))
    _, plan, _ = _plan(site_name, 1, 0, golden_workdir, options=_options(begin="1970-01-01"))
    if site_name != "slurm-ib-openmpi":
        assert "-a 197001010000.00" in plan.directives  # qsub's CCYYMMDDhhmm.SS, four digits of year


@pytest.mark.parametrize("flag,value,expected", [
    ("--constraint", "((a)", "each ( closed by a )"), ("--constraint", "(a))", "each ( closed by a )"),
    ("--constraint", "a)&(b", "each ( closed by a )"), ("--constraint", "[a|b", "a [ at the start closed by a ]"),
    ("--constraint", "a|b]", "node features"), ("--constraint", "a||b", "node features"),
    ("--constraint", "[a|]", "node features"), ("--constraint", "()", "node features"),
    ("--nodelist", "n[5-1]", "range '5-1': expected FIRST-LAST with LAST >= FIRST"),
    ("--exclude", "n[1-3,9-7]", "range '9-7'"), ("--nodelist", "n[1--2]", "host names or ranges"),
    ("--nodelist", "n[,1]", "host names or ranges"), ("--nodelist", "n[-]", "host names or ranges"),
    ("--nodelist", "n[]", "host names or ranges"), ("--nodelist", "n[1-2", "host names or ranges"),
])
def test_unbalanced_expressions_and_descending_ranges_are_refused(flag, value, expected):
    with pytest.raises(UserError) as err:
        _options(**{flag[2:]: value})
    assert str(err.value).startswith(f"{flag} {value!r}: ") and expected in str(err.value), err.value


def test_balanced_expressions_and_ranges_pass(golden_workdir):
    for constraint in ("(a|b)&c", "[rack1*2&rack2*4]", "((a&b)|c)", "a100&ib"):
        _options(constraint=constraint)
    _, plan, _ = _plan("slurm-ib-openmpi", 1, 0, golden_workdir,
                       options=_options(nodelist="n[01-04,7,9-9],gpu7", constraint="[r1|r2]"))
    assert {"--nodelist=n[01-04,7,9-9],gpu7", "--constraint=[r1|r2]"} <= set(plan.directives)
