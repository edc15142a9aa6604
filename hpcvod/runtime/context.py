"""init() / shutdown() of the one live world (session.Runtime), the world queries, process-set registration,
timeline control and what happens at exit."""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any, Iterable, Sequence

from . import gpu
from .config import Settings
from .errors import (HpcvodConfigError, HpcvodError, HpcvodInputError, HpcvodNotInitializedError,
                     first_of)
from .mpi_flavour import check_mpi_flavour
from .mpi_start import abort_world, arm_abort_hook, deadline, disarm_abort_hook, release, start_mpi
from .process_sets import ProcessSet
from .session import EXIT_RANK_FAILURE, Runtime, hard_exit
from .world import WorldInfo, check_world_size, hostname

_hard_exit = hard_exit   # the name runtime/elastic.py uses

_rt: Runtime | None = None
_atexit_registered = False
_closed_watchdog: Any = None   # this rank's channel after shutdown(): at exit (or the next init) it hears how the
                               # job ended
arm_abort_hook()  # an MPI the user started before init() is covered too; it does nothing while MPI is not up


def runtime() -> Runtime:
    """The live runtime, or HpcvodNotInitializedError."""
    rt = _rt
    if rt is None:
        raise HpcvodNotInitializedError("hpcvod has not been initialized; use hvd.init().")
    return rt


def is_initialized() -> bool:
    """Whether init() has been called (and shutdown() not since)."""
    return _rt is not None


def init(comm: Any = None, process_sets: Sequence[ProcessSet] | None = None) -> None:
    """Initialise the runtime on every rank (collective).

    ``comm``: an mpi4py communicator, or a list of ``MPI.COMM_WORLD`` ranks to run on (only those ranks
    call init); default ``MPI.COMM_WORLD``. ``process_sets``: ProcessSet objects to register at once
    (the same list on every rank). With the default communicator, the world size is checked against
    ``HPCVOD_WORLD_SIZE`` and the launcher's own variables (HpcvodWorldSizeError on a mismatch).
    Calling init() again while initialised does nothing; after shutdown() it builds a new world (over the same
    or another communicator), once the previous one has ended on every rank.
    """
    if _rt is not None:
        return
    _end_previous_world()
    try:
        settings = Settings.from_env()
    except HpcvodConfigError:
        # join the MPI world anyway, so that this error ends the whole job (the abort hook) instead of leaving
        # the other ranks in MPI_Init until their deadline
        start_mpi(Settings().init_timeout_seconds)
        raise
    MPI = start_mpi(settings.init_timeout_seconds)
    arm_abort_hook()   # again: the script may have replaced sys.excepthook since hpcvod was imported
    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        raise HpcvodError(
            "hpcvod needs MPI_THREAD_SERIALIZED or higher (its engine calls MPI from a background thread); "
            "do not lower mpi4py.rc.thread_level")
    check_mpi_flavour(MPI.Get_library_version())  # the MPI the script promised (HPCVOD_MPI_FLAVOUR)
    if comm is None and os.environ.get("HPCVOD_ELASTIC_JOIN"):   # spawned into a running elastic job
        from .elastic_link import join_running_world
        comm = join_running_world(MPI)
    if comm is None:
        check_world_size(MPI.COMM_WORLD.Get_size(), MPI.Get_library_version())
        # polled from Python under its own limits, so init()'s deadline below starts once every rank is here
        # (a rank that came late to init() must not use up the others' deadline)
        _wait_for_every_rank(MPI, MPI.COMM_WORLD, settings.init_timeout_seconds / 2)
    # init()'s own collectives wait for every rank: one that exits, stops or hangs in init() would leave the
    # others here for ever
    guard = deadline(settings.init_timeout_seconds, (
        f"hpcvod: rank {MPI.COMM_WORLD.Get_rank()} on {hostname()}: hvd.init() has not completed after "
        f"{settings.init_timeout_seconds:g} s, so this rank stops: some rank never reached init() or stopped "
        f"in it (it exited, was stopped, or hangs in it; its own output may say why); "
        f"HPCVOD_INIT_TIMEOUT sets the limit, 0 waits for ever"))
    try:
        _init(MPI, settings, comm, process_sets)
    finally:
        release(guard)


ARRIVAL_TAG = 31517   # init()'s "I am here" messages to rank 0 (point-to-point on COMM_WORLD)
HEARD_TAG = 31518     # rank 0's "I am here too, and counting" answer to each rank that arrived
ARRIVAL_GRACE_SECONDS = 5.0


