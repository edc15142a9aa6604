"""``hpcvod run``: start N ranks here or on given hosts with the installed MPI's launcher (horovodrun's job).

    hpcvod run -np 4 python train.py
    hpcvod run -np 4 -H node1:2,node2:2 python train.py
    hpcvod run -np 8 --hostfile hosts.txt --fusion-threshold-mb 32 --timeline-filename tl.json train.py

The launch line comes from the same launchers as rendered scripts (hpcvod/launchers), the flavour from the
same detection as the local site (hpcvod/machine/flavour.py); the runtime settings reach every rank as HPCVOD_* variables (docs/contract.md).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, Sequence

from hpcvod import __version__
from hpcvod.cli import run_elastic
from hpcvod.cli.command import Command
from hpcvod.support.errors import UserError
from hpcvod.support.files import read_text_bounded
from hpcvod.support.shell import parse_env, shell_join


# horovodrun's --log-level choices
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
_NO_BAYES = "hpcvod's autotune searches one knob at a time, not by Bayesian optimization (docs/runtime.md)"
_TIMESTAMP = "hpcvod labels each line with its rank and stream, without a timestamp"
# horovodrun's flags hpcvod run does not take -> why, and what to give instead (the nearest of hpcvod run's own
# flags is added to each line: refused_line)
HOROVODRUN_REFUSED = {
    "--autotune-bayes-opt-max-samples": _NO_BAYES, "--autotune-gaussian-process-noise": _NO_BAYES,
    "--gloo-timeout-seconds": "hpcvod runs over MPI, without Gloo; MPI's start-up limit: --start-timeout",
    "--num-nccl-streams": "hpcvod's NCCL operations use one stream per rank",
    "--tcp": "hpcvod does not pick the MPI's transport; choose the interface with --network-interface",
    "--binding-args": "give the MPI launcher's binding options with --mpi-args",
    "--thread-affinity": "hpcvod's background thread is not pinned",
    "--config-file": "give the settings as flags",
    "--jsrun": "hpcvod run starts ranks with mpiexec; another launcher: --mpi-launcher PATH",
    "--hierarchical-allgather": "hpcvod has no hierarchical allgather",
    "--no-hierarchical-allgather": "hpcvod has no hierarchical allgather (none is the default)",
    "--torus-allreduce": "hpcvod has no torus allreduce",
    "--no-torus-allreduce": "hpcvod has no torus allreduce (none is the default)",
    "--mpi-threads-disable": "hpcvod's runtime asks MPI for the thread level it needs",
    "--no-mpi-threads-disable": "hpcvod's runtime asks MPI for the thread level it needs",
    "--log-with-timestamp": _TIMESTAMP, "--log-without-timestamp": _TIMESTAMP, "--log-hide-timestamp": _TIMESTAMP,
    "--no-log-hide-timestamp": _TIMESTAMP, "--prefix-output-with-timestamp": _TIMESTAMP,
    "-prefix-timestamp": _TIMESTAMP,
}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from hpcvod.cli.options import Refused

    p = sub.add_parser("run", help="start ranks on this machine or on given hosts (like horovodrun)",
                       usage="hpcvod run -np N [-H HOSTS | --hostfile FILE] [OPTIONS] COMMAND...",
                       description="horovodrun's flags, with horovodrun's meaning (docs/submission.md, hpcvod run).")
    p.add_argument("-v", "--version", action="version", version=f"hpcvod {__version__}",
                   help="show hpcvod's version and exit (as horovodrun -v)")
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of ranks (required unless --check-build)")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="show which frameworks, controllers and tensor operations hpcvod can use here, and exit")
    p.add_argument("-H", "--hosts", help="hosts and slots, e.g. h1:2,h2:2 (default: this machine)")
    p.add_argument("-hostfile", "--hostfile", help="file with one `host[:slots]` or `host slots=N` per line")
    p.add_argument("--mpi-args", default="", help="extra arguments for the MPI launcher (one string)")
    p.add_argument("--mpi-launcher", dest="launcher", metavar="PATH",
                   help="MPI launcher to use (default: the mpiexec beside this Python); was --mpi PATH before")
    p.add_argument("--mpi", action="store_true", help="run over MPI (always so: accepted as horovodrun takes it)")
    p.add_argument("--gloo", action=Refused, nargs=0, help=argparse.SUPPRESS,
                   instead="hpcvod runs over MPI only (drop --gloo, or give --mpi)")
    p.add_argument("--verbose", action="store_true", help="print the MPI found and the launch command first")
    p.add_argument("--as-horovod", action="store_true", help="for this run only, `import horovod.X` loads hpcvod.X: "
                   "a Horovod script runs with no line changed (refused where horovod is installed)")
    p.add_argument("--env", "-e", action="append", default=[], metavar="KEY=VALUE", help="more environment")
    group = p.add_argument_group("start-up")
    group.add_argument("--start-timeout", type=int, metavar="SECONDS",
                       help="how long each rank's MPI start and init() may take (HPCVOD_INIT_TIMEOUT; 0: no limit)")
    group.add_argument("--output-filename", metavar="DIR", help="also write each rank's output to "
                       "DIR/rank.N/stdout and DIR/rank.N/stderr (N zero-padded, as horovodrun writes them)")
    group.add_argument("--network-interface", "--network-interfaces", dest="nics", action="append", default=[],
                       metavar="NIC[,NIC]", help="network interface(s) MPI and NCCL use between hosts (Open MPI: "
                       "btl_tcp_if_include; MPICH, Intel MPI: mpiexec -iface, one interface)")
    group.add_argument("-p", "--ssh-port", type=int, metavar="PORT", help="ssh port of the other hosts")
    group.add_argument("-i", "--ssh-identity-file", metavar="FILE", help="ssh key for the other hosts")
    group.add_argument("--disable-cache", action="store_true", help="horovodrun: do not cache its start-up "
                       "checks; hpcvod run caches none, so nothing changes (the response cache: --cache-capacity 0)")
    group.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                       help="horovodrun's backend log level: hpcvod's runtime has no levels (it prints warnings "
                       "and errors); accepted, said on stderr, and ignored")
    group = p.add_argument_group("runtime settings (HPCVOD_* variables on every rank, docs/contract.md)")
    group.add_argument("--fusion-threshold-mb", type=float, help="fusion buffer size in MiB (HPCVOD_FUSION_THRESHOLD)")
    group.add_argument("--cycle-time-ms", type=float, help="engine cycle time in ms (HPCVOD_CYCLE_TIME)")
    group.add_argument("--cache-capacity", type=int, help="response cache entries (HPCVOD_CACHE_CAPACITY; 0: off)")
    group.add_argument("--hierarchical-allreduce", action="store_true", default=None,
                       help="HPCVOD_HIERARCHICAL_ALLREDUCE=1")
    group.add_argument("--no-hierarchical-allreduce", dest="hierarchical_allreduce", action="store_false",
                       help="HPCVOD_HIERARCHICAL_ALLREDUCE=0")
    group.add_argument("--timeline-filename", help="write a Chrome-trace timeline here (HPCVOD_TIMELINE)")
    group.add_argument("--timeline-mark-cycles", action="store_true", help="HPCVOD_TIMELINE_MARK_CYCLES=1")
    group.add_argument("--no-timeline-mark-cycles", dest="timeline_mark_cycles", action="store_false",
                       help="the default")
    group.add_argument("--stall-check-warning-time-seconds", type=int, help="HPCVOD_STALL_CHECK_TIME_SECONDS")
    group.add_argument("--stall-check-shutdown-time-seconds", type=int, help="HPCVOD_STALL_SHUTDOWN_TIME_SECONDS")
    group.add_argument("--no-stall-check", action="store_true", help="HPCVOD_STALL_CHECK_DISABLE=1")
    group.add_argument("--stall-check", dest="no_stall_check", action="store_false", help="the default")
    group.add_argument("--autotune", action="store_true", help="tune fusion, cycle time, cache and hierarchical "
                       "allreduce while training (HPCVOD_AUTOTUNE=1)")
    group.add_argument("--no-autotune", dest="autotune", action="store_false", help="the default")
    group.add_argument("--autotune-log-file", help="rank 0 logs each autotune trial here (HPCVOD_AUTOTUNE_LOG)")
    group.add_argument("--autotune-warmup-samples", type=int, help="HPCVOD_AUTOTUNE_WARMUP_SAMPLES")
    group.add_argument("--autotune-steps-per-sample", type=int, help="HPCVOD_AUTOTUNE_STEPS_PER_SAMPLE")
    run_elastic.add_arguments(p)
    own = [flag for action in p._actions for flag in action.option_strings]  # argparse has no public API for it
    for flag, why in HOROVODRUN_REFUSED.items():
        p.add_argument(flag, action=Refused, nargs=0 if flag in _SWITCHES else "?", help=argparse.SUPPRESS,
                       instead=refused_line(flag, why, own))
    return p


# horovodrun's refused flags that take no value (the others swallow one, as in horovodrun, before the refusal)
_SWITCHES = {"--tcp", "--jsrun", "--hierarchical-allgather", "--no-hierarchical-allgather",
             "--torus-allreduce", "--no-torus-allreduce", "--mpi-threads-disable", "--no-mpi-threads-disable",
             "--log-with-timestamp", "--log-without-timestamp", "--log-hide-timestamp", "--no-log-hide-timestamp",
             "--prefix-output-with-timestamp", "-prefix-timestamp"}


def refused_line(flag: str, why: str, own: list[str]) -> str:
    """A horovodrun flag's refusal: why, and what to give instead: named in ``why``, else the nearest of hpcvod
    run's own flags by spelling (difflib), if one is near."""
    import difflib

    if "--" in why:   # the equivalent is named already
        return f"horovodrun's flag; {why}"
    nearest = difflib.get_close_matches(flag, own, n=1, cutoff=0.7)
    return f"horovodrun's flag; {why}" + (f"; the nearest of hpcvod run: {nearest[0]}" if nearest else "")


