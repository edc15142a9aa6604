"""The ``hpcvod`` command.

  hpcvod submit [OPTIONS] SCRIPT [ARGS...]    render a batch script for the site and submit it
  hpcvod render [OPTIONS] [-o FILE] SCRIPT    write the script without submitting
  hpcvod status [--wait]|logs [-f] [--rank N]|cancel JOB    JOB = job id or job folder
  hpcvod jobs [--json]                        the job folders here, newest first, and where each job stands
  hpcvod sites list|show NAME|validate FILE...|schema
  hpcvod run -np N [...] COMMAND...           start ranks here (or on -H hosts), like horovodrun
  hpcvod doctor [--site S]                    what MPI, launcher and frameworks this machine (and S's jobs) have

Exit status: 0 success, 1 the job or the scheduler failed, 2 bad input (one line on stderr, no traceback).
Nothing here imports MPI or a framework: submitting must stay fast on a login node.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from hpcvod import __version__
from hpcvod.support.errors import UserError, one_line

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line (and exit status 2), and takes no abbreviation: `--gpus=8`
    must never become --gpus-per-node=8 (every parser and sub-parser of hpcvod is one of these)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("hpcvod").strip()
        raise UserError(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]):  # type: ignore[override]
        # argparse drops a value that is exactly "--" (--account=--) and hands the option an empty list
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected a value, got '--'")
        return super()._get_values(action, arg_strings)


def _add_scheduler_options(p: argparse.ArgumentParser) -> None:
    """One flag per per-job scheduler option (hpcvod/sites/joboptions.py defines them and their checks)."""
    from hpcvod.sites.joboptions import flag, option_help

    group = p.add_argument_group("scheduler options (a partition may set defaults; refused in one line where the "
                                 "site's scheduler has no such request; docs/submission.md)")
    for name, metavar, text in option_help():
        if metavar is None:
            group.add_argument(flag(name), action="store_true", default=None, help=text)
        elif name == "sched_opt":
            group.add_argument(flag(name), action="append", default=[], metavar=metavar, help=text)
        else:
            group.add_argument(flag(name), metavar=metavar, help=text)


# sbatch options whose request hpcvod words another way: refused in one line naming hpcvod's option
SBATCH_REFUSED = {
    "--gpus-per-task": "hpcvod starts one rank per GPU: give --gpus-per-node (-G) or --gpus (a total)",
    "--ntasks-per-gpu": "hpcvod starts one rank per GPU: give --gpus-per-node (-G)",
    "--cpus-per-gpu": "hpcvod starts one rank per GPU: give --cpus-per-task (-c)",
    "--gpus-per-socket": "give --gpus-per-node (-G)",
    "--mem-per-cpu": "give --mem (per node) or --mem-per-gpu",
}


class _Refused(argparse.Action):
    """An option of sbatch that hpcvod does not take: one line naming what to give instead."""

    def __init__(self, *args, instead: str = "", **kwargs) -> None:
        self.instead = instead
        super().__init__(*args, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        raise UserError(f"{option_string}: not an hpcvod option: {self.instead}")


def _per_node(total: int | None, nodes: int | None, flag: str, per_node_flag: str) -> int | None:
    """sbatch's total (--gpus, --ntasks) as hpcvod's per-node count; one line where it does not divide."""
    if total is None:
        return None
    count = nodes or 1
    least = 0 if flag == "--gpus" else 1
    if total < least:
        raise UserError(f"{flag} {total}: expected an integer >= {least}")
    if count > 0 and total % count:
        raise UserError(f"{flag} {total}: a total for {count} node{'s' if count != 1 else ''} does not divide "
                        f"evenly; give {per_node_flag} (per node) or a multiple of {count}")
    return total // count if count > 0 else total


def _gres_gpus(gres: str | None) -> tuple[str | None, int] | None:
    """--gres gpu:N or gpu:TYPE:N -> (TYPE or None, N); anything else is one line."""
    if gres is None:
        return None
    import re

    match = re.fullmatch(r"gpu(?::([A-Za-z0-9_.-]+))?:([0-9]+)", gres)
    if not match:
        raise UserError(f"--gres {gres!r}: expected gpu:N or gpu:TYPE:N (GPUs per node); other resources: "
                        "--sched-opt")
    return match.group(1), int(match.group(2))


def _sbatch_spellings(args: argparse.Namespace) -> None:
    """Turn sbatch's spellings into hpcvod's options, once: each clash with hpcvod's own is one line."""
    gres = _gres_gpus(args.gres)
    given = [(flag, value) for flag, value in (("--gpus-per-node", args.gpus_per_node), ("--gpus", args.gpus),
                                              ("--gres", gres)) if value is not None]
    if len(given) > 1:
        raise UserError(f"{given[0][0]} and {given[1][0]}: two ways to ask for GPUs; give one")
    if args.gpus is not None:
        args.gpus_per_node = _per_node(args.gpus, args.nodes, "--gpus", "--gpus-per-node (-G)")
    if gres is not None:
        args.gpus_per_node = gres[1]
    if args.ntasks is not None:
        if args.tasks_per_node is not None:
            raise UserError("--ntasks and --tasks-per-node: two ways to ask for ranks; give one")
        args.tasks_per_node = _per_node(args.ntasks, args.nodes, "--ntasks", "--tasks-per-node")