def _wait_for_every_rank(MPI: Any, world: Any, timeout: float) -> None:
    """init()'s first step, polled from Python (a blocking collective would hold the GIL in C): every rank
    tells rank 0 it arrived, then a non-blocking barrier. A rank that exited, died, was stopped or hangs before
    init() never arrives: ``timeout`` seconds after its own arrival, rank 0 names it and ends the whole job
    (MPI_Abort, which launchers carry out on every rank, a stopped one included). Rank 0 answers each rank
    that arrives, and the others give it ``timeout`` and a grace from that answer (from their own arrival while
    no answer came, rank 0 being perhaps the one missing): a rank 0 that came late is not overtaken."""
    rank, size = world.Get_rank(), world.Get_size()
    if size == 1:
        return
    flags = bytearray(size)
    answers: dict[int, Any] = {}   # rank -> rank 0's send of its answer
    if rank == 0:
        arrivals = [world.Irecv([memoryview(flags)[r:r + 1], MPI.BYTE], source=r, tag=ARRIVAL_TAG)
                    for r in range(1, size)]
    else:
        arrivals = [world.Isend([b"\x01", MPI.BYTE], dest=0, tag=ARRIVAL_TAG),
                    world.Irecv([memoryview(flags)[0:1], MPI.BYTE], source=0, tag=HEARD_TAG)]

    def answer(ranks: Iterable[int]) -> None:   # only ranks that arrived: they are alive to receive it
        for r in ranks:
            if r not in answers:
                answers[r] = world.Isend([b"\x01", MPI.BYTE], dest=r, tag=HEARD_TAG)

    def limit_from_now() -> float:
        return time.monotonic() + timeout if timeout > 0 else float("inf")

    barrier = world.Ibarrier()
    limit = limit_from_now()
    heard = False
    pause = 0.0001
    while not barrier.Test():
        if rank == 0:
            answer(i + 1 for i in (MPI.Request.Testsome(arrivals) or ()))
        elif not heard and arrivals[1].Test():
            heard = True   # rank 0 is here: it ends the job itself within ``timeout`` from now if a rank is missing
            limit = limit_from_now()
        late = time.monotonic() - limit
        if rank == 0 and late > 0:
            MPI.Request.Testall(arrivals)
            missing = [r for r in range(1, size) if not flags[r]]
            abort_world(world, f"hpcvod: rank 0 on {hostname()}: rank(s) {first_of([str(r) for r in missing], 20)} of "
                               f"{size} never reached hvd.init() within {timeout:g} s (they exited, died, were stopped "
                               f"or hang before it; their own output may say why); ending the whole job (MPI_Abort)")
        elif late > ARRIVAL_GRACE_SECONDS and heard:   # rank 0 came, then neither finished nor named anyone
            abort_world(world, f"hpcvod: rank {rank} on {hostname()}: rank 0 reached hvd.init() but has neither "
                               f"seen every rank nor named the missing ones within {timeout + ARRIVAL_GRACE_SECONDS:g} "
                               f"s (it may have stopped or died since); ending the whole job (MPI_Abort)")
        elif late > ARRIVAL_GRACE_SECONDS:   # rank 0, which names the missing ranks, is itself gone
            abort_world(world, f"hpcvod: rank {rank} on {hostname()}: not every rank reached hvd.init() within "
                               f"{timeout + ARRIVAL_GRACE_SECONDS:g} s, and rank 0 did not say which (it may be the "
                               f"one missing); ending the whole job (MPI_Abort)")
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
    MPI.Request.Waitall(arrivals)
    if rank == 0:
        answer(range(1, size))   # every rank is here (the barrier): those not answered yet get theirs now
    MPI.Request.Waitall(list(answers.values()))


def _init(MPI: Any, settings: Settings, comm: Any, process_sets: Sequence[ProcessSet] | None) -> None:
    global _rt, _atexit_registered

    made = None   # the communicator of a list of ranks, made here
    if comm is None:
        base = MPI.COMM_WORLD
    elif isinstance(comm, MPI.Comm):
        base = comm
    else:
        ranks = sorted(int(r) for r in comm)
        world = MPI.COMM_WORLD.Get_group()
        group = world.Incl(ranks)
        base = made = MPI.COMM_WORLD.Create_group(group)
        group.Free()
        world.Free()
        if base == MPI.COMM_NULL:
            raise HpcvodInputError(f"hvd.init(comm={ranks}): rank {MPI.COMM_WORLD.Get_rank()} is not in the list")
    rt = Runtime(settings)
    try:
        rt.build(MPI, base, process_sets)
    finally:
        if made is not None:
            made.Free()     # the world made its own duplicate
    disarm_abort_hook()
    rt.prev_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    _rt = rt
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True


def shutdown() -> None:
    """Shut the runtime down on this rank; operations still pending fail with HpcvodShutdownError."""
    global _rt, _closed_watchdog
    rt = _rt
    if rt is None:
        return
    _rt = None
    _closed_watchdog = rt.watchdog   # first: a shutdown cut short is told from a finished one at exit
    rt.shutdown()
    if sys.excepthook is _excepthook:
        sys.excepthook = rt.prev_excepthook


