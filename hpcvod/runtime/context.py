"""init() / shutdown(), the world queries, process-set registration, timeline control and job aborts."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import Any, Iterable, Optional, Sequence, Union

from . import gpu
from .config import Settings, settings_disagreement
from .errors import (HpcvodConfigError, HpcvodError, HpcvodInputError, HpcvodNotInitializedError,
                     HpcvodRankFailureError, HpcvodShutdownError, HpcvodStallError, first_of)
from .mpi_flavour import check_mpi_flavour
from .mpi_start import abort_world, arm_abort_hook, deadline, disarm_abort_hook, release, start_mpi
from .process_sets import ProcessSet, global_process_set
from .world import WorldInfo, check_world_size, hostname

EXIT_RANK_FAILURE = 70   # another rank died or failed; this one was aborted
EXIT_STALL = 71          # HPCVOD_STALL_SHUTDOWN_TIME_SECONDS was reached
ABORT_GRACE_SECONDS = 1.0
LEFT_GRACE_SECONDS = 15.0  # a collective still running this long after a member left is stuck for ever


class Runtime:
    """Everything init() sets up; one instance between init() and shutdown()."""

    def __init__(self) -> None:
        self.settings: Settings = Settings()
        self.comm: Any = None
        self.info: Optional[WorldInfo] = None
        self.local_comm: Any = None
        self.cross_comm: Any = None
        self.lanes: dict[int, Any] = {}
        self.sets: dict[int, ProcessSet] = {}
        self.next_set_id = 1
        self.watchdog: Any = None
        self.timeline: Any = None
        self.failed: Optional[str] = None
        self.exit_code = 0
        self.uncaught = False
        self.prev_excepthook: Any = None
        self.lock = threading.Lock()

    @property
    def global_lane(self) -> Any:
        return self.lanes[0]


_rt: Optional[Runtime] = None
_atexit_registered = False
_closed_watchdog: Any = None   # this rank's channel after shutdown(): at exit it hears how the job ended
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


def init(comm: Any = None, process_sets: Optional[Sequence[ProcessSet]] = None) -> None:
    """Initialise the runtime on every rank (collective).

    ``comm``: an mpi4py communicator, or a list of ``MPI.COMM_WORLD`` ranks to run on (only those ranks
    call init); default ``MPI.COMM_WORLD``. ``process_sets``: ProcessSet objects to register at once
    (the same list on every rank). With the default communicator, the world size is checked against
    ``HPCVOD_WORLD_SIZE`` and the launcher's own variables (HpcvodWorldSizeError on a mismatch).
    Calling init() again while initialised does nothing.
    """
    global _closed_watchdog
    if _rt is not None:
        return
    _closed_watchdog = None
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


def _init(MPI: Any, settings: Settings, comm: Any, process_sets: Optional[Sequence[ProcessSet]]) -> None:
    global _rt, _atexit_registered

    from .engine import Lane
    from .timeline import open_timeline
    from .watchdog import Watchdog

    if comm is None:
        base = MPI.COMM_WORLD
    elif isinstance(comm, MPI.Comm):
        base = comm
    else:
        ranks = sorted(int(r) for r in comm)
        base = MPI.COMM_WORLD.Create_group(MPI.COMM_WORLD.Get_group().Incl(ranks))
        if base == MPI.COMM_NULL:
            raise HpcvodInputError(f"hvd.init(comm={ranks}): rank {MPI.COMM_WORLD.Get_rank()} is not in the list")
    rt = Runtime()
    rt.settings = settings
    rt.comm = base.Dup()
    rank, size = rt.comm.Get_rank(), rt.comm.Get_size()
    rt.local_comm = rt.comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = rt.local_comm.Get_rank(), rt.local_comm.Get_size()
    rt.cross_comm = rt.comm.Split(local_rank, rank)
    me = hostname()
    timeline, cannot_open = None, ""
    if settings.timeline:   # opened before the allgather, so that every rank hears when the writing rank cannot
        try:
            timeline = open_timeline(settings.timeline, rank, settings.timeline_mark_cycles)
        except HpcvodInputError as err:
            cannot_open = f"HPCVOD_TIMELINE={settings.timeline!r}: {err}"
    everyone = rt.comm.allgather((me, local_size, settings.shared(), os.getpid(), cannot_open))
    problem = (settings_disagreement([shared for _, _, shared, _, _ in everyone])
               or next((said for *_, said in everyone if said), None))
    if problem:
        if timeline is not None:
            timeline.close()
        raise HpcvodConfigError(problem)
    rt.info = WorldInfo(
        rank=rank, size=size, local_rank=local_rank, local_size=local_size,
        cross_rank=rt.cross_comm.Get_rank(), cross_size=rt.cross_comm.Get_size(),
        is_homogeneous=len({ls for _, ls, _, _, _ in everyone}) == 1, hostname=me,
        thread_level=MPI.Query_thread(), library_version=MPI.Get_library_version())
    gpu.pin(local_rank)      # torch / CuPy / TF, where imported, use GPU local_rank (HPCVOD_PIN_GPU=0: no)
    lane = Lane(rt.comm.Dup(), 0, list(range(size)), settings)
    rt.lanes[0] = lane
    global_process_set._register(0, list(range(size)), rank, lane)
    rt.sets[0] = global_process_set
    if timeline is not None:
        _set_timeline(rt, timeline)
    for ps in process_sets or ():
        _register_set(rt, ps)
    rt.watchdog = Watchdog(rank, size, settings, lambda: _pending_everywhere(rt),
                           lambda set_id: rt.sets[set_id].ranks if set_id in rt.sets else None,
                           lambda reason, kind: _abort_job(rt, reason, kind),
                           lambda who, where, agreed: _peer_left(rt, who, where, agreed))
    warning = rt.watchdog.connect(rt.comm, [(host, pid) for host, _, _, pid, _ in everyone])
    if warning and rank == 0:
        print(warning, file=sys.stderr, flush=True)
    rt.watchdog.start()
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
    busy = False
    for set_id in sorted(rt.lanes, reverse=True):
        lane = rt.lanes[set_id]
        busy = busy or lane._driving
        lane.stop()
    agreed = {set_id: lane.agreed for set_id, lane in rt.lanes.items()}
    if rt.timeline is not None:
        timeline, rt.timeline = rt.timeline, None
        for lane in rt.lanes.values():
            lane.timeline = None
        timeline.close()
    if rt.watchdog is not None:
        _closed_watchdog = rt.watchdog
        rt.watchdog.close(agreed)
    for ps in list(rt.sets.values()):
        if ps is not global_process_set:
            ps._invalidate()
    global_process_set._invalidate()
    if sys.excepthook is _excepthook:
        sys.excepthook = rt.prev_excepthook
    if not busy and rt.failed is None:
        for lane in rt.lanes.values():
            lane.free()
        for c in (rt.local_comm, rt.cross_comm, rt.comm):
            c.Free()


# ----------------------------------------------------------------------------------------- failures
def _pending_everywhere(rt: Runtime) -> list[tuple[int, str, int, float]]:
    out = []
    for set_id, lane in list(rt.lanes.items()):
        for name, kind, age in lane.pending():
            out.append((set_id, name, kind, age))
    return out


def _peer_left(rt: Runtime, who: int, where: str, agreed: dict) -> None:
    """Called by the watchdog when rank ``who`` finished cleanly: collectives of its process sets that it
    never reached fail on this rank (HpcvodShutdownError). A lane still busy LEFT_GRACE_SECONDS later is stuck
    in an MPI call the departed rank will never make: then the job ends, naming it."""
    me = rt.info.rank if rt.info else -1
    busy = []
    for set_id, lane in list(rt.lanes.items()):
        if who not in lane.ranks:
            continue
        lane.peer_left(int(agreed.get(str(set_id), 0)), HpcvodShutdownError(
            f"hpcvod has been shut down: rank {who} ({where}) finished execution (it returned, exited or called "
            f"shutdown()) while rank {me} still had collectives of process set {set_id} to run with it; every "
            f"rank must submit the same collectives"))
        at = lane.busy_at()
        if at is not None:
            busy.append((set_id, lane, at))
    if busy:
        def watch() -> None:
            time.sleep(LEFT_GRACE_SECONDS)
            for set_id, lane, at in busy:
                if lane.busy_at() == at:
                    _abort_job(rt, f"rank {who} ({where}) finished execution while rank {me} was inside a "
                                   f"collective of process set {set_id} that needs it", "failure")
        threading.Thread(target=watch, name="hpcvod-left", daemon=True).start()


def _abort_job(rt: Runtime, reason: str, kind: str) -> None:
    """Called by the watchdog: fail every waiter, then exit non-zero (MPI calls may never return now).
    Inside hvd.elastic.run a failed rank resets the world instead (runtime/elastic.py)."""
    from .elastic import absorbs_failure
    if kind == "failure" and absorbs_failure(rt, reason):
        return
    with rt.lock:
        if rt.failed is not None:
            return
        rt.failed = reason
        rt.exit_code = EXIT_STALL if kind == "stall" else EXIT_RANK_FAILURE
    rank = rt.info.rank if rt.info else -1
    print(f"hpcvod: rank {rank}: aborting the job: {reason}", file=sys.stderr, flush=True)
    exc: HpcvodError = (HpcvodStallError if kind == "stall" else HpcvodRankFailureError)(
        f"rank {rank}: the job is being aborted: {reason}")
    for lane in list(rt.lanes.values()):
        lane.abort(exc)
    time.sleep(ABORT_GRACE_SECONDS)   # let a waiting main thread raise and print its traceback
    _hard_exit(rt.exit_code)


def _hard_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


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
        _hard_exit(rt.exit_code)
    if rt.uncaught:
        # The other ranks are aborting; MPI_Finalize could wait for them forever.
        _hard_exit(1)
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
        _hard_exit(1)
    reason = watchdog.wait_final()
    if reason:
        print(f"hpcvod: rank {watchdog.rank}: this rank had finished, but the job failed: {reason}",
              file=sys.stderr, flush=True)
        _hard_exit(EXIT_RANK_FAILURE)


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
    _set_timeline(rt, open_timeline(file_path, rt.info.rank if rt.info else 0, mark_cycles))


def stop_timeline() -> None:
    """Stop the timeline and complete its JSON file."""
    rt = runtime()
    timeline = rt.timeline
    if timeline is not None:
        _set_timeline(rt, None)
        timeline.close()


def _set_timeline(rt: Runtime, timeline: Any) -> None:
    rt.timeline = timeline
    for lane in list(rt.lanes.values()):
        lane.timeline = timeline


# ------------------------------------------------------------------------------- process sets
def _register_set(rt: Runtime, ps: ProcessSet) -> ProcessSet:
    """Collective over every rank of the job: create the set's communicator and lane."""
    from mpi4py import MPI

    from .errors import HpcvodMismatchError
    ranks = _set_ranks(rt, ps)
    everyone = rt.comm.allgather(ranks)
    if any(other != ranks for other in everyone):
        detail = "; ".join(f"rank {r}: {rs}" for r, rs in enumerate(everyone))
        raise HpcvodMismatchError(f"add_process_set() was called with different ranks: {detail}")
    for other in rt.sets.values():
        if other.ranks == ranks:
            raise HpcvodInputError(f"a process set with ranks {ranks} already exists "
                                   f"(id {other.process_set_id})")
    me = rt.info.rank
    sub = rt.comm.Split(0 if me in ranks else MPI.UNDEFINED, me)
    return _attach_set(rt, ps, ranks, sub)


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a process set (collective: every rank calls it, in the same order, with the same ranks)."""
    rt = runtime()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    return _register_set(rt, ps)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (collective over every rank). Returns False if it was not registered."""
    from .errors import HpcvodMismatchError
    rt = runtime()
    set_id = process_set.process_set_id
    if set_id == 0:
        raise HpcvodInputError("the global process set cannot be removed")
    everyone = rt.comm.allgather(set_id)
    if any(other != set_id for other in everyone):
        raise HpcvodMismatchError(f"remove_process_set() was called for different sets: ids {everyone}")
    if set_id is None or set_id not in rt.sets:
        return False
    lane = rt.lanes.pop(set_id, None)
    if lane is not None:
        lane.stop()
        lane.free()
    del rt.sets[set_id]
    process_set._invalidate()
    return True


