"""``hpcvod run``'s elastic flags, horovodrun's (``--min-np``, ``--max-np``, ``--host-discovery-script``,
``--slots-per-host``, ``--elastic-timeout``, ``--reset-limit``, ``--blacklist-cooldown-range``), and the step from
them to the elastic driver (hpcvod/launchers/elastic_driver.py). As in horovodrun, ``--host-discovery-script`` or
``--min-np`` makes the job elastic. Open MPI's worlds shrink and grow in place (ULFM); MPICH's and Intel MPI's
are restarted at each reset from the commit the hosts keep on node-local storage (docs/elastic.md)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from hpcvod.support.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("elastic (horovodrun's; docs/elastic.md)")
    group.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N",
                       help="fewest ranks training goes on with (default: -np); below it, training waits for "
                            "hosts, at most --elastic-timeout")
    group.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N",
                       help="most ranks (default: as many as the hosts have slots)")
    group.add_argument("--host-discovery-script", metavar="SCRIPT",
                       help="prints the usable hosts, one `host` or `host:slots` a line; run every second")
    group.add_argument("--slots-per-host", dest="slots_per_host", type=int, metavar="N",
                       help="slots of a discovered host without `:slots` (default 1)")
    group.add_argument("--elastic-timeout", type=float, metavar="SECONDS",
                       help="how long fewer than --min-np slots may last (default 600; HOROVOD_ELASTIC_TIMEOUT)")
    group.add_argument("--reset-limit", type=int, metavar="N", help="end the job at the reset after N resets")
    group.add_argument("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2,
                       metavar=("MIN", "MAX"), help="seconds a failed host stays blacklisted (default: for good)")


def is_elastic(args: argparse.Namespace) -> bool:
    return args.host_discovery_script is not None or args.min_np is not None


def elastic_flags_without_elastic(args: argparse.Namespace) -> None:
    """An elastic-only flag without --min-np or --host-discovery-script: one line, as it would do nothing."""
    for flag, value in (("--max-np", args.max_np), ("--slots-per-host", args.slots_per_host),
                        ("--elastic-timeout", args.elastic_timeout), ("--reset-limit", args.reset_limit),
                        ("--blacklist-cooldown-range", args.cooldown_range)):
        if value is not None:
            raise UserError(f"{flag}: only for an elastic job; give --min-np or --host-discovery-script too")


def run(args: argparse.Namespace, hosts: list[tuple[str, int]] | None, mpi: Any, program: list[str],
        env: dict[str, str], extra_args: list[str], folder: str) -> int:
    """Check the elastic flags (one line each) and run the job under the elastic driver."""
    from hpcvod.launchers import elastic_driver as driver

    if args.slots_per_host is not None and args.slots_per_host < 1:
        raise UserError(f"--slots-per-host {args.slots_per_host}: expected a number of slots from 1")
    if args.host_discovery_script:
        if hosts is not None:
            raise UserError("--host-discovery-script and -H/--hostfile: give one of them")
        script = args.host_discovery_script
        if not (os.path.isfile(script.split()[0]) and os.access(script.split()[0], os.X_OK)):
            raise UserError(f"--host-discovery-script {script!r}: not an executable file")
        source = driver.script_hosts(script, args.slots_per_host or 1)
    elif hosts is not None:
        source = driver.fixed_hosts(hosts)
    else:
        source = driver.fixed_hosts([("localhost", args.np or args.min_np)])
    timeout = args.elastic_timeout
    if timeout is None:
        timeout = driver.elastic_timeout_from(os.environ)
    min_np = args.min_np if args.min_np is not None else args.np
    if min_np is None:
        raise UserError("elastic hpcvod run: give -np or --min-np")
    settings = driver.ElasticSettings(
        min_np=min_np, max_np=args.max_np, start_np=args.np, elastic_timeout=timeout, reset_limit=args.reset_limit,
        cooldown_range=tuple(args.cooldown_range) if args.cooldown_range else None)
    driver.check_settings(settings)
    env = {name: value for name, value in env.items() if name != "HPCVOD_WORLD_SIZE"}   # the size changes
    if mpi.flavour == "openmpi":   # ULFM: the world shrinks in place and grows by MPI_Comm_spawn
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        start = driver.openmpi_world(mpi.launcher, extra_args, is_root, folder)
        return driver.run_elastic(source, settings, program, start, env)
    # MPICH, Intel MPI: no ULFM; each reset starts a new world that resumes from node-local commits
    return driver.run_elastic(source, settings, program, driver.hydra_world(mpi.launcher, extra_args), env,
                              restart=True)
