"""``hpcvod.common``: Horovod's ``horovod.common`` module paths (exceptions, process sets, basics, util)."""