_HOST = re.compile(r"[A-Za-z0-9_.-]+")
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def rank_python(program: list[str]) -> list[str]:
    """The program the ranks run: a .py script under this Python; ``python ...`` under this Python too when the
    ``python`` on PATH cannot import hpcvod (a system Python outside the venv), said in one line on stderr,
    instead of an ImportError on every rank."""
    if program[0].endswith(".py"):
        return [sys.executable, *program]
    if not _PYTHON.fullmatch(program[0]):
        return program
    found = shutil.which(program[0])
    if found and os.path.realpath(found) == os.path.realpath(sys.executable):
        return program
    if found:
        try:
            probe = subprocess.run([found, "-c", "import hpcvod"], capture_output=True, timeout=60)
            if probe.returncode == 0:
                return program
        except (OSError, subprocess.TimeoutExpired):
            pass
    print(f"hpcvod run: {program[0]!r} on PATH ({found or 'none'}) cannot import hpcvod: the ranks use "
          f"{sys.executable}", file=sys.stderr)
    return [sys.executable, *program[1:]]


_SLOTS = re.compile(r"[0-9]{1,7}")   # ASCII digits only: int() would also take '²' or '١'
HOSTFILE_LIMIT = 1 << 20            # one line per host: far more than any cluster's hosts


def _slots(text: str) -> int:
    """A host's slot count: a positive whole number (``0``, ``00`` and ``-1`` are not)."""
    if not _SLOTS.fullmatch(text) or int(text) < 1:
        raise ValueError(text)
    return int(text)


