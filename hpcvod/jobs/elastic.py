"""``submit --min-nodes M`` (docs/elastic.md, "Batch jobs"): a job whose allocation outlives a failed node, whose
ranks there are dropped while training goes on (``hvd.elastic.run``) with at least M nodes.

What it takes, measured on the Slurm sandbox (2 nodes, Open MPI 5.0.11 / PRRTE 3.0.11, Slurm 22.05):

* ``#SBATCH --no-kill``: Slurm keeps the job when a node of it goes down (without it the whole job ends), and
  ``--no-kill`` for the ``srun`` step that mpirun starts its daemons with (``--prtemca plm_slurm_args --no-kill``;
  PRTE_MCA_plm_slurm_args in the environment does not reach it): without it Slurm kills that step when the node
  is set DOWN, and mpirun then ends every rank, with exit status 0.
  PBS Pro / OpenPBS have the same request, ``-W tolerate_node_failures=all`` (rendered, untested: no PBS server
  runs here).
* the ranks started by Open MPI's own ``mpirun --with-ft ulfm`` inside the allocation. Under ``srun --mpi=pmix``
  the first failure a surviving rank reports (ULFM's PMIx event) makes Slurm's pmix plugin kill the whole step.
* ``OMPI_MCA_async_mpi_finalize=1``: without it the survivors' MPI_Finalize waits for ever on a fence with the
  ranks that died on the other node.

Where the MPI has no ULFM (MPICH, Intel MPI), the script runs an elastic driver (launchers/elastic_batch.py) that
restarts the world on the nodes left, from the commit each node keeps on local storage: Slurm with srun only.
Where the scheduler has no such request (Grid Engine), it is refused in one line saying why. The ranks learn the minimum and where to record each world through the
environment (docs/contract.md), read by hpcvod/runtime/elastic_job.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcvod.support.errors import UserError

EVENTS_FILE = "elastic-events.jsonl"   # in the job folder: one JSON line per world (HPCVOD_ELASTIC_EVENTS)
EVENTS_ENV = "HPCVOD_ELASTIC_EVENTS"
MIN_NODES_ENV = "HPCVOD_ELASTIC_MIN_NODES"
LAUNCHER_ARGS = ("--with-ft", "ulfm")
ENV = {"OMPI_MCA_async_mpi_finalize": "1"}   # see the module's docstring

# The request that keeps a job running when one of its nodes fails: Slurm's --no-kill; PBS Pro's and OpenPBS's
# job attribute tolerate_node_failures (OpenPBS design PP-928: "all" tolerates sister nodes lost while it runs).
DIRECTIVES = {"slurm": ("--no-kill",), "pbs": ("-W tolerate_node_failures=all",)}
SCHEDULER_LAUNCHER_ARGS = {"slurm": ("--prtemca", "plm_slurm_args", "--no-kill")}   # see the module's docstring
# Why a scheduler without one cannot keep a job through a lost node.
REFUSALS = {
    "sge": "Grid Engine ends a parallel job when one of its hosts goes down (qsub has no request like Slurm's "
           "--no-kill or PBS's tolerate_node_failures)",
    "local": "the local site runs every rank on this machine: there is no node to lose",
}


@dataclass(frozen=True)
class ElasticRequest:
    """What --min-nodes adds to a plan: the launcher's words, the ranks' environment, the scheduler's directive."""

    min_nodes: int
    launcher_args: tuple[str, ...]
    env: dict[str, str]
    directives: tuple[str, ...]
    restart: bool = False   # no ULFM (MPICH, Intel MPI): the script runs launchers/elastic_batch.py's driver