def _short_q(args: argparse.Namespace, site) -> None:
    """-q, once the site is known: the QoS on a Slurm site (as sbatch reads it), the queue elsewhere (qsub)."""
    if args.short_q is None:
        return
    from hpcvod.schedulers import scheduler_class

    if scheduler_class(site.profile.scheduler).short_q_is_qos:
        if args.qos is not None:
            raise UserError(f"-q {args.short_q} and --qos {args.qos}: -q is the QoS on site {site.name!r}; give one")
        args.qos = args.short_q
    else:
        if args.partition is not None:
            raise UserError(f"-q {args.short_q} and --partition/--queue {args.partition}: -q is the queue on site "
                            f"{site.name!r}; give one")
        args.partition = args.short_q


def _add_job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--site", help="site profile name or path (default: $HPCVOD_SITE, hostname patterns, local)")
    p.add_argument("--nodes", "-N", type=int, help="number of nodes (default 1)")
    p.add_argument("--gpus-per-node", "-G", type=int, metavar="N",
                   help="GPUs PER NODE, one rank each (default: every GPU of the partition's nodes; -G 0: CPU ranks "
                   "on a GPU partition). For a total as sbatch's --gpus, use --gpus")
    p.add_argument("--tasks-per-node", "--ntasks-per-node", type=int,
                   help="ranks per node (default: GPUs per node, or one per CPU slot)")
    p.add_argument("--cpus-per-task", "-c", type=int,
                   help="CPUs per rank (default: the node's CPUs shared among its GPU ranks, else 1)")
    group = p.add_argument_group("sbatch's spellings (the same request, turned into hpcvod's per-node options)")
    group.add_argument("--ntasks", "-n", type=int, metavar="N", help="ranks IN TOTAL: --tasks-per-node = N / --nodes "
                       "(refused unless it divides)")
    group.add_argument("--gpus", type=int, metavar="N", help="GPUs IN TOTAL: --gpus-per-node = N / --nodes (refused "
                       "unless it divides)")
    group.add_argument("--gres", metavar="gpu:[TYPE:]N", help="N GPUs per node (TYPE: the partition's gpu_type)")
    p.add_argument("--time", "-t", help="walltime, HH:MM:SS, D-HH:MM:SS or minutes (default: the partition's)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--partition", "-p", help="partition (Slurm) or queue (PBS, SGE)")
    group.add_argument("--queue", dest="partition", help="same as --partition")
    p.add_argument("-q", dest="short_q", metavar="NAME", help="as sbatch and qsub read it: the QoS on a Slurm site "
                   "(--qos), the queue on a PBS or SGE site (--queue)")
    for spelling, instead in SBATCH_REFUSED.items():
        p.add_argument(spelling, dest=None, action=_Refused, nargs="?", help=argparse.SUPPRESS, instead=instead)
    p.add_argument("--account", "-A", help="account/project to charge (default: the site's)")
    p.add_argument("--job-name", "-J", help="job name (default: the script's name)")
    _add_scheduler_options(p)
    p.add_argument("--env", "-e", action="append", default=[], metavar="KEY=VALUE|KEY",
                   help="environment variable for every rank (repeatable); KEY=VALUE is written into the script "
                   "verbatim; a bare KEY takes its value from this environment at submit time and is never written "
                   "(for tokens: see --secret-env)")
    p.add_argument("--secret-env", action="append", default=[], metavar="KEY",
                   help="like --env KEY: the job gets KEY's value from this environment through the scheduler; only "
                   "the name is written (script, request.json); repeatable")
    p.add_argument("--shared-job-dir", action="store_true", default=None,
                   help="make the job folder readable by your group (0750/0640) instead of you only (0700/0600); "
                   "default: the site's jobs.shared_with_group")
    p.add_argument("--container", help="container image to run the ranks in (the site's container runtime)")
    group = p.add_argument_group("tf.data service compute job, submitted with the training (docs/data-service.md)")
    group.add_argument("--data-service-nodes", type=int, metavar="N", help="CPU nodes that run the compute job "
                       "(python -m hpcvod.tensorflow.data.compute_worker); the ranks find its config in "
                       "$HPCVOD_DATA_SERVICE_CONFIG")
    group.add_argument("--data-service-partition", metavar="P", help="their partition (default: the training's)")
    group.add_argument("--data-service-tasks-per-node", type=int, metavar="T", help="compute ranks per node "
                       "(default 1, with all the node's CPUs)")
    group.add_argument("--data-service-dispatchers", type=int, metavar="D", help="dispatchers (default 1; the "
                       "compute ranks must be a multiple)")
    group.add_argument("--data-service-dispatcher-side", choices=["compute", "training"],
                       help="where the dispatchers run (default compute)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hpcvod", description="Horovod-style training that knows Slurm and PBS.")
    parser.add_argument("--version", action="version", version=f"hpcvod {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("submit", help="submit a job (a .py script runs under the job's Python)",
                       usage="hpcvod submit [OPTIONS] [--] SCRIPT [ARGS...]")
    _add_job_options(p)
    p.add_argument("--output-dir", metavar="DIR", help="where job folders are created (default ./hpcvod-jobs)")
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    p.add_argument("--wait", "-W", action="store_true", help="wait for the job to end; exit 1 if it failed")
    p.add_argument("--show-output", action="store_true", help="with --wait: print the job's output at the end")
    p.add_argument("--follow", action="store_true", help="wait, and print rank 0's output as it comes (the live "
                   "line on stderr shows the time left of --time)")

    p = sub.add_parser("render", help="write the batch script without submitting",
                       usage="hpcvod render [OPTIONS] [-o FILE [--force]] [--] SCRIPT [ARGS...]")
    _add_job_options(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write the script here (default: stdout); an existing "
                   "file only if hpcvod rendered it, never the program the script launches")
    p.add_argument("--force", action="store_true", help="with -o: overwrite FILE even if hpcvod did not render it")

    for name, text in (("status", "where a job stands"), ("cancel", "cancel a job")):
        p = sub.add_parser(name, help=text)
        p.add_argument("job", metavar="JOB", help="job id or job folder")
        p.add_argument("--site", help="site to ask when JOB is an id no job folder records")
        if name == "status":
            p.add_argument("--json", action="store_true", help="print machine-readable JSON")
            p.add_argument("--wait", "-W", action="store_true", help="wait for the job to end (a live line on a "
                           "terminal); exit 1 if it failed; Ctrl-C stops waiting, not the job")
    p = sub.add_parser("logs", help="print a job's output (each line labelled [RANK]<stdout|stderr>)")
    p.add_argument("job", metavar="JOB", help="job id or job folder")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends (also across "
                   "a requeue)")
    p.add_argument("--rank", type=int, metavar="N", help="only the lines of rank N")
    p = sub.add_parser("jobs", help="the job folders, newest first: name, id, site, state, submitted, elapsed, exit")
    p.add_argument("--output-dir", metavar="DIR", action="append",
                   help="where the job folders are (repeatable; default: $HPCVOD_JOBS_DIR, then ./hpcvod-jobs)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")

    p = sub.add_parser("sites", help="site profiles: list, show, validate, schema")
    sites = p.add_subparsers(dest="sites_command", metavar="ACTION", parser_class=_Parser)
    sites.required = True
    sites.add_parser("list", help="profiles that --site can name, and where they are")
    q = sites.add_parser("show", help="a profile after extends and defaults")
    q.add_argument("name", metavar="NAME", help="profile name or path")
    q = sites.add_parser("validate", help="check profile files; exit 2 if any is invalid")
    q.add_argument("files", metavar="FILE", nargs="+")
    q = sites.add_parser("schema", help="the JSON Schema of a profile (for editors)")
    q.add_argument("--markdown", action="store_true", help="the key reference table of docs/sites.md instead")
    q = sites.add_parser("check", help="run one acceptance job through a profile: world, environment, links "
                         "(exit 0 all pass, 1 any fail)")
    q.add_argument("site", metavar="SITE", nargs="?", help="profile name or path (default: as --site finds one)")
    q.add_argument("--nodes", type=int, help="nodes (default 2; 1 on local or a one-node partition)")
    q.add_argument("--gpus-per-node", type=int, help="GPUs a node, one rank each (default: 2 CPU ranks a node)")
    q.add_argument("--partition", help="partition or queue (default: the profile's)")
    q.add_argument("--quick", action="store_true", help="measure messages up to 4 MiB instead of 256 MiB")
    q.add_argument("--framework", action="append", default=[], metavar="NAME",
                   help="a framework the ranks must import (repeatable): torch, tensorflow, mxnet, ...")
    q.add_argument("--output-dir", metavar="DIR", help="where the job folder goes (default: $HPCVOD_JOBS_DIR's "
                   "first entry, then ./hpcvod-jobs); earlier reports there are compared")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.add_argument("--model-mib", metavar="MIB[,MIB...]",
                   help="gradient sizes for the projected allreduce time and scaling (default 100 without --model)")
    q.add_argument("--model", metavar="PATH", help="a saved torch state_dict, checkpoint or TorchScript file whose "
                   "parameters give one more gradient size (needs torch in this Python)")
    q.add_argument("--overlap", type=float, default=0.0, metavar="FRACTION",
                   help="share of the allreduce hidden behind the backward pass in the projected efficiency "
                   "(default 0: none, a lower bound)")
    q.add_argument("--step-ms", type=float, default=100.0, metavar="MS",
                   help="compute time of one training step for the projected efficiency (default 100)")
    q.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="cancel the job and fail if it has not ended this long after submission (default: wait)")

    p = sub.add_parser("run", help="start ranks on this machine or on given hosts (like horovodrun)",
                       usage="hpcvod run -np N [-H HOSTS | --hostfile FILE] [OPTIONS] COMMAND...")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    p.add_argument("-H", "--hosts", help="hosts and slots, e.g. h1:2,h2:2 (default: this machine)")
    p.add_argument("--hostfile", help="file with one `host[:slots]` or `host slots=N` per line")
    p.add_argument("--mpi-args", default="", help="extra arguments for the MPI launcher (one string)")
    p.add_argument("--timeline-filename", help="write a Chrome-trace timeline here (HPCVOD_TIMELINE)")
    p.add_argument("--fusion-threshold-mb", type=float, help="fusion buffer size in MiB (HPCVOD_FUSION_THRESHOLD)")
    p.add_argument("--cycle-time-ms", type=float, help="engine cycle time in ms (HPCVOD_CYCLE_TIME)")
    p.add_argument("--cache-capacity", type=int, help="response cache entries (HPCVOD_CACHE_CAPACITY)")
    p.add_argument("--stall-check-warning-time-seconds", type=int, help="HPCVOD_STALL_CHECK_TIME_SECONDS")
    p.add_argument("--stall-check-shutdown-time-seconds", type=int, help="HPCVOD_STALL_SHUTDOWN_TIME_SECONDS")
    p.add_argument("--hierarchical-allreduce", action="store_true", help="HPCVOD_HIERARCHICAL_ALLREDUCE=1")
    p.add_argument("--env", "-e", action="append", default=[], metavar="KEY=VALUE", help="more environment")
    p.add_argument("--mpi", dest="launcher", help="MPI launcher to use (default: the mpiexec beside this Python)")
    p.add_argument("--verbose", "-v", action="store_true", help="print the launch command before running it")

    from hpcvod.jobs.timeline_summary import add_parser as add_timeline_parser

    add_timeline_parser(sub)
    p = sub.add_parser("doctor", help="what MPI, launcher, mpi4py and frameworks this machine has")
    p.add_argument("--site", help="the site whose jobs to check (default: the one a submit from here would use)")
    return parser


