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
from typing import Any, Sequence

from hpcvod.cli.command import Command
from hpcvod.support.errors import UserError
from hpcvod.support.files import read_text_bounded
from hpcvod.support.shell import parse_env, shell_join


def add_parser(sub: Any) -> argparse.ArgumentParser:
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
    return p


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
    if args.hierarchical_allreduce:
        out["HPCVOD_HIERARCHICAL_ALLREDUCE"] = "1"
    return out


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

    if not program:
        raise UserError("missing COMMAND: hpcvod run -np N [OPTIONS] COMMAND [ARGS...]")
    if args.np < 1:
        raise UserError(f"-np {args.np}: expected a positive number of ranks")
    if args.hosts and args.hostfile:
        raise UserError("-H and --hostfile: give one of them")
    hosts = parse_hosts(args.hosts) if args.hosts else parse_hostfile(args.hostfile) if args.hostfile else None
    if hosts is not None and sum(s for _, s in hosts) < args.np:
        raise UserError(f"-np {args.np}: the hosts offer only {sum(s for _, s in hosts)} slots "
                        f"({', '.join(f'{h}:{s}' for h, s in hosts)})")
    try:
        mpi = detect_mpi(args.launcher)
    except MpiNotFound as err:
        raise UserError(str(err)) from None
    program = rank_python(program)

    # the ranks check the MPI they load against the launcher's (docs/contract.md)
    settings = {"HPCVOD_WORLD_SIZE": str(args.np), "HPCVOD_MPI_FLAVOUR": mpi.flavour, **runtime_settings(args),
                **dict(parse_env(args.env))}
    env = without_outer_launch(os.environ)
    env.update(settings)
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    try:
        extra = shlex.split(args.mpi_args)
    except ValueError as err:
        raise UserError(f"--mpi-args {args.mpi_args!r}: {err}") from None
    with tempfile.TemporaryDirectory(prefix="hpcvod-run-") as tmp:
        request = LaunchRequest(
            executable=mpi.launcher, world_size=args.np, nodes=len(hosts) if hosts else 1, tasks_per_node=0,
            hostfile=_write_hostfile(hosts, mpi.flavour, tmp) if hosts else None, single_host=hosts is None,
            forward_env=list(settings), is_root=is_root, extra_args=extra)
        line = launcher_for("mpiexec", mpi.flavour).line(request)
        env.update(line.env)
        if hosts is None and mpi.flavour == "openmpi":
            # one machine: shared memory only; Open MPI starts ~1 s faster than when it probes UCX (docs/measured.md)
            env.setdefault("OMPI_MCA_pml", "ob1")
            env.setdefault("OMPI_MCA_btl", "self,sm")
        argv = list(line.argv) + label_argv(sys.executable) + program
        if args.verbose:
            shown = " ".join(f"{k}={v}" for k, v in {**settings, **line.env}.items())
            print(f"hpcvod run: {mpi.flavour} ({mpi.evidence})\nhpcvod run: {shown} {shell_join(argv)}",
                  file=sys.stderr)
        try:
            return subprocess.run(argv, env=env).returncode
        except FileNotFoundError:
            raise UserError(f"{argv[0]}: cannot run it") from None
        except KeyboardInterrupt:
            return 130


COMMAND = Command("run", add_parser, run, takes_program=True)