def parse_hosts(text: str, origin: str = "-H") -> list[tuple[str, int]]:
    """``h1:2,h2:2`` (or ``h1,h2``: one slot each) -> [(host, slots)]."""
    hosts = []
    for item in text.split(","):
        name, colon, slots = item.strip().partition(":")
        try:
            if not _HOST.fullmatch(name):
                raise ValueError(name)
            hosts.append((name, _slots(slots) if colon else 1))
        except ValueError:
            raise UserError(f"{origin} {text!r}: expected host[:slots],... like node1:2,node2:2 "
                            f"(slots a whole number from 1)") from None
    return hosts


def parse_hostfile(path: str) -> list[tuple[str, int]]:
    """Lines ``host``, ``host:N`` or ``host slots=N`` (Open MPI's form); '#' starts a comment. A regular file of
    at most HOSTFILE_LIMIT bytes: a FIFO would block, /dev/zero would never end."""
    try:
        lines = read_text_bounded(Path(path), HOSTFILE_LIMIT, "the --hostfile").splitlines()
    except FileNotFoundError:
        raise UserError(f"--hostfile {path!r}: cannot read it (no such file)") from None
    hosts = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?::([0-9]+)|\s+slots\s*=\s*([0-9]+))?(\s+max_slots\s*=\s*[0-9]+)?",
                             line, re.ASCII)
        try:
            if not match:
                raise ValueError(line)
            slots = match.group(2) or match.group(3)
            hosts.append((match.group(1), _slots(slots) if slots is not None else 1))
        except ValueError:
            raise UserError(f"{path}:{number}: expected `host`, `host:N` or `host slots=N` (N from 1), "
                            f"got {raw.strip()[:80]!r}") from None
    if not hosts:
        raise UserError(f"--hostfile {path!r}: no hosts in it")
    return hosts


