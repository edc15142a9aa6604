"""Starting MPI with a deadline: ``from mpi4py import MPI`` runs MPI_Init, which can hang for ever.

A PMI service that never answers, a business-card exchange cut short (docs/sites.md has one seen on Slurm), a
rank that never started: MPI_Init then blocks inside C with the GIL held, so no Python thread or signal
handler of the rank can notice, and on a cluster the job holds its nodes until the time limit with nothing in
its log. A small watcher process, started just before MPI_Init, ends the rank with one line when MPI_Init has
not returned after ``HPCVOD_INIT_TIMEOUT`` seconds (0: wait for ever); it leaves as soon as its pipe closes.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from types import ModuleType
from typing import Any, Callable

from .config import Settings
from .errors import HpcvodError
from .world import hostname, launcher_rank

# The watcher: stdlib only, started with -I -S so that it starts in milliseconds whatever the environment.
# select() returns on EOF, i.e. when the rank closes the pipe (MPI_Init returned) or exits.
_WATCHER = r"""
import os, select, signal, sys, time
pid, timeout, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if select.select([0], [], [], timeout)[0]:
    sys.exit(0)
sys.stderr.write(message + "\n")
sys.stderr.flush()
for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        sys.exit(0)
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if select.select([0], [], [], 0.1)[0]:
            sys.exit(0)
"""

ABORT_FLUSH_SECONDS = 0.5


def _abort_on_uncaught(etype: type, value: BaseException, tb: Any) -> None:
    """sys.excepthook from MPI's start until init() completes: an uncaught exception on one rank (an import
    that fails on one node, a bad setting) would leave the other ranks in init()'s collectives for ever, so
    it ends the whole MPI job (MPI_Abort), naming this rank. init() hands over to the watchdog's hook."""
    _previous_hook(etype, value, tb)
    MPI = sys.modules.get("mpi4py.MPI")
    try:
        if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
            return
        rank = MPI.COMM_WORLD.Get_rank()
    except Exception:
        return
    abort_world(MPI.COMM_WORLD, f"hpcvod: rank {rank} on {hostname()}: uncaught {etype.__name__} before "
                                f"hvd.init() completed; ending the whole MPI job (MPI_Abort) so that no rank waits "
                                f"for this one")


def abort_world(world: Any, line: str) -> None:
    """Print ``line`` and end every rank of ``world`` (MPI_Abort, which launchers carry out on every rank, a
    stopped one included); this process leaves in any case."""
    print(line, file=sys.stderr, flush=True)
    time.sleep(ABORT_FLUSH_SECONDS)   # the launcher kills every rank at once: let it forward the line first
    try:
        world.Abort(1)
    finally:
        os._exit(1)   # an MPI_Abort that could not reach the launcher


_previous_hook: Callable[..., Any] = sys.__excepthook__


def arm_abort_hook() -> None:
    """Install :func:`_abort_on_uncaught` (once)."""
    global _previous_hook
    if sys.excepthook is not _abort_on_uncaught:
        _previous_hook = sys.excepthook
        sys.excepthook = _abort_on_uncaught


def disarm_abort_hook() -> None:
    """init() completed: uncaught exceptions go to the hook that was there before (the watchdog takes over)."""
    if sys.excepthook is _abort_on_uncaught:
        sys.excepthook = _previous_hook


def start_mpi(timeout: float | None = None) -> ModuleType:
    """``mpi4py.MPI``, running MPI_Init under a deadline of ``timeout`` seconds if MPI is not started yet.

    ``from mpi4py import MPI`` starts MPI unless the script set ``mpi4py.rc.initialize = False`` (to leave that
    to the training library, as Horovod's tests do): then this starts it with ``MPI_Init_thread`` at
    MPI_THREAD_MULTIPLE (the level Horovod asks for; the engine calls MPI from its own thread) and finalizes it
    at exit, after hpcvod's own exit handling. ``timeout`` defaults to ``HPCVOD_INIT_TIMEOUT``; 0 waits for
    ever. When it passes, the rank prints one line to stderr and is terminated (SIGTERM, then SIGKILL after 5 s).
    """
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized():
        if MPI.Is_finalized():
            raise HpcvodError("hvd.init(): MPI has already been finalized in this process (MPI_Finalize was "
                              "called) and MPI cannot be started twice; call hvd.init() before MPI.Finalize()")
        return MPI
    if timeout is None:
        timeout = Settings.from_env().init_timeout_seconds
    rank = launcher_rank()
    watcher = deadline(timeout, (
        f"hpcvod: rank {'?' if rank is None else rank} on {hostname()}: MPI_Init has not returned after "
        f"{timeout:g} s, so this rank stops; the launcher's PMI/PMIx service or the network between the "
        f"ranks did not answer (the launcher's own errors, if any, are above: a wrong `srun --mpi=` "
        f"plugin, a rank that never started); HPCVOD_INIT_TIMEOUT sets the limit, 0 waits for ever"))
    if os.environ.get("OMPI_MCA_mpi_ft_enable") == "1":   # Open MPI's ULFM (mpirun --with-ft ulfm sets it)
        # read by MPI_Init below: without it, the ranks that survive a failure wait for ever in MPI_Finalize's
        # fence for the dead ones (seen with elastic jobs, on one machine and across nodes)
        os.environ.setdefault("OMPI_MCA_async_mpi_finalize", "1")
    try:
        from mpi4py import MPI
        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
            # hpcvod's exit handler (registered later by init(), so run earlier) leaves without finalizing
            # when the job failed; otherwise this ends MPI as mpi4py would have, had it started it
            atexit.register(_finalize_started_mpi, MPI)
    finally:
        release(watcher)
    return MPI


def _finalize_started_mpi(MPI: ModuleType) -> None:
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


def deadline(timeout: float, message: str) -> subprocess.Popen | None:
    """A watcher that prints ``message`` and ends this process unless :func:`release` comes within
    ``timeout`` seconds (for C calls that block with the GIL held, where no Python timer can fire)."""
    if timeout <= 0 or not sys.executable:
        return None
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER, str(os.getpid()), str(timeout), message],
                            stdin=subprocess.PIPE, close_fds=True)


def release(watcher: subprocess.Popen | None) -> None:
    if watcher is not None:
        watcher.stdin.close()   # EOF: the watcher leaves at once
        watcher.wait()
