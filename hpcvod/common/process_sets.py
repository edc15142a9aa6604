"""Horovod's ``horovod.common.process_sets``: process sets and their registration."""

from hpcvod.runtime import add_process_set, global_process_set, remove_process_set
from hpcvod.runtime.process_sets import ProcessSet

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]