def runtime_settings(args: argparse.Namespace) -> dict[str, str]:
    """horovodrun's tuning flags as the HPCVOD_* variables the runtime reads (docs/contract.md), within the
    bounds the runtime itself checks at init() (hpcvod/runtime/config.py): a value it would refuse on every rank
    is refused here, naming the option."""
    from hpcvod.runtime import config   # the runtime's own bounds; imported only by `hpcvod run`

    def bounded(option: str, value: float, setting: config.Setting, unit: str, scale: float = 1) -> float:
        bounds = setting.bounds
        low, high = bounds.low / scale, bounds.high / scale
        if not low <= value <= high:   # NaN and the infinities fail here too
            raise UserError(f"{option} {config.figure(value)}: expected {unit} from {config.figure(low)} to "
                            f"{config.figure(high)}")
        return value

    mib = 1024 * 1024
    out = {}
    if args.fusion_threshold_mb is not None:
        size = bounded("--fusion-threshold-mb", args.fusion_threshold_mb, config.FUSION_THRESHOLD, "a size in MiB",
                       mib)
        out["HPCVOD_FUSION_THRESHOLD"] = str(int(size * mib))
    if args.cycle_time_ms is not None:
        cycle = bounded("--cycle-time-ms", args.cycle_time_ms, config.CYCLE_TIME, "a time in ms")
        out["HPCVOD_CYCLE_TIME"] = f"{cycle:g}"
    if args.cache_capacity is not None:
        out["HPCVOD_CACHE_CAPACITY"] = str(bounded("--cache-capacity", args.cache_capacity, config.CACHE_CAPACITY,
                                                   "a number of entries"))
    if args.timeline_filename:
        out["HPCVOD_TIMELINE"] = str(Path(args.timeline_filename).absolute())
    if args.stall_check_warning_time_seconds is not None:
        out["HPCVOD_STALL_CHECK_TIME_SECONDS"] = str(bounded(
            "--stall-check-warning-time-seconds", args.stall_check_warning_time_seconds, config.STALL_CHECK_TIME,
            "a time in seconds"))
    if args.stall_check_shutdown_time_seconds is not None:
        out["HPCVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(bounded(
            "--stall-check-shutdown-time-seconds", args.stall_check_shutdown_time_seconds,
            config.STALL_SHUTDOWN_TIME, "a time in seconds"))
    if args.hierarchical_allreduce is not None:
        out["HPCVOD_HIERARCHICAL_ALLREDUCE"] = "1" if args.hierarchical_allreduce else "0"
    if args.timeline_mark_cycles:
        out["HPCVOD_TIMELINE_MARK_CYCLES"] = "1"
    if args.no_stall_check:
        out["HPCVOD_STALL_CHECK_DISABLE"] = "1"
    if args.autotune:
        out["HPCVOD_AUTOTUNE"] = "1"
    if args.autotune_log_file:
        out["HPCVOD_AUTOTUNE_LOG"] = str(Path(args.autotune_log_file).absolute())
    if args.autotune_warmup_samples is not None:
        out["HPCVOD_AUTOTUNE_WARMUP_SAMPLES"] = str(bounded(
            "--autotune-warmup-samples", args.autotune_warmup_samples, config.AUTOTUNE_WARMUP_SAMPLES, "samples"))
    if args.autotune_steps_per_sample is not None:
        out["HPCVOD_AUTOTUNE_STEPS_PER_SAMPLE"] = str(bounded(
            "--autotune-steps-per-sample", args.autotune_steps_per_sample, config.AUTOTUNE_STEPS_PER_SAMPLE,
            "steps"))
    if args.start_timeout is not None:
        out["HPCVOD_INIT_TIMEOUT"] = str(bounded("--start-timeout", args.start_timeout, config.INIT_TIMEOUT,
                                                 "a time in seconds"))
    return out


_NIC = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")


