"""The one exception family of the hpcvod runtime.

Every error the runtime raises on purpose is an :class:`HpcvodError`. Subclasses say what went wrong so
that training scripts can react (or not) precisely:

* :class:`HpcvodNotInitializedError`  - a call before ``init()`` or after ``shutdown()``
* :class:`HpcvodConfigError`          - a bad ``HPCVOD_*`` / ``HOROVOD_*`` setting
* :class:`HpcvodInputError`           - a bad argument on this rank (dtype, root, splits...)
* :class:`HpcvodWorldSizeError`       - the MPI world is not what the launcher promised ("N singletons")
* :class:`HpcvodMismatchError`        - ranks submitted the same collective with different arguments
* :class:`HpcvodRankFailureError`     - another rank died or failed; the job is being aborted
* :class:`HpcvodStallError`           - the stall inspector's shutdown time was reached
* :class:`HpcvodShutdownError`        - an operation was still pending when the runtime shut down

Horovod's names for drop-in ``except`` clauses: ``HorovodInternalError`` (= :class:`HpcvodError`) and
``HostsUpdatedInterrupt`` (elastic training's interrupt, deliberately outside the family).
"""

from __future__ import annotations


class HpcvodError(RuntimeError):
    """Base class of every error raised by :mod:`hpcvod.runtime`."""


class HpcvodNotInitializedError(HpcvodError, ValueError):
    """The runtime is not initialised: call ``hvd.init()`` first."""


class HpcvodConfigError(HpcvodError, ValueError):
    """An ``HPCVOD_*`` (or ``HOROVOD_*``) environment setting has an invalid value."""


class HpcvodInputError(HpcvodError, ValueError):
    """An argument of a collective is invalid on this rank (detected before any communication)."""


class HpcvodWorldSizeError(HpcvodError):
    """The MPI world this process sees differs from what the launcher promised."""


class HpcvodMismatchError(HpcvodError):
    """Ranks submitted the same collective with different shape, dtype, operation or root.

    Raised on every rank that submitted the collective; no data was exchanged.
    """


class HpcvodRankFailureError(HpcvodError):
    """Another rank died or failed; this rank cannot complete collectives any more."""


class HpcvodStallError(HpcvodRankFailureError):
    """Some ranks never submitted a collective within ``HPCVOD_STALL_SHUTDOWN_TIME_SECONDS``."""


class HpcvodShutdownError(HpcvodError):
    """The runtime was shut down while this operation was pending."""


def first_of(items: "list[str]", limit: int) -> str:
    """``a, b, c and N more``: a list in an error message, cut at ``limit`` items."""
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


# Horovod's name for "a collective failed because the job is broken", for drop-in ``except`` clauses.
HorovodInternalError = HpcvodError


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic interrupt: the job's hosts changed, so training resets without restoring the last
    commit (``skip_sync``: the state need not be synchronised afterwards). Not an :class:`HpcvodError` on
    purpose: an interrupt, not a failure, and ``except HorovodInternalError`` must not catch it."""

    def __init__(self, skip_sync: bool) -> None:
        super().__init__(f"the job's hosts changed (skip_sync={skip_sync})")
        self.skip_sync = skip_sync

__all__ = [
    "HpcvodError",
    "HpcvodNotInitializedError",
    "HpcvodConfigError",
    "HpcvodInputError",
    "HpcvodWorldSizeError",
    "HpcvodMismatchError",
    "HpcvodRankFailureError",
    "HpcvodStallError",
    "HpcvodShutdownError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
]
