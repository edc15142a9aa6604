"""What several ``hpcvod`` commands share: the parser class, the job options of submit and render (and their
sbatch spellings), the split of argv into options and the program, and the job a command names."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import IO, TYPE_CHECKING, Sequence

from hpcvod.support.errors import UserError, one_line

if TYPE_CHECKING:
    from hpcvod.jobs.jobdir import JobRef
    from hpcvod.jobs.spec import DataServiceSpec, JobSpec
    from hpcvod.jobs.submission import Prepared
    from hpcvod.schedulers.base import JobStatus

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Parser(argparse.ArgumentParser):
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


class Refused(argparse.Action):
    """An option of sbatch (or horovodrun) that hpcvod does not take: one line naming what to give instead."""

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


def add_job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--site", help="site profile name or path (default: $HPCVOD_SITE, hostname patterns, local)")
    p.add_argument("--nodes", "-N", type=int, help="number of nodes (default 1)")
    p.add_argument("--min-nodes", type=int, metavar="M", help="elastic (hvd.elastic.run): the job survives a failed "
                   "node and trains on while M nodes are left (Slurm or PBS, Open MPI's mpirun; docs/elastic.md)")
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
        p.add_argument(spelling, dest=None, action=Refused, nargs="?", help=argparse.SUPPRESS, instead=instead)
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


# ---- argv splitting: options, then SCRIPT, then the script's own arguments ------------------------------


def split_program(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """Options end at ``--`` or at the first word that is not an option or an option's value; everything from
    there on belongs to the program, untouched (so `train.py --nodes 3` passes --nodes to train.py)."""
    takes_value = {}
    for action in parser._actions:  # argparse has no public API for this
        for flag in action.option_strings:
            # how many words follow the flag: nargs=2 (--blacklist-cooldown-range MIN MAX) takes two
            takes_value[flag] = action.nargs if isinstance(action.nargs, int) else 1 if action.nargs != 0 else 0
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1:]
        if not word.startswith("-") or word == "-":
            return argv[:i], argv[i:]
        flag = word.split("=", 1)[0]
        if takes_value.get(flag) and "=" not in word and not (len(flag) == 2 and len(word) > 2):
            i += takes_value[flag]  # the option's value(s)
        i += 1
    return argv, []


def _job_spec(args: argparse.Namespace, program: list[str]) -> JobSpec:
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
                   data_service=data_service, min_nodes=args.min_nodes)


def _data_service_spec(args: argparse.Namespace) -> DataServiceSpec | None:
    from hpcvod.jobs.spec import DATA_SERVICE_OPTIONS, data_service_spec

    return data_service_spec({name: getattr(args, name) for name in ("data_service_nodes", *DATA_SERVICE_OPTIONS)},
                             spell=lambda name: f"--{name.replace('_', '-')}")


def prepare_job(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> Prepared:
    """submit's and render's job: the site found, sbatch's spellings turned into hpcvod's options, the plan and
    the script."""
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


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def job_ref(job: str, site_name: str | None = None) -> JobRef:
    """A job by folder or recorded id; else an id of the given (or discovered) site's scheduler."""
    from hpcvod.jobs.jobdir import JobRef, default_roots, find_job

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
        raise UserError(f"JOB {job!r}: no job folder records this id under {', '.join(map(str, default_roots()))} "
                        "(give the job folder, or run this where you submitted)")
    scheduler.check_job_id(job, "JOB")  # before any scheduler command sees it: "-5" is no option
    return JobRef(job_id=job, scheduler=site.profile.scheduler, site=site.name, site_source=site.source, job_dir=None)


def wait_for_job(ref: JobRef, stream: IO[str], follow: IO[str] | None = None,
                 time_limit: float | None = None) -> JobStatus | None:
    """Wait for the job with a live line on a terminal (plain lines otherwise) on stderr, so that stdout keeps
    only results (--json, --show-output, --follow's output); Ctrl-C stops the waiting only (None), and says how
    to cancel."""
    from hpcvod.jobs.watch import wait_for

    try:
        return wait_for(ref, stream, follow=follow, time_limit=time_limit)
    except KeyboardInterrupt:
        where = ref.job_dir or ref.job_id
        print("\n" + one_line(f"stopped waiting; job {ref.job_id} goes on (hpcvod status {where}; to stop it: "
                                f"hpcvod cancel {where})"), file=sys.stderr)
        return None