# ---- argv splitting: options, then SCRIPT, then the script's own arguments ------------------------------


def _split_program(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """Options end at ``--`` or at the first word that is not an option or an option's value; everything from
    there on belongs to the program, untouched (so `train.py --nodes 3` passes --nodes to train.py)."""
    takes_value = {}
    for action in parser._actions:  # argparse has no public API for this
        for flag in action.option_strings:
            takes_value[flag] = action.nargs != 0
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1:]
        if not word.startswith("-") or word == "-":
            return argv[:i], argv[i:]
        flag = word.split("=", 1)[0]
        if takes_value.get(flag) and "=" not in word and not (len(flag) == 2 and len(word) > 2):
            i += 1  # the option's value
        i += 1
    return argv, []


def _job_spec(args: argparse.Namespace, program: list[str]):
    from hpcvod.jobs.spec import JobSpec, parse_job_env
    from hpcvod.sites.joboptions import job_options, option_names

    if not program:
        raise UserError("missing SCRIPT: expected a script or command to run (hpcvod submit [OPTIONS] SCRIPT [ARGS...])")
    env, secret_env = parse_job_env(args.env, args.secret_env)
    data_service = _data_service_spec(args)
    return JobSpec(program=program[0], args=tuple(program[1:]), nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                   tasks_per_node=args.tasks_per_node, cpus_per_task=args.cpus_per_task, time=args.time,
                   partition=args.partition, account=args.account, job_name=args.job_name, env=env,
                   container=args.container, secret_env=secret_env, shared_job_dir=args.shared_job_dir,
                   options=job_options({name: getattr(args, name) for name in option_names()}),
                   data_service=data_service)


