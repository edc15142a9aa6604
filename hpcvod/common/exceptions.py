"""Horovod's ``horovod.common.exceptions``: the runtime's errors under Horovod's names (hpcvod/runtime/errors.py)."""

from hpcvod.runtime.errors import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]
