"""Horovod's ``horovod.runner.common`` path: only ``util.env.get_env_rank_and_size`` (hpcvod/runner/__init__.py)."""