def _end_previous_world() -> None:
    """Before a new world: the previous one's channel waits for rank 0's last word (bounded by the heartbeat
    timeout when rank 0 is gone), then its thread and sockets go. How that world ended does not stop the new
    one: after a failure the survivors build the next world (runtime/elastic.py)."""
    global _closed_watchdog
    watchdog, _closed_watchdog = _closed_watchdog, None
    if watchdog is not None:
        watchdog.finish()


# ------------------------------------------------------------------------------------------- exit
def _excepthook(etype: Any, value: Any, tb: Any) -> None:
    rt = _rt
    if rt is not None and rt.failed is None:
        rt.uncaught = True
        if rt.watchdog is not None:
            rt.watchdog.report_failure(f"uncaught {etype.__name__}: {value}")
    hook = rt.prev_excepthook if rt is not None and rt.prev_excepthook else sys.__excepthook__
    hook(etype, value, tb)


def _at_exit() -> None:
    rt = _rt
    if rt is None:
        _exit_after_shutdown()
        return
    if rt.failed is not None:
        hard_exit(rt.exit_code)
    if rt.uncaught:
        # The other ranks are aborting; MPI_Finalize could wait for them forever.
        hard_exit(1)
    shutdown()
    _exit_after_shutdown()


def _exit_after_shutdown() -> None:
    """This rank finished cleanly. If the job failed meanwhile, MPI_Finalize (next, in mpi4py's exit hook)
    would wait for ranks that are gone: leave without it, non-zero."""
    watchdog = _closed_watchdog
    if watchdog is None:
        return
    if not watchdog.closed:   # shutdown() was cut short (an exception or exit inside it)
        watchdog.report_failure("it exited in the middle of hvd.shutdown()")
        hard_exit(1)
    reason = watchdog.wait_final()
    if reason:
        print(f"hpcvod: rank {watchdog.rank}: this rank had finished, but the job failed: {reason}",
              file=sys.stderr, flush=True)
        hard_exit(EXIT_RANK_FAILURE)


# ---------------------------------------------------------------------------------- world queries
def _info() -> WorldInfo:
    info = runtime().info
    assert info is not None
    return info


def size() -> int:
    """Number of ranks in the job."""
    return _info().size


def rank() -> int:
    """This process's rank, 0 .. size()-1."""
    return _info().rank


def local_size() -> int:
    """Number of ranks on this node (from a shared-memory split)."""
    return _info().local_size


def local_rank() -> int:
    """This process's rank on its node (use it to pick a GPU)."""
    return _info().local_rank


def cross_size() -> int:
    """Number of nodes that have a rank with this local rank."""
    return _info().cross_size


def cross_rank() -> int:
    """This node's index among the ranks with the same local rank."""
    return _info().cross_rank


def is_homogeneous() -> bool:
    """True when every node runs the same number of ranks."""
    return _info().is_homogeneous


def mpi_threads_supported() -> bool:
    """True when MPI provides MPI_THREAD_MULTIPLE."""
    from mpi4py import MPI
    return _info().thread_level >= MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    """True: MPI carries every host collective (and the negotiation of device ones)."""
    return True


def mpi_built() -> bool:
    """True when mpi4py is installed."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def nccl_built() -> bool:
    """Whether device collectives can run over NCCL here (CuPy with NCCL, and a visible GPU)."""
    return gpu.nccl_available()


def gloo_enabled() -> bool:
    """False: hpcvod has no Gloo controller."""
    return False


def gloo_built() -> bool:
    """False: hpcvod has no Gloo controller."""
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    """Whether CuPy can see a GPU here (device buffers are accepted either way)."""
    return gpu.device_count() > 0


def rocm_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


# ----------------------------------------------------------------------------------- timeline
def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline to ``file_path`` (rank 0; ``{rank}`` in the path: every rank)."""
    from .timeline import open_timeline
    rt = runtime()
    stop_timeline()
    rt.set_timeline(open_timeline(file_path, rt.info.rank if rt.info else 0, mark_cycles))


def stop_timeline() -> None:
    """Stop the timeline and complete its JSON file."""
    rt = runtime()
    timeline = rt.timeline
    if timeline is not None:
        rt.set_timeline(None)
        timeline.close()


# ------------------------------------------------------------------------------- process sets
def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (collective: every rank calls it, in the same order, with the same ranks)."""
    rt = runtime()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    return rt.register_set(ps)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (collective over every rank). Returns False if it was not registered."""
    return runtime().remove_set(process_set)


def process_set_ids_and_ranks() -> dict[int, list[int]]:
    """Every registered process set's id and global ranks (0: the whole job), as Horovod's basics report them."""
    return {set_id: list(ps.ranks) for set_id, ps in sorted(runtime().sets.items())}