def network_settings(nics: list[str], flavour: str) -> tuple[dict[str, str], list[str]]:
    """--network-interface as the MPI flavour takes it: (variables for every rank, words for mpiexec). Open MPI's
    TCP transport takes a list (btl_tcp_if_include); Hydra (MPICH, Intel MPI) one interface (-iface), as
    horovodrun passes them; NCCL's sockets the same list (NCCL_SOCKET_IFNAME)."""
    names = [name.strip() for item in nics for name in item.split(",") if name.strip()]
    if not names:
        return {}, []
    for name in names:
        if not _NIC.fullmatch(name):
            raise UserError(f"--network-interface {name!r}: expected an interface name like eth0 or ib0")
    env = {"NCCL_SOCKET_IFNAME": ",".join(names)}
    if flavour == "openmpi":
        return {**env, "OMPI_MCA_btl_tcp_if_include": ",".join(names)}, []
    if len(names) > 1:
        raise UserError(f"--network-interface {','.join(names)}: {flavour}'s mpiexec takes one interface (-iface)")
    return env, ["-iface", names[0]]


def ssh_settings(port: int | None, identity: str | None, flavour: str) -> dict[str, str]:
    """-p/--ssh-port and -i/--ssh-identity-file for the ssh that mpiexec starts on the other hosts, in the
    variable each launcher reads: Open MPI 5's PRRTE (plm_ssh_args; Open MPI 4: plm_rsh_args), MPICH's Hydra
    (HYDRA_LAUNCHER_EXTRA_ARGS), Intel MPI's Hydra (I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS)."""
    words = []
    if port is not None:
        if not 1 <= port <= 65535:
            raise UserError(f"--ssh-port {port}: expected a port from 1 to 65535")
        words += ["-p", str(port)]
    if identity is not None:
        if not Path(identity).is_file():
            raise UserError(f"--ssh-identity-file {identity!r}: no such file")
        words += ["-i", str(Path(identity).absolute())]
    if not words:
        return {}
    joined = shell_join(words)
    if flavour == "openmpi":
        return {"PRTE_MCA_plm_ssh_args": joined, "OMPI_MCA_plm_rsh_args": joined}
    if flavour == "intelmpi":
        return {"I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": joined}
    return {"HYDRA_LAUNCHER_EXTRA_ARGS": joined}


def check_build(out: IO[str], verbose: bool) -> int:
    """horovodrun --check-build's table for hpcvod: the frameworks importable here, the controllers and tensor
    operations hpcvod can use (MPI: a launcher and mpi4py; NCCL: CuPy's NCCL with a GPU), each probed in its own
    process (hpcvod doctor's probes). Exit 0."""
    from hpcvod.machine.doctor import run_probes
    from hpcvod.machine.flavour import MpiNotFound, detect_mpi

    try:
        found = detect_mpi()
        mpi_text, mpi_found = f"{found.launcher}: {found.flavour} ({found.evidence})", True
    except MpiNotFound as err:
        mpi_text, mpi_found = str(err), False
    probes = run_probes(dict(os.environ))
    mpi = mpi_found and probes["mpi4py"][0]

    def box(ok: bool) -> str:
        return "[X]" if ok else "[ ]"

    out.write(f"hpcvod v{__version__}:\n\nAvailable Frameworks:\n"
              f"    {box(probes['tensorflow'][0])} TensorFlow\n    {box(probes['torch'][0])} PyTorch\n"
              f"    {box(probes['mxnet'][0])} MXNet\n\nAvailable Controllers:\n    {box(mpi)} MPI\n"
              f"    {box(False)} Gloo\n\nAvailable Tensor Operations:\n    {box(probes['NCCL (CuPy)'][0])} NCCL\n"
              f"    {box(False)} DDL\n    {box(False)} CCL\n    {box(mpi)} MPI\n    {box(False)} Gloo\n")
    if verbose:
        out.write(f"\nMPI launcher: {mpi_text}\n" + "".join(f"{name}: {text}\n" for name, (_, text) in probes.items()))
    return 0


