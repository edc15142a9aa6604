"""Elastic training over MPI, the framework-neutral part of Horovod's ``hvd.elastic`` (docs/elastic.md).

``State`` / ``ObjectState`` keep a committed copy of what training needs in memory; ``run_fn`` wraps the training
function so that a failure of the world does not end the job:

* **Detection.** A rank that dies, or leaves ``run`` with an exception, is seen by the watchdog (its control
  connection closes, or it reports the exception) and by MPI itself (ULFM: ``MPI_ERR_PROC_FAILED``). Inside
  ``run``, the watchdog's verdict does not end the job (:func:`absorbs_failure`, called by
  ``session.Runtime.abort_job``): this rank marks its runtime failed, fails every pending collective with
  :class:`HpcvodRankFailureError` (a ``HorovodInternalError``) and revokes its communicators, so that a thread
  inside an MPI call returns instead of waiting for the dead rank.
* **Reset.** Every rank still alive shuts its runtime down, shrinks the old world's communicator (ULFM's
  ``MPI_Comm_shrink``, an agreement on who is alive), splits off the ranks that are leaving, and survivors call
  ``hvd.init(comm=...)`` over what is left. Only ``state`` crosses a reset: it is restored to its last commit
  and broadcast from the new rank 0.
* **Leaving.** A rank whose training function raises anything else takes part in the reset as a leaver, then
  finalizes MPI and exits: status 0 while other ranks train on, 1 when no rank is left (Open MPI's ULFM does not
  report a process that exits non-zero without MPI_Finalize as failed, so the survivors could not shrink past it).

This needs an MPI with ULFM: the Open MPI flavour started with ``mpirun --with-ft ulfm``. Under MPICH and Intel
MPI the survivors of a dead rank hang inside the collective, so ``run`` refuses to start there (one line).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import queue
import sys
import threading
from typing import Any, Callable

from collections import Counter

from . import context, elastic_job, elastic_link, elastic_restart, session
from .config import number
from .errors import (HostsUpdatedInterrupt, HpcvodConfigError, HpcvodError, HpcvodInputError,
                     HpcvodMismatchError, HpcvodNotInitializedError, HpcvodRankFailureError, HpcvodShutdownError,
                     HpcvodStallError, HpcvodWorldSizeError)
from .world import mpi_flavour

RESET_LIMIT_EXCEEDED_MESSAGE = elastic_link.RESET_LIMIT_EXCEEDED_MESSAGE
RESET_LIMIT = number("ELASTIC_RESET_LIMIT", 0, 1 << 31, "resets", whole=True, note="0 = no limit")

# Raised by this rank's own mistakes, not by a broken world: a reset would only repeat them.
_NOT_RECOVERABLE = (HpcvodInputError, HpcvodConfigError, HpcvodNotInitializedError, HpcvodMismatchError,
                    HpcvodWorldSizeError, HpcvodShutdownError, HpcvodStallError)


class HostUpdateResult:
    """Horovod's flags of a host change (``removed | added``), as ``State.on_hosts_updated`` receives them."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class WorkerNotificationManager:
    """Where host changes reach the states of ``run`` (Horovod's horovod.runner.elastic.worker). Nothing feeds
    it yet: hpcvod has no host discovery, so ``HostsUpdatedInterrupt`` comes only from a caller of
    :meth:`handle_hosts_updated`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: set[Any] = set()

    def init(self) -> None:
        """Horovod starts its notification service here; hpcvod has none to start."""

    def register_listener(self, listener: Any) -> None:
        with self._lock:
            self._listeners.add(listener)

    def remove_listener(self, listener: Any) -> None:
        with self._lock:
            self._listeners.discard(listener)

    def handle_hosts_updated(self, timestamp: float, update_res: int) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.on_hosts_updated(timestamp, update_res)


notification_manager = WorkerNotificationManager()


class State:
    """What training keeps in memory across resets (Horovod's ``horovod.common.elastic.State``).

    ``bcast_object(obj)``: broadcasts from rank 0; ``get_rank()``: this rank. Subclasses define ``save``,
    ``restore`` and ``sync``.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue = queue.Queue()
        self._last_updated_timestamp: float = 0
        self._reset_callbacks: list[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], Any]]) -> None:
        """Functions to call after every reset (e.g. to scale the learning rate with the new size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: int) -> None:
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Save the state in host memory (the copy a reset restores), then :meth:`check_host_updates`. When the
        world restarts instead of shrinking (runtime/elastic_restart.py), the copy also goes to node-local storage
        before this returns."""
        self.save()
        if _elastic.store is not None:
            _elastic.store.write(self)
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` on every rank at once when hosts were added or removed (a
        broadcast from rank 0, so that all ranks agree)."""
        prev_timestamp = last_timestamp = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, result = self._host_messages.get()
            if timestamp > last_timestamp:
                last_timestamp = timestamp
                update |= result
        prev_timestamp, self._last_updated_timestamp, update = \
            self._bcast_object((prev_timestamp, last_timestamp, update))
        if self._last_updated_timestamp > prev_timestamp:
            raise HostsUpdatedInterrupt(update == HostUpdateResult.removed)

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        """Called after a reset, before the state is synchronised."""

    def _snapshot(self) -> dict[str, Any]:
        """The committed copy as picklable values, for a world that restarts (runtime/elastic_restart.py)."""
        raise HpcvodConfigError(f"{type(self).__name__} cannot be kept on node-local storage for a restarted world "
                                f"(an MPI without ULFM, or a lost node): it defines no _snapshot()/_load_snapshot() "
                                f"(docs/elastic.md)")

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Make ``snapshot`` (from :meth:`_snapshot`) the committed copy; ``restore()`` then applies it."""
        self._snapshot()


class ObjectState(State):
    """Plain Python values given as keyword arguments, exposed as attributes, broadcast from rank 0 by
    ``sync`` (Horovod's ``ObjectState``)."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any) -> None:
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)

    def _snapshot(self) -> dict[str, Any]:
        return {"objects": dict(self._saved_state)}

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        self._saved_state = dict(snapshot["objects"])


# ------------------------------------------------------------------------------------------- the world
class _Elastic:
    """This process's elastic bookkeeping (one ``run`` at a time)."""

    def __init__(self) -> None:
        self.inside = False       # inside run(): a failure resets instead of ending the job
        self.start_rank = -1      # the rank this process had when run() first started
        self.host = os.environ.get("HOROVOD_HOSTNAME", "")   # the driver's name of this rank's host
        self.world_hosts: list[str] = []   # each rank's host in the current world (hpcvod run's driver only)
        self.store: elastic_restart.StateStore | None = None   # set while a restarting world trains


_elastic = _Elastic()


def absorbs_failure(rt: Any, reason: str) -> bool:
    """The elastic switch of the runtime's failure path (``session.Runtime.abort_job``): inside ``run``, a dead or
    failed rank breaks this world instead of ending the job. Returns whether it did."""
    if not _elastic.inside:
        return False
    if _elastic.store is not None:   # a restarting world ends as any job; the driver learns this rank is sound
        link = elastic_link.current_link()
        if link is not None:
            link.say("peer", reason)
        return False
    if not _break_world(rt, reason):   # an MPI error broke it first: still say which rank the watchdog saw go
        print(f"hpcvod: rank {rt.info.rank if rt.info else -1}: {reason}", file=sys.stderr, flush=True)
    return True



session.FAILURE_ABSORBERS.append(absorbs_failure)

def _break_world(rt: Any, reason: str,
                 then: str = "elastic: restoring the last commit and going on with the ranks left") -> bool:
    """Mark ``rt`` failed, fail its pending collectives and revoke its communicators (ULFM: MPI calls on them
    return at once on every rank); one line says ``reason`` and what happens ``then``. Returns False when it was
    already failed."""
    with rt.lock:
        if rt.failed is not None:
            return False
        rt.failed = reason
        rt.exit_code = session.EXIT_RANK_FAILURE
    rank = rt.info.rank if rt.info else -1
    print(f"hpcvod: rank {rank}: {reason}; {then}", file=sys.stderr, flush=True)
    error = HpcvodRankFailureError(f"rank {rank}: {reason}")
    for lane in list(rt.lanes.values()):
        lane.abort(error)
        _revoke(lane.comm)
    for comm in (rt.comm, rt.local_comm, rt.cross_comm):
        _revoke(comm)
    return True


def _revoke(comm: Any) -> None:
    if comm is None:
        return
    try:
        comm.Revoke()
    except Exception:   # already freed or revoked: nothing left to interrupt
        pass


def check_fault_tolerant_mpi() -> None:
    """One line, at the start of ``run``, where a dead rank would leave the survivors hanging instead of
    resetting: an MPI without ULFM, or Open MPI started without it."""
    from mpi4py import MPI
    flavour = mpi_flavour(MPI.Get_library_version())
    if flavour != "openmpi":
        raise HpcvodConfigError(
            f"hvd.elastic.run needs an MPI that survives a dead rank (ULFM): the Open MPI flavour started with "
            f"`mpirun --with-ft ulfm`; this job runs {flavour}, where the other ranks would hang in their next "
            f"collective (docs/elastic.md)")
    if os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() not in ("1", "true", "yes", "on"):
        raise HpcvodConfigError(
            "hvd.elastic.run needs Open MPI's fault tolerance: start the job with `mpirun --with-ft ulfm` "
            "(OMPI_MCA_mpi_ft_enable is not set, so a dead rank would end the job; docs/elastic.md)")


class ElasticJobEnded(SystemExit):
    """The driver ended the job at a reset (fewer hosts than --min-np for longer than --elastic-timeout, or the
    driver gone): said in one line on every rank, which then exits non-zero."""


def _reset_world(leaving: bool) -> tuple[int, bool, bool]:
    """Collective over every live rank of the current world: shut the runtime down, shrink the world to the
    live ranks, split off the leavers (and, under hpcvod run's driver, the ranks of hosts no longer offered),
    spawn ranks on the hosts the driver adds and, for a rank that stays, initialise the runtime over the new
    world. Returns (ranks that stay, whether this rank stays, whether ranks were spawned)."""
    from mpi4py import MPI
    rt = context.runtime()
    # a failed world's communicator is revoked and kept by shutdown(); a healthy one (hosts changed) is freed
    old = rt.comm if rt.failed is not None else rt.comm.Dup()
    context.shutdown()
    live = old.Shrink()
    stay, stayers, spawn = _next_world(live, leaving)
    staying = len(stayers)
    rest = live.Split(0 if stay else MPI.UNDEFINED, live.Get_rank())
    live.Free()
    if stay:
        world = rest
        if spawn:
            world = _spawn(MPI, rest, stayers + spawn)
            rest.Free()
        if _elastic.world_hosts:
            _elastic.world_hosts = world.allgather(_elastic.host)
        context.init(comm=world)
        world.Free()   # init() works on its own duplicate
    return staying, stay, bool(spawn)


def _next_world(live: Any, leaving: bool) -> tuple[bool, list[str], list[str]]:
    """Who stays and what is spawned, agreed by every rank of ``live``: (this rank stays, the host of each rank
    that stays, in rank order, the host of each rank to spawn). Without hpcvod run's driver every rank that is
    not leaving stays and nothing is spawned; with it, live.rank 0 asks the driver which hosts to use (and names
    the hosts of ranks that died or failed, which the driver blacklists)."""
    entries = live.allgather((_elastic.host, leaving))
    link = elastic_link.current_link()
    if link is None or not _elastic.world_hosts:
        return not leaving, [host for host, gone in entries if not gone], []
    lost = Counter(_elastic.world_hosts) - Counter(host for host, _ in entries)
    failed = list(lost.elements()) + [host for host, gone in entries if gone]
    if all(gone for _, gone in entries):   # nobody to plan for: only the blacklist learns of it
        if live.Get_rank() == 0:
            link.report_failed(failed)
        return False, [], []
    reply = None
    if live.Get_rank() == 0:
        reply = link.plan([host for host, gone in entries if not gone], failed)
    reply = live.bcast(reply)
    if "error" in reply:
        print(f"hpcvod: rank {live.Get_rank()}: {reply['error']}", file=sys.stderr, flush=True)
        _exit_after_finalize(1)
        raise ElasticJobEnded(1)
    offered = {host: slots for host, slots in reply["hosts"]}
    most = reply.get("max_np") or sum(offered.values())
    used: Counter = Counter()
    stays = []
    for host, gone in entries:   # ranks keep their order; a host keeps at most its slots
        keep = not gone and used[host] < offered.get(host, 0) and sum(used.values()) < most
        used[host] += keep
        stays.append(keep)
    spawn = []
    for host, slots in reply["hosts"]:
        spawn += [host] * max(0, min(slots - used[host], most - sum(used.values()) - len(spawn)))
    return stays[live.Get_rank()], [host for (host, _), keep in zip(entries, stays) if keep], spawn


def _spawn(MPI: Any, rest: Any, rank_hosts: list[str]) -> Any:
    """Start a rank on each host past ``rest``'s in ``rank_hosts`` (MPI_Comm_spawn, one process per host entry),
    each running the job's program with its Horovod variables, and merge them into one communicator after the
    ranks of ``rest`` (which keep their state in memory; the new ranks get it from ``state.sync()``)."""
    program = json.loads(os.environ[elastic_link.COMMAND_VARIABLE])
    first = rest.Get_size()
    started_on = set(elastic_link.expand_slots(os.environ[elastic_link.SLOTS_VARIABLE]))   # mpirun's hosts
    args, infos = [], []
    for rank in range(first, len(rank_hosts)):
        args.append(["-m", "hpcvod.runtime.elastic_start", "--assign", f"{rank}:{','.join(rank_hosts)}", "--",
                     *program])
        info = MPI.Info.Create()
        info.Set("host", rank_hosts[rank])
        if rank_hosts[rank] not in started_on:   # a host mpirun was not given: PRRTE adds it (ssh, or here)
            info.Set("PMIX_ADD_HOST", rank_hosts[rank])
        infos.append(info)
    if rest.Get_rank() == 0:
        print(f"hpcvod: rank 0: elastic: starting {len(args)} rank(s) on {', '.join(rank_hosts[first:])}",
              file=sys.stderr, flush=True)
    inter = rest.Spawn_multiple([sys.executable] * len(args), args, [1] * len(args), infos, root=0)
    for info in infos:
        info.Free()
    merged = inter.Merge(high=False)
    inter.Disconnect()   # the merged communicator keeps the ranks connected; Open MPI hangs at exit otherwise
    return merged


def _exit_after_finalize(code: int) -> None:
    """Arrange this process's exit with ``code`` after MPI_Finalize, which Open MPI needs to count it as gone
    rather than failed (registered last, so it runs before mpi4py's and context's exit hooks)."""
    def finalize_and_exit() -> None:
        from mpi4py import MPI
        if not MPI.Is_finalized():
            MPI.Finalize()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    atexit.register(finalize_and_exit)


def _leave(exc: BaseException) -> None:
    """This rank's training function raised: tell the others, take part in their reset, and arrange this
    process's exit (after MPI_Finalize, which Open MPI needs to count it as gone rather than failed)."""
    if not context.is_initialized():   # no world to leave
        return
    rt = context.runtime()
    me = rt.info.rank if rt.info else -1
    reason = f"rank {me} left the elastic job: {type(exc).__name__}: {exc}"
    if _break_world(rt, reason, "it leaves once the other ranks have rebuilt their world"):
        if rt.watchdog is not None:
            rt.watchdog.report_failure(reason)
    else:   # its world had already failed: still say why this rank leaves
        print(f"hpcvod: rank {me}: {reason}", file=sys.stderr, flush=True)
    staying, _, _ = _reset_world(leaving=True)
    if staying == 0:
        print(f"hpcvod: rank {me} (rank {_elastic.start_rank} at start): no rank is left in the elastic job; "
              f"it ends with this rank's error", file=sys.stderr, flush=True)
    _exit_after_finalize(0 if staying else (exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int)
                                            else 1))


def run_fn(func: Callable[..., Any], reset: Callable[[], None] | None = None) -> Callable[..., Any]:
    """Horovod's ``run_fn``: ``func(state, ...)`` wrapped so that a failure of the world restores ``state``'s
    last commit, rebuilds the world from the ranks still alive and calls ``func`` again (``reset``: an extra
    step after the world is rebuilt, before ``state.on_reset()``)."""
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        generation = elastic_restart.generation()
        if generation is not None:
            return _run_restarting(func, state, generation, args, kwargs)
        check_fault_tolerant_mpi()
        limit = RESET_LIMIT.read(0)
        notification_manager.init()
        notification_manager.register_listener(state)
        if _elastic.start_rank < 0:
            _elastic.start_rank = context.rank()
        if not _elastic.world_hosts:   # a rank spawned at a reset learnt its world's hosts when it joined
            _elastic.world_hosts = elastic_link.joined_world_hosts
        if elastic_link.driver_link(_elastic.host, notification_manager.handle_hosts_updated) is not None \
                and not _elastic.world_hosts:   # the first world: the driver's slots, in rank order
            _elastic.world_hosts = elastic_link.expand_slots(os.environ[elastic_link.SLOTS_VARIABLE])
        elastic_job.world_changed(0)   # a batch job's record for `hpcvod status` (runtime/elastic_job.py)
        was_inside, _elastic.inside = _elastic.inside, True
        resets = 0
        skip_sync = False
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HostsUpdatedInterrupt as interrupt:
                    skip_sync = interrupt.skip_sync
                except HpcvodError as exc:   # HorovodInternalError
                    if isinstance(exc, _NOT_RECOVERABLE):
                        _leave(exc)
                        raise
                    _break_world(context.runtime(), f"a collective failed: {exc}")
                    state.restore()
                    skip_sync = False
                except BaseException as exc:
                    _leave(exc)
                    raise
                if limit and resets >= limit:
                    raise HpcvodRankFailureError(RESET_LIMIT_EXCEEDED_MESSAGE.format(limit))
                resets += 1
                _, stays, grew = _reset_world(leaving=False)
                if not stays:   # its host is no longer offered (removed, or more ranks than slots): it ends
                    print(f"hpcvod: rank {_elastic.start_rank} at start: its host {_elastic.host} is no longer "
                          f"in the elastic job; it ends", file=sys.stderr, flush=True)
                    _exit_after_finalize(0)
                    raise SystemExit(0)
                skip_sync = skip_sync and not grew   # new ranks take the state from sync()
                elastic_job.world_changed(resets)   # recorded; too few nodes left ends the job
                if reset is not None:
                    reset()
                state.on_reset()
        finally:
            _elastic.inside = was_inside
            notification_manager.remove_listener(state)
    return wrapper


def _run_restarting(func: Callable[..., Any], state: State, generation: int, args: tuple, kwargs: dict) -> Any:
    """``run`` in a world that the elastic driver restarts instead of shrinking (runtime/elastic_restart.py):
    resume from the newest node-local commit, train, and on a host change write the state and end this world
    with EXIT_RESTART. A dead rank ends the world through the runtime's failure path (every rank errors)."""
    rt = context.runtime()
    me = context.rank()
    if _elastic.start_rank < 0:
        _elastic.start_rank = me
    host = _elastic.host or rt.info.hostname
    link = elastic_link.driver_link(host, notification_manager.handle_hosts_updated)
    # the driver's hosts may be names of one machine (tests): the first rank of each name writes its copy
    store = elastic_restart.StateStore(host, int(os.environ.get("HOROVOD_LOCAL_RANK", rt.info.local_rank)))
    notification_manager.init()
    notification_manager.register_listener(state)
    was_inside, _elastic.inside = _elastic.inside, True
    try:
        serial = elastic_restart.resume(state, store, me) if generation else -1
        elastic_job.world_changed(generation)
        if generation:
            if me == 0:
                print(f"hpcvod: rank 0: elastic: world {generation} of {context.size()} ranks resumes from "
                      + (f"commit {serial}" if serial >= 0 else "the start (no host kept a commit)"),
                      file=sys.stderr, flush=True)
            state.on_reset()
        if serial < 0:
            state.sync()
        _elastic.store = store
        try:
            result = func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            state.save()   # carried over as it is, as Horovod's reset does
            store.write(state)
            if link is not None:
                link.say("restart", "hosts updated")
            if me == 0:
                print("hpcvod: rank 0: elastic: hosts changed; the state is on node-local storage and this world "
                      "ends for the driver to start the next", file=sys.stderr, flush=True)
            raise SystemExit(elastic_restart.EXIT_RESTART) from None
        except BaseException as exc:
            if rt.failed is not None:   # the world failed (its line is printed): no traceback of it on every rank
                raise SystemExit(rt.exit_code or session.EXIT_RANK_FAILURE) from None
            if link is not None and not isinstance(exc, SystemExit):
                link.say("failed", f"{type(exc).__name__}: {exc}")   # this rank's own error: its host is suspect
            raise
        if link is not None:
            link.say("done", "")
        store.remove()
        return result
    finally:
        _elastic.store = None
        _elastic.inside = was_inside
        notification_manager.remove_listener(state)


__all__ = ["State", "ObjectState", "run_fn", "notification_manager", "WorkerNotificationManager",
           "HostUpdateResult", "RESET_LIMIT_EXCEEDED_MESSAGE", "absorbs_failure", "check_fault_tolerant_mpi"]
