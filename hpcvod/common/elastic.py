"""Horovod's ``horovod.common.elastic``: ``State``, ``ObjectState``, ``run_fn`` and the notification manager
(hpcvod/runtime/elastic.py; docs/elastic.md)."""

from hpcvod.runtime.elastic import (HostUpdateResult, ObjectState, State, WorkerNotificationManager,  # noqa: F401
                                    notification_manager, run_fn)

__all__ = ["State", "ObjectState", "run_fn", "notification_manager", "WorkerNotificationManager",
           "HostUpdateResult"]
