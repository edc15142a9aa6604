"""An elastic batch job whose MPI has no ULFM (``submit --min-nodes`` with MPICH or Intel MPI under Slurm,
docs/elastic.md "Batch jobs"): the job script runs this driver in place of the launch line::

    python -m hpcvod.launchers.elastic_batch --nodes N --min-nodes M --tasks-per-node T -- SRUN_LINE... -- PROGRAM...

It is hpcvod run's elastic driver restarting worlds (elastic_driver.run_elastic(restart=True)) with:

* **the hosts**: the job's nodes (``scontrol show hostnames $SLURM_JOB_NODELIST``) that Slurm reports neither down,
  drained, failing nor not responding (``sinfo``), T slots each; asked every few seconds, so a node whose ranks
  died is offered again once Slurm sees it healthy and its blacklisting has cooled down (``--blacklist-cooldown-range``,
  default 60-600 s, ``HPCVOD_ELASTIC_COOLDOWN_RANGE="MIN MAX"``): the world grows back;
* **each world**: the rendered ``srun`` line, narrowed to the world's nodes (``--nodes``, ``--nodelist``,
  ``--ntasks``, ``--ntasks-per-node``, later on the line than the rendered ones, which srun lets win), with
  ``--no-kill`` (the step outlives a failed node) and ``--kill-on-bad-exit=0`` (srun leaves the other ranks to
  the runtime, which ends them with an error after telling the driver who died).

The minimum is M nodes' slots; a world needs at least that many to start (``--elastic-timeout``, default 600 s,
``HOROVOD_ELASTIC_TIMEOUT``). Never imported by the runtime.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from hpcvod.launchers import elastic_driver as driver
from hpcvod.support.errors import UserError

DEFAULT_COOLDOWN = (60, 600)
UNHEALTHY = ("down", "drain", "fail", "maint", "unk", "no_respond", "power")   # sinfo %T words, lower case


def slurm_hosts(slots: int) -> driver.HostSource:
    """The job's nodes that Slurm reports healthy, each with ``slots``."""
    def discover() -> driver.HostSlots:
        nodelist = os.environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise UserError("elastic batch job: SLURM_JOB_NODELIST is not set (this runs inside a Slurm job)")
        names = _run(["scontrol", "show", "hostnames", nodelist]).split()
        states: dict[str, str] = {}
        for line in _run(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N %T"]).splitlines():
            node, _, state = line.strip().partition(" ")
            states[node] = (states.get(node, "") + " " + state.lower()).strip()   # one line per partition
        return [(name, slots) for name in names
                if name in states and not any(word in states[name] for word in UNHEALTHY) and "*" not in states[name]]
    return discover


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=driver.DISCOVERY_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"elastic batch job: {argv[0]}: {exc}") from None
    if done.returncode != 0:
        raise UserError(f"elastic batch job: {' '.join(argv[:3])}: exit status {done.returncode}: "
                        f"{done.stderr.strip()[-200:]}")
    return done.stdout


def srun_world(base: list[str], tasks_per_node: int) -> driver.WorldStarter:
    """Each world: the rendered srun line narrowed to the world's hosts (see the module's docstring)."""
    def start(hosts: driver.HostSlots, np: int, env: dict[str, str]) -> subprocess.Popen:
        argv = [*base, f"--nodes={len(hosts)}", f"--nodelist={','.join(host for host, _ in hosts)}",
                f"--ntasks={np}", f"--ntasks-per-node={tasks_per_node}", "--no-kill", "--kill-on-bad-exit=0",
                *driver.rank_argv(env)]
        return subprocess.Popen(argv, env={**env, "HPCVOD_WORLD_SIZE": str(np)})
    return start


def _cooldown(text: str | None) -> tuple[int, int]:
    if not text:
        return DEFAULT_COOLDOWN
    words = text.split()
    if len(words) != 2 or not all(word.isdigit() for word in words):
        raise UserError(f"HPCVOD_ELASTIC_COOLDOWN_RANGE={text!r}: expected two numbers of seconds, `MIN MAX`")
    return int(words[0]), int(words[1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcvod.launchers.elastic_batch")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--min-nodes", type=int, required=True)
    parser.add_argument("--tasks-per-node", type=int, required=True)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if "--" not in rest or not rest[:rest.index("--")] or rest.index("--") == len(rest) - 1:
        parser.error("expected -- SRUN_LINE... -- PROGRAM...")
    split = rest.index("--")
    base, program = rest[:split], rest[split + 1:]
    try:
        settings = driver.ElasticSettings(
            min_np=args.min_nodes * args.tasks_per_node, max_np=args.nodes * args.tasks_per_node,
            elastic_timeout=driver.elastic_timeout_from(os.environ),
            cooldown_range=_cooldown(os.environ.get("HPCVOD_ELASTIC_COOLDOWN_RANGE")), discovery_interval=5.0)
        env = {name: value for name, value in os.environ.items() if name != "HPCVOD_WORLD_SIZE"}
        return driver.run_elastic(slurm_hosts(args.tasks_per_node), settings, program,
                                  srun_world(base, args.tasks_per_node), env, restart=True)
    except UserError as err:
        print(f"hpcvod: {err}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