def process_set_ids_and_ranks() -> dict[int, list[int]]:
    """Every registered process set's id and global ranks (0: the whole job), as Horovod's basics report them."""
    return {set_id: list(ps.ranks) for set_id, ps in sorted(runtime().sets.items())}


def _attach_set(rt: Runtime, ps: ProcessSet, ranks: list[int], sub: Any) -> ProcessSet:
    from mpi4py import MPI

    from .engine import Lane
    set_id = rt.next_set_id
    rt.next_set_id += 1
    lane = None
    if sub != MPI.COMM_NULL:
        lane = Lane(sub, set_id, ranks, rt.settings, rt.timeline)
        rt.lanes[set_id] = lane
    ps._register(set_id, ranks, rt.info.rank, lane)
    rt.sets[set_id] = ps
    return ps


def _set_ranks(rt: Runtime, ps: Union[ProcessSet, Sequence[int]]) -> list[int]:
    if not isinstance(ps, ProcessSet):
        raise HpcvodInputError(f"expected a ProcessSet, got {ps!r}")
    if ps.process_set_id is not None:
        raise HpcvodInputError(f"{ps!r} is already registered")
    if ps.mpi_comm is not None:
        from mpi4py import MPI
        group = ps.mpi_comm.Get_group() if ps.mpi_comm != MPI.COMM_NULL else MPI.GROUP_EMPTY
        mine = group.Translate_ranks(list(range(group.Get_size())), rt.comm.Get_group()) \
            if group != MPI.GROUP_EMPTY else []
        # every rank must learn the members, including ranks outside the communicator
        all_ranks = sorted({r for part in rt.comm.allgather(list(mine)) for r in part})
        return all_ranks
    ranks = list(ps.ranks)
    size = rt.info.size
    bad = [r for r in ranks if not 0 <= r < size]
    if bad or not ranks:
        raise HpcvodInputError(f"process set ranks {ranks} must be non-empty and within 0..{size - 1}")
    return ranks