def _write_hostfile(hosts: list[tuple[str, int]], flavour: str, folder: str) -> str:
    path = Path(folder) / "hostfile"
    if flavour == "openmpi":
        path.write_text("".join(f"{host} slots={slots}\n" for host, slots in hosts))
    else:  # Hydra machine file (MPICH, Intel MPI)
        path.write_text("".join(f"{host}:{slots}\n" for host, slots in hosts))
    return str(path)


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod.launchers import LaunchRequest, label_argv, launcher_for, without_outer_launch
    from hpcvod.machine.flavour import MpiNotFound, detect_mpi

    if args.check_build:
        return check_build(sys.stdout, args.verbose)
    if args.np is None and not run_elastic.is_elastic(args):
        raise UserError("run: the following arguments are required: -np/--num-proc (see hpcvod run --help)")
    if not program:
        raise UserError("missing COMMAND: hpcvod run -np N [OPTIONS] COMMAND [ARGS...]")
    if args.mpi and re.fullmatch(r"(mpiexec|mpirun)(\.\w+)?", Path(program[0]).name):
        raise UserError(f"--mpi {program[0]}: --mpi is a switch now, as in horovodrun; to choose the launcher give "
                        f"--mpi-launcher {program[0]}")
    if args.np is not None and args.np < 1:
        raise UserError(f"-np {args.np}: expected a positive number of ranks")
    if not run_elastic.is_elastic(args):
        run_elastic.elastic_flags_without_elastic(args)
    if args.hosts and args.hostfile:
        raise UserError("-H and --hostfile: give one of them")
    hosts = parse_hosts(args.hosts) if args.hosts else parse_hostfile(args.hostfile) if args.hostfile else None
    if hosts is not None and args.np is not None and sum(s for _, s in hosts) < args.np:
        raise UserError(f"-np {args.np}: the hosts offer only {sum(s for _, s in hosts)} slots "
                        f"({', '.join(f'{h}:{s}' for h, s in hosts)})")
    try:
        mpi = detect_mpi(args.launcher)
    except MpiNotFound as err:
        raise UserError(str(err)) from None
    network_env, network_args = network_settings(args.nics, mpi.flavour)
    program = rank_python(program)
    if args.log_level:
        print(f"hpcvod run: --log-level {args.log_level}: hpcvod's runtime has no log levels (it prints warnings "
              "and errors); ignored", file=sys.stderr)

    # the ranks check the MPI they load against the launcher's (docs/contract.md)
    settings = {"HPCVOD_WORLD_SIZE": str(args.np), "HPCVOD_MPI_FLAVOUR": mpi.flavour, **runtime_settings(args),
                **network_env, **dict(parse_env(args.env))}
    if args.as_horovod:   # the ranks' PYTHONPATH starts with hpcvod/as_horovod/site (its sitecustomize)
        from hpcvod.as_horovod import ranks_environment
        settings.update(ranks_environment({**os.environ, **settings}))
    launcher_env = ssh_settings(args.ssh_port, args.ssh_identity_file, mpi.flavour)  # mpiexec's, not the ranks'
    env = without_outer_launch(os.environ)
    env.update(settings)
    env.update(launcher_env)
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    try:
        extra = shlex.split(args.mpi_args)
    except ValueError as err:
        raise UserError(f"--mpi-args {args.mpi_args!r}: {err}") from None
    with tempfile.TemporaryDirectory(prefix="hpcvod-run-") as tmp:
        if run_elastic.is_elastic(args):
            return run_elastic.run(args, hosts, mpi, program, env, network_args + extra, tmp)
        request = LaunchRequest(
            executable=mpi.launcher, world_size=args.np, nodes=len(hosts) if hosts else 1, tasks_per_node=0,
            hostfile=_write_hostfile(hosts, mpi.flavour, tmp) if hosts else None, single_host=hosts is None,
            forward_env=list(settings), is_root=is_root, extra_args=network_args + extra)
        line = launcher_for("mpiexec", mpi.flavour).line(request)
        env.update(line.env)
        if hosts is None and mpi.flavour == "openmpi":
            # one machine: shared memory only; Open MPI starts ~1 s faster than when it probes UCX (docs/measured.md)
            env.setdefault("OMPI_MCA_pml", "ob1")
            env.setdefault("OMPI_MCA_btl", "self,sm")
        output_dir = str(Path(args.output_filename).absolute()) if args.output_filename else None
        if output_dir:
            os.makedirs(output_dir, mode=0o700, exist_ok=True)
        argv = list(line.argv) + label_argv(sys.executable, output_dir, args.np) + program
        if args.verbose:
            shown = " ".join(f"{k}={v}" for k, v in {**settings, **launcher_env, **line.env}.items())
            print(f"hpcvod run: {mpi.flavour} ({mpi.evidence})\nhpcvod run: {shown} {shell_join(argv)}",
                  file=sys.stderr)
        try:
            return subprocess.run(argv, env=env).returncode
        except FileNotFoundError:
            raise UserError(f"{argv[0]}: cannot run it") from None
        except KeyboardInterrupt:
            return 130


COMMAND = Command("run", add_parser, run, takes_program=True)