def _data_service_spec(args: argparse.Namespace):  # -> DataServiceSpec | None
    from hpcvod.jobs.spec import DATA_SERVICE_OPTIONS, data_service_spec

    return data_service_spec({name: getattr(args, name) for name in ("data_service_nodes", *DATA_SERVICE_OPTIONS)},
                             spell=lambda name: f"--{name.replace('_', '-')}")


def _prepare(args: argparse.Namespace, program: list[str], argv: Sequence[str]):
    from hpcvod.machine.host import detect_host
    from hpcvod.jobs.submission import prepare
    from hpcvod.schedulers import profile_options
    from hpcvod.sites.loader import discover_site

    host = detect_host()
    _sbatch_spellings(args)
    site = discover_site(args.site, host.hostname, schedulers=profile_options())
    _short_q(args, site)
    prepared = prepare(_job_spec(args, program), site, host, command=["hpcvod", *argv],
                       job_folder=args.command == "submit")  # render writes the script alone
    gres = _gres_gpus(args.gres)
    if gres and gres[0] is not None and gres[0] != prepared.plan.gpu_type:
        has = f"GPUs of type {prepared.plan.gpu_type}" if prepared.plan.gpu_type else "untyped GPUs (no gpu_type)"
        raise UserError(f"--gres {args.gres}: partition {prepared.plan.partition!r} of site {site.name!r} has {has}")
    return prepared


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


