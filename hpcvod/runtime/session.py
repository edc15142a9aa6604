"""The world object: everything one ``hvd.init()`` builds, and ``shutdown()`` empties again.

A :class:`Runtime` owns the communicators it made, one engine lane per process set this rank belongs to
(engine.py), the timeline and the watchdog channel (watchdog.py). ``build`` makes them over a base
communicator; ``shutdown`` stops the lanes, closes the timeline and the channel and frees every communicator,
so that the next ``hvd.init()`` builds a new world in the same process, over the same or a new communicator
(docs/runtime.md, "The engine's parts"). context.py keeps the one live instance.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, Sequence

from . import gpu
from .autotune import autotune_log, make_autotuner
from .config import Settings, settings_disagreement
from .errors import (HpcvodConfigError, HpcvodError, HpcvodInputError, HpcvodMismatchError,
                     HpcvodRankFailureError, HpcvodShutdownError, HpcvodStallError)
from .process_sets import ProcessSet, global_process_set
from .world import WorldInfo, hostname

EXIT_RANK_FAILURE = 70   # another rank died or failed; this one was aborted
EXIT_STALL = 71          # HPCVOD_STALL_SHUTDOWN_TIME_SECONDS was reached
ABORT_GRACE_SECONDS = 1.0
LEFT_GRACE_SECONDS = 15.0  # a collective still running this long after a member left is stuck for ever



# Functions (runtime, reason) -> bool that may take a rank's failure over instead of ending the job; the elastic
# module adds its own when it is imported, so that this room never imports the one above it.
FAILURE_ABSORBERS: list[Callable[["Runtime", str], bool]] = []

class Runtime:
    """Everything init() sets up; one instance between init() and shutdown()."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings: Settings = settings if settings is not None else Settings()
        self.comm: Any = None
        self.info: WorldInfo | None = None
        self.local_comm: Any = None
        self.cross_comm: Any = None
        self.lanes: dict[int, Any] = {}
        self.sets: dict[int, ProcessSet] = {}
        self.next_set_id = 1
        self.watchdog: Any = None
        self.timeline: Any = None
        self.failed: str | None = None
        self.exit_code = 0
        self.uncaught = False
        self.prev_excepthook: Any = None
        self.lock = threading.Lock()
        self._closed = threading.Event()         # set by shutdown(): the watch of a departed rank ends
        self._watches: list[threading.Thread] = []

    @property
    def global_lane(self) -> Any:
        return self.lanes[0]

    # ------------------------------------------------------------------------------------- building
    def build(self, MPI: Any, base: Any, process_sets: Sequence[ProcessSet] | None) -> None:
        """Collective over ``base``: the communicators, the global lane, the timeline, the registered process
        sets and the watchdog channel (started)."""
        from .engine import Lane
        from .timeline import open_timeline
        from .watchdog import Watchdog

        settings = self.settings
        self.comm = base.Dup()
        rank, size = self.comm.Get_rank(), self.comm.Get_size()
        self.local_comm = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        local_rank, local_size = self.local_comm.Get_rank(), self.local_comm.Get_size()
        self.cross_comm = self.comm.Split(local_rank, rank)
        me = hostname()
        timeline, cannot_open = None, ""
        if settings.timeline:   # opened before the allgather, so that every rank hears when the writing rank cannot
            try:
                timeline = open_timeline(settings.timeline, rank, settings.timeline_mark_cycles)
            except HpcvodInputError as err:
                cannot_open = f"HPCVOD_TIMELINE={settings.timeline!r}: {err}"
        tune_log = None
        if settings.autotune and settings.autotune_log and rank == 0 and not cannot_open:
            tune_log, cannot_open = autotune_log(settings.autotune_log)
        everyone = self.comm.allgather((me, local_size, settings.shared(), os.getpid(), cannot_open))
        problem = (settings_disagreement([shared for _, _, shared, _, _ in everyone])
                   or next((said for *_, said in everyone if said), None))
        if problem:
            if timeline is not None:
                timeline.close()
            if tune_log is not None:
                tune_log.close()
            raise HpcvodConfigError(problem)
        self.info = WorldInfo(
            rank=rank, size=size, local_rank=local_rank, local_size=local_size,
            cross_rank=self.cross_comm.Get_rank(), cross_size=self.cross_comm.Get_size(),
            is_homogeneous=len({ls for _, ls, _, _, _ in everyone}) == 1, hostname=me,
            thread_level=MPI.Query_thread(), library_version=MPI.Get_library_version())
        gpu.pin(local_rank)      # torch / CuPy / TF, where imported, use GPU local_rank (HPCVOD_PIN_GPU=0: no)
        lane = Lane(self.comm.Dup(), 0, list(range(size)), settings)
        self.lanes[0] = lane
        if settings.autotune and rank == 0:
            lane.tuner = make_autotuner(settings, len({host for host, _, _, _, _ in everyone}) > 1, tune_log)
        global_process_set._register(0, list(range(size)), rank, lane)
        self.sets[0] = global_process_set
        if timeline is not None:
            self.set_timeline(timeline)
        for ps in process_sets or ():
            self.register_set(ps)
        self.watchdog = Watchdog(rank, size, settings, self.pending_everywhere,
                                 lambda set_id: self.sets[set_id].ranks if set_id in self.sets else None,
                                 self.abort_job, self.peer_left)
        warning = self.watchdog.connect(self.comm, [(host, pid) for host, _, _, pid, _ in everyone])
        if warning and rank == 0:
            print(warning, file=sys.stderr, flush=True)
        self.watchdog.start()

    # ------------------------------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Stop every lane (pending operations fail with HpcvodShutdownError), close the timeline, say goodbye
        on the channel, unregister the process sets and free the communicators. A lane still inside an MPI
        call, or a failed job, keeps its communicators: freeing them could wait for ranks that are gone."""
        busy = False
        for set_id in sorted(self.lanes, reverse=True):
            lane = self.lanes[set_id]
            busy = busy or lane._driving
            lane.stop()
        self._closed.set()
        for thread in list(self._watches):
            if thread is not threading.current_thread():
                thread.join()
        agreed = {set_id: lane.agreed for set_id, lane in self.lanes.items()}
        if self.timeline is not None:
            timeline = self.timeline
            self.set_timeline(None)
            timeline.close()
        if self.watchdog is not None:
            if self.failed is not None:   # an elastic reset: the others must see a failure, not a rank that finished
                self.watchdog.report_world_failed(self.failed)
            self.watchdog.close(agreed)
        for ps in list(self.sets.values()):
            if ps is not global_process_set:
                ps._invalidate()
        global_process_set._invalidate()
        if not busy and self.failed is None:
            for lane in self.lanes.values():
                lane.free()
            for c in (self.local_comm, self.cross_comm, self.comm):
                c.Free()

    def mpi_handles(self) -> list[Any]:
        """The MPI communicators and requests this world still holds (none after a clean shutdown())."""
        from mpi4py import MPI
        held = [c for c in (self.comm, self.local_comm, self.cross_comm) if c is not None and c != MPI.COMM_NULL]
        for lane in self.lanes.values():
            held += lane.mpi_handles()
        return held

    # ------------------------------------------------------------------------------------- failures
    def pending_everywhere(self) -> list[tuple[int, str, int, float]]:
        """(set_id, name, kind, age) of every collective this rank waits on (for the stall inspector)."""
        out = []
        for set_id, lane in list(self.lanes.items()):
            for name, kind, age in lane.pending():
                out.append((set_id, name, kind, age))
        return out

    def peer_left(self, who: int, where: str, agreed: dict) -> None:
        """Called by the watchdog when rank ``who`` finished cleanly: collectives of its process sets that it
        never reached fail on this rank (HpcvodShutdownError). A lane still busy LEFT_GRACE_SECONDS later is
        stuck in an MPI call the departed rank will never make: then the job ends, naming it."""
        me = self.info.rank if self.info else -1
        busy = []
        for set_id, lane in list(self.lanes.items()):
            if who not in lane.ranks:
                continue
            lane.peer_left(int(agreed.get(str(set_id), 0)), HpcvodShutdownError(
                f"hpcvod has been shut down: rank {who} ({where}) finished execution (it returned, exited or "
                f"called shutdown()) while rank {me} still had collectives of process set {set_id} to run with "
                f"it; every rank must submit the same collectives"))
            at = lane.busy_at()
            if at is not None:
                busy.append((set_id, lane, at))
        if busy:
            def watch() -> None:
                if self._closed.wait(LEFT_GRACE_SECONDS):
                    return
                for set_id, lane, at in busy:
                    if lane.busy_at() == at:
                        self.abort_job(f"rank {who} ({where}) finished execution while rank {me} was inside a "
                                       f"collective of process set {set_id} that needs it", "failure")
            thread = threading.Thread(target=watch, name="hpcvod-left", daemon=True)
            thread.start()
            self._watches.append(thread)

    def abort_job(self, reason: str, kind: str) -> None:
        """Called by the watchdog: fail every waiter, then exit non-zero (MPI calls may never return now).
        Inside hvd.elastic.run a failed rank resets the world instead (runtime/elastic.py adds its absorber)."""
        if kind == "failure" and any(absorbs(self, reason) for absorbs in FAILURE_ABSORBERS):
            return
        with self.lock:
            if self.failed is not None:
                return
            self.failed = reason
            self.exit_code = EXIT_STALL if kind == "stall" else EXIT_RANK_FAILURE
        rank = self.info.rank if self.info else -1
        print(f"hpcvod: rank {rank}: aborting the job: {reason}", file=sys.stderr, flush=True)
        exc: HpcvodError = (HpcvodStallError if kind == "stall" else HpcvodRankFailureError)(
            f"rank {rank}: the job is being aborted: {reason}")
        for lane in list(self.lanes.values()):
            lane.abort(exc)
        time.sleep(ABORT_GRACE_SECONDS)   # let a waiting main thread raise and print its traceback
        hard_exit(self.exit_code)

    # ------------------------------------------------------------------------------------- timeline
    def set_timeline(self, timeline: Any) -> None:
        self.timeline = timeline
        for lane in list(self.lanes.values()):
            lane.timeline = timeline

    # --------------------------------------------------------------------------------- process sets
    def register_set(self, ps: ProcessSet) -> ProcessSet:
        """Collective over every rank of the job: create the set's communicator and lane."""
        from mpi4py import MPI

        ranks = self._set_ranks(ps)
        everyone = self.comm.allgather(ranks)
        if any(other != ranks for other in everyone):
            detail = "; ".join(f"rank {r}: {rs}" for r, rs in enumerate(everyone))
            raise HpcvodMismatchError(f"add_process_set() was called with different ranks: {detail}")
        for other in self.sets.values():
            if other.ranks == ranks:
                raise HpcvodInputError(f"a process set with ranks {ranks} already exists "
                                       f"(id {other.process_set_id})")
        me = self.info.rank
        sub = self.comm.Split(0 if me in ranks else MPI.UNDEFINED, me)
        return self._attach_set(ps, ranks, sub)

    def remove_set(self, process_set: ProcessSet) -> bool:
        """Unregister a process set (collective over every rank). Returns False if it was not registered."""
        set_id = process_set.process_set_id
        if set_id == 0:
            raise HpcvodInputError("the global process set cannot be removed")
        everyone = self.comm.allgather(set_id)
        if any(other != set_id for other in everyone):
            raise HpcvodMismatchError(f"remove_process_set() was called for different sets: ids {everyone}")
        if set_id is None or set_id not in self.sets:
            return False
        lane = self.lanes.pop(set_id, None)
        if lane is not None:
            lane.stop()
            lane.free()
        del self.sets[set_id]
        process_set._invalidate()
        return True

    def _attach_set(self, ps: ProcessSet, ranks: list[int], sub: Any) -> ProcessSet:
        from mpi4py import MPI

        from .engine import Lane
        set_id = self.next_set_id
        self.next_set_id += 1
        lane = None
        if sub != MPI.COMM_NULL:
            lane = Lane(sub, set_id, ranks, self.settings, self.timeline)
            self.lanes[set_id] = lane
        ps._register(set_id, ranks, self.info.rank, lane)
        self.sets[set_id] = ps
        return ps

    def _set_ranks(self, ps: ProcessSet | Sequence[int]) -> list[int]:
        if not isinstance(ps, ProcessSet):
            raise HpcvodInputError(f"expected a ProcessSet, got {ps!r}")
        if ps.process_set_id is not None:
            raise HpcvodInputError(f"{ps!r} is already registered")
        if ps.mpi_comm is not None:
            from mpi4py import MPI
            group = ps.mpi_comm.Get_group() if ps.mpi_comm != MPI.COMM_NULL else MPI.GROUP_EMPTY
            if group == MPI.GROUP_EMPTY:
                mine = []
            else:
                world = self.comm.Get_group()
                mine = group.Translate_ranks(list(range(group.Get_size())), world)
                world.Free()
                group.Free()
            # every rank must learn the members, including ranks outside the communicator
            return sorted({r for part in self.comm.allgather(list(mine)) for r in part})
        ranks = list(ps.ranks)
        size = self.info.size
        bad = [r for r in ranks if not 0 <= r < size]
        if bad or not ranks:
            raise HpcvodInputError(f"process set ranks {ranks} must be non-empty and within 0..{size - 1}")
        return ranks


def hard_exit(code: int) -> None:
    """Leave now with ``code`` (flushed output, no MPI_Finalize, which could wait for ranks that are gone)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