def elastic_request(min_nodes: int | None, nodes: int, site: str, scheduler: str, flavour: str, launcher: str,
                    launcher_kind: str, data_service: bool) -> ElasticRequest | None:
    """The additions for ``submit --min-nodes``, or one UserError line saying why this job cannot have it."""
    if min_nodes is None:
        return None
    flag = f"--min-nodes {min_nodes!r}"
    if isinstance(min_nodes, bool) or not isinstance(min_nodes, int) or min_nodes < 1:
        raise UserError(f"{flag}: expected a whole number of nodes from 1 to --nodes ({nodes})")
    if min_nodes > nodes:
        raise UserError(f"{flag}: more than the job's --nodes {nodes}; expected 1 to {nodes}")
    if scheduler not in DIRECTIVES:
        why = REFUSALS.get(scheduler, f"the {scheduler} scheduler has no request that keeps a job through a lost node")
        raise UserError(f"{flag}: site {site!r}: {why}; elastic batch jobs need Slurm or PBS (docs/elastic.md)")
    if data_service:
        raise UserError(f"{flag}: not with --data-service-nodes (a compute job beside an elastic training is not "
                        "supported)")
    if flavour != "openmpi" or launcher == "srun":
        # no ULFM (MPICH, Intel MPI), or Open MPI under srun, whose pmix plugin ends the step at the first failure:
        # the job restarts its world on the nodes left (launchers/elastic_batch.py)
        if scheduler != "slurm" or launcher != "srun":
            raise UserError(f"{flag}: site {site!r} runs {flavour}, which has no ULFM; its elastic batch jobs restart "
                            f"the world with srun inside a Slurm allocation, and this site "
                            + (f"uses {scheduler}" if scheduler != "slurm" else f"starts ranks with {launcher_kind}")
                            + " (docs/elastic.md)")
        return ElasticRequest(min_nodes, (), {MIN_NODES_ENV: str(min_nodes)}, DIRECTIVES[scheduler], restart=True)
    if launcher != "openmpi":
        raise UserError(f"{flag}: site {site!r} starts Open MPI's ranks with {launcher_kind}; an elastic job needs "
                        "Open MPI's mpirun (launcher.kind: mpirun) or srun (docs/elastic.md)")
    return ElasticRequest(min_nodes, (*LAUNCHER_ARGS, *SCHEDULER_LAUNCHER_ARGS.get(scheduler, ())),
                          {**ENV, MIN_NODES_ENV: str(min_nodes)}, DIRECTIVES[scheduler])


@dataclass(frozen=True)
class World:
    """One world of an elastic job, as its rank 0 recorded it: at the start (reset 0) or after a reset."""

    time: float
    reset: int
    size: int
    nodes: tuple[str, ...]


def job_worlds(job_dir: Path | None) -> list[World]:
    """The worlds of the job's latest run, oldest first ([] without a job folder or an events file). A line that
    is not a whole record (one being written, a damaged file) is skipped: status only reports."""
    from hpcvod.schedulers.jobfiles import read_job_text

    if job_dir is None or not (job_dir / EVENTS_FILE).exists():
        return []
    text = read_job_text(job_dir / EVENTS_FILE, 4 << 20, "elastic events file")
    worlds: list[World] = []
    for line in text.splitlines():
        record = _record(line)
        if record is None:
            continue
        if record.reset == 0:   # a requeued run starts again: only the latest run's worlds
            worlds = []
        worlds.append(record)
    return worlds


def _record(line: str) -> World | None:
    try:
        data: Any = json.loads(line)
        nodes = data["nodes"]
        if not (isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)):
            return None
        return World(float(data["time"]), int(data["reset"]), int(data["size"]), tuple(nodes))
    except (ValueError, TypeError, KeyError):
        return None


def job_min_nodes(job_dir: Path | None) -> int | None:
    """The --min-nodes the job folder's request.json records (None: not an elastic job, or no folder)."""
    from hpcvod.jobs.jobdir import REQUEST_FILE
    from hpcvod.schedulers.jobfiles import read_json

    if job_dir is None:
        return None
    plan = read_json(job_dir / REQUEST_FILE).get("plan")
    value = plan.get("min_nodes") if isinstance(plan, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def status_lines(min_nodes: int, worlds: list[World]) -> list[str]:
    """`hpcvod status`'s lines for an elastic job: the current world, then the first one and each reset."""
    def world(w: World) -> str:
        nodes = f"{len(w.nodes)} node{'s' if len(w.nodes) != 1 else ''}"
        return f"{w.size} rank{'s' if w.size != 1 else ''} on {nodes} ({', '.join(w.nodes)})"

    if not worlds:
        return [f"  elastic (--min-nodes {min_nodes}): no world recorded yet"]
    resets = len(worlds) - 1
    lines = [f"  elastic (--min-nodes {min_nodes}): world {world(worlds[-1])}, after {resets} "
             f"reset{'s' if resets != 1 else ''}"]
    for w in worlds:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w.time))
        lines.append(f"    {'start' if w.reset == 0 else f'reset {w.reset}'}  {when}  {world(w)}")
    return lines