# ---- commands ---------------------------------------------------------------------------------------------


def _site_job_mpi(site) -> tuple[str, str]:
    """`doctor`'s view of submit's MPI check: a job of ``site`` run from here (a .py script, the defaults)."""
    import dataclasses
    import tempfile

    from hpcvod.machine.host import detect_host
    from hpcvod.jobs.plan import resolve
    from hpcvod.jobs.spec import JobSpec

    with tempfile.TemporaryDirectory(prefix="hpcvod-doctor-") as tmp:
        (Path(tmp) / "train.py").write_text("")
        plan = resolve(JobSpec(program="train.py"), site, dataclasses.replace(detect_host(), cwd=tmp))
    from hpcvod.jobs.submission import job_mpi_verdict

    return job_mpi_verdict(plan)


def cmd_submit(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod.jobs.jobdir import DEFAULT_ROOT
    from hpcvod.jobs.submission import refuse_another_mpi, secret_values, submit_prepared
    from hpcvod.jobs.watch import follow_output, progress

    waits = [flag for flag, given in (("--wait", args.wait), ("--follow", args.follow),
                                      ("--show-output", args.show_output)) if given]
    if args.dry_run and waits:
        raise UserError(f"submit: {waits[0]} waits for a job, and --dry-run submits none: give one of them")
    if args.follow and args.show_output:
        raise UserError("submit: --follow prints the output as it comes, --show-output at the end: give one of them")
    prepared = _prepare(args, program, argv)
    secret_values(prepared.plan.secret_env)  # a secret not set here is refused by a dry run too
    from hpcvod.jobs.plan import world_line

    if args.dry_run:
        print(world_line(prepared.plan), file=sys.stderr)  # what -N/-G/--tasks-per-node add up to
        if args.json:
            _print_json({"plan": prepared.plan.to_dict(), "script": prepared.script})
        else:
            sys.stdout.write(prepared.script)
        return EXIT_OK
    with progress(sys.stderr, "checking which MPI the job's Python loads"):
        refuse_another_mpi(prepared.plan)
    with progress(sys.stderr, f"submitting to {prepared.plan.scheduler}"):
        ref = submit_prepared(prepared, Path(args.output_dir or DEFAULT_ROOT),
                              root_option="--output-dir" if args.output_dir else "jobs folder")
    print(world_line(prepared.plan), file=sys.stderr)
    if not args.json:
        print(one_line(f"submitted job {ref.job_id} to site {ref.site} ({ref.scheduler}); folder: {ref.job_dir}"))
        sys.stdout.flush()
    status = None
    if args.wait or args.show_output or args.follow:
        status = _wait(ref, sys.stderr, follow=sys.stdout if args.follow else None,
                       time_limit=prepared.plan.time_seconds)
        if status is None:
            return 130
        if args.show_output:
            follow_output(ref, sys.stdout, follow=False)
    if args.json:
        out = {"job_id": ref.job_id, "job_dir": str(ref.job_dir), "site": ref.site, "scheduler": ref.scheduler}
        if status is not None:
            out.update(state=status.state, exit_code=status.exit_code)
        _print_json(out)
    if status is not None and status.state != "COMPLETED":
        return EXIT_FAILED
    return EXIT_OK


def cmd_render(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    if args.force and not args.output:
        raise UserError("render: --force goes with -o FILE (it allows overwriting FILE)")
    prepared = _prepare(args, program, argv)
    if args.output:
        from hpcvod.jobs.render import write_script

        write_script(Path(args.output), prepared.script, prepared.plan, force=args.force)
        print(f"wrote {args.output} ({prepared.plan.scheduler} script for site {prepared.plan.site})", file=sys.stderr)
    elif args.json:
        _print_json({"plan": prepared.plan.to_dict(), "script": prepared.script})
    else:
        sys.stdout.write(prepared.script)
    return EXIT_OK


def _job_ref(job: str, site_name: str | None = None):
    """A job by folder or recorded id; else an id of the given (or discovered) site's scheduler."""
    from hpcvod.jobs.jobdir import JobRef, find_job

    ref = find_job(job)
    if ref is not None:
        return ref
    if os.sep in job:
        raise UserError(f"JOB {job!r}: no such job folder")
    from hpcvod.machine.host import detect_host
    from hpcvod.schedulers import profile_options, scheduler_for
    from hpcvod.sites.loader import discover_site

    site = discover_site(site_name, detect_host().hostname, schedulers=profile_options())
    scheduler = scheduler_for(site)
    if scheduler.single_host and not job.startswith(scheduler.job_id_prefix):  # its jobs: this machine's only
        raise UserError(f"JOB {job!r}: no job folder records this id under {', '.join(map(str, _roots()))} "
                        "(give the job folder, or run this where you submitted)")
    scheduler.check_job_id(job, "JOB")  # before any scheduler command sees it: "-5" is no option
    return JobRef(job_id=job, scheduler=site.profile.scheduler, site=site.name, site_source=site.source, job_dir=None)


def _roots():
    from hpcvod.jobs.jobdir import default_roots

    return default_roots()


def _wait(ref, stream, follow=None, time_limit=None):  # -> JobStatus | None (None: Ctrl-C)
    """Wait for the job with a live line on a terminal (plain lines otherwise) on stderr, so that stdout keeps
    only results (--json, --show-output, --follow's output); Ctrl-C stops the waiting only, and says how to
    cancel."""
    from hpcvod.jobs.watch import wait_for

    try:
        return wait_for(ref, stream, follow=follow, time_limit=time_limit)
    except KeyboardInterrupt:
        where = ref.job_dir or ref.job_id
        print("\n" + one_line(f"stopped waiting; job {ref.job_id} goes on (hpcvod status {where}; to stop it: "
                                f"hpcvod cancel {where})"), file=sys.stderr)
        return None


def cmd_status(args: argparse.Namespace) -> int:
    from hpcvod.jobs.submission import array_task_states, component_states, job_status

    ref = _job_ref(args.job, args.site)
    if args.wait:
        status = _wait(ref, sys.stderr)
        if status is None:
            return 130
    else:
        status = job_status(ref)
    tasks = array_task_states(ref)
    parts = component_states(ref)
    if args.json:
        _print_json({"job_id": ref.job_id, "state": status.state, "raw": status.raw, "exit_code": status.exit_code,
                     "reason": status.reason, "source": status.source, "site": ref.site, "scheduler": ref.scheduler,
                     "job_dir": str(ref.job_dir) if ref.job_dir else None,
                     # epoch seconds where the scheduler says: started (pending: expected to start), ended
                     "start_time": status.start_time, "end_time": status.end_time,
                     **({"tasks": [{"index": i, "state": t.state, "exit_code": t.exit_code, "raw": t.raw}
                                   for i, t in tasks]} if tasks else {}),
                     **({"components": [{"part": name, "state": c.state, "exit_code": c.exit_code, "raw": c.raw}
                                        for name, c in parts]} if parts else {})})
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
    return EXIT_FAILED if args.wait and status.state != "COMPLETED" else EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    from hpcvod.jobs.submission import job_has_data_service, job_world_size
    from hpcvod.jobs.watch import follow_output, log_files
    from hpcvod.schedulers.base import DATA_SERVICE_LOG

    if args.rank is not None and args.rank < 0:
        raise UserError(f"logs: --rank {args.rank}: expected a rank number >= 0")
    ref = _job_ref(args.job)
    if ref.job_dir is None:
        raise UserError(f"JOB {args.job!r}: logs need the job folder (no folder records this id)")
    size = job_world_size(ref)
    if args.rank is not None and size is not None and args.rank >= size and not job_has_data_service(ref):
        ranks = "rank 0 only" if size == 1 else f"ranks 0-{size - 1}"
        raise UserError(f"logs: --rank {args.rank}: job {ref.job_id} has {ranks}")
    logs = log_files(ref)
    if not args.follow and not logs[0][1].exists():
        print(one_line(f"(no output yet: {ref.output})"), file=sys.stderr)
        return EXIT_OK
    try:
        for index, path in logs:  # an array job: each task's log in turn, under a header
            if index is not None:
                print(one_line(f"==> array task {index}: {path.name} <=="), flush=True)
            follow_output(ref, sys.stdout, follow=args.follow, rank=args.rank, path=path)
        compute_log = ref.job_dir / DATA_SERVICE_LOG  # submit --data-service-nodes: the compute job's own log
        if compute_log.exists():
            print(f"==> tf.data service compute job: {DATA_SERVICE_LOG} <==", flush=True)
            follow_output(ref, sys.stdout, follow=False, rank=args.rank, path=compute_log)
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


def cmd_jobs(args: argparse.Namespace) -> int:
    from hpcvod.jobs.watch import format_rows, job_folders, job_rows

    roots = [Path(d) for d in args.output_dir] if args.output_dir else None
    rows = job_rows(job_folders(roots))
    if args.json:
        _print_json([row.to_dict() for row in rows])
    elif not rows:
        from hpcvod.jobs.jobdir import default_roots

        print(f"(no job folders under {', '.join(map(str, roots or default_roots()))})", file=sys.stderr)
    else:
        print("\n".join(format_rows(rows)))
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    from hpcvod.jobs.submission import cancel_job

    ref = _job_ref(args.job, args.site)
    ended = cancel_job(ref)
    if ended is not None:  # nothing was asked of the scheduler, and the job keeps the end it had
        exit_text = f", exit {ended.exit_code}" if ended.exit_code is not None else ""
        print(one_line(f"job {ref.job_id} already ended ({ended.state}{exit_text}): nothing to cancel"))
        return EXIT_OK
    print(one_line(f"cancel requested for job {ref.job_id} ({ref.scheduler})"))
    return EXIT_OK


def cmd_sites(args: argparse.Namespace) -> int:
    from hpcvod import sites
    from hpcvod.schedulers import profile_options

    schedulers = profile_options()
    if args.sites_command == "schema":
        if args.markdown:
            sys.stdout.write(sites.reference_markdown(schedulers))
        else:
            _print_json(sites.schema(schedulers))
        return EXIT_OK
    if args.sites_command == "list":
        rows = []
        for name, path in sites.site_files().items():
            try:
                site = sites.load_site_file(path, schedulers=schedulers)
                rows.append((name, site.profile.scheduler, str(path), site.profile.description))
            except UserError as err:
                rows.append((name, "INVALID", str(path), str(err)))
        width = max(len(r[0]) for r in rows)
        for name, scheduler, path, text in rows:
            print(f"{name:<{width}}  {scheduler:<7}  {text}  [{path}]")
        return EXIT_OK
    if args.sites_command == "show":
        import yaml

        from hpcvod.sites.spec import to_data

        site = sites.load_site(args.name, schedulers=schedulers)
        print(f"# site {site.name} from {site.source} (after extends and defaults)")
        data = to_data(site.profile)
        data["scheduler_options"] = to_data(site.scheduler_options)
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
        return EXIT_OK
    if args.sites_command == "check":
        from hpcvod.jobs.sitecheck import check_command

        return check_command(args)
    # validate: every problem of every file, one line each (file:line: key: what, expected)
    bad = 0
    for name in args.files:
        try:
            path = sites.site_path(name, "validate")
        except UserError as err:
            print(one_line(str(err)), file=sys.stderr)
            bad += 1
            continue
        if path.name.startswith("_"):
            problems = sites.check_base_file(path, schedulers=schedulers)
            verdict = "ok (a base for extends: checked key by key, required keys not enforced)"
        else:
            site, problems = sites.validate_site_file(path, schedulers=schedulers)
            verdict = f"ok (site {site.name}, scheduler {site.profile.scheduler})" if site else ""
        for problem in problems:
            print(one_line(str(problem)), file=sys.stderr)
        if problems:
            bad += 1
        else:
            print(one_line(f"{name}: {verdict}"))
    return EXIT_USAGE if bad else EXIT_OK


def _flushed(code: int) -> int:
    """``code``, once stdout is flushed inside main(): a reader gone early is seen there (BrokenPipeError)."""
    sys.stdout.flush()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        command = next((w for w in argv if not w.startswith("-")), None)
        program: list[str] = []
        if command in ("submit", "render", "run"):
            sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
            at = argv.index(command)
            options, program = _split_program(sub, argv[at + 1:])
            args = parser.parse_args(argv[:at + 1] + options)
        else:
            args = parser.parse_args(argv)
        if args.command == "submit":
            return cmd_submit(args, program, argv)
        if args.command == "render":
            return cmd_render(args, program, argv)
        if args.command == "status":
            return _flushed(cmd_status(args))
        if args.command == "logs":
            return _flushed(cmd_logs(args))
        if args.command == "cancel":
            return cmd_cancel(args)
        if args.command == "jobs":
            return _flushed(cmd_jobs(args))
        if args.command == "sites":
            return cmd_sites(args)
        if args.command == "run":
            from hpcvod.launchers.run import run_command

            return run_command(args, program)
        if args.command == "timeline":
            from hpcvod.jobs.timeline_summary import summary_command

            return summary_command(args)
        if args.command == "doctor":
            from hpcvod.machine.doctor import doctor
            from hpcvod.schedulers import profile_options
            from hpcvod.sites.loader import discover_site

            return doctor(sys.stdout, lambda hostname: discover_site(args.site, hostname, schedulers=profile_options()),
                          _site_job_mpi)
    except UserError as err:
        print(f"hpcvod: error: {one_line(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `hpcvod jobs | head -1`: the reader has what it wanted; no error, and no message
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return EXIT_OK
    except Exception as err:  # a scheduler command that failed, a full disk...: one line, not a traceback
        from hpcvod.schedulers.base import SchedulerError

        if isinstance(err, (SchedulerError, OSError)) and not os.environ.get("HPCVOD_DEBUG"):
            print(f"hpcvod: {one_line(str(err))}", file=sys.stderr)
            return EXIT_FAILED
        raise
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
