"""Horovod's ``horovod.common.util``: the helpers its scripts and tests import from it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from hpcvod.runtime import ccl_built, ddl_built, gloo_built, mpi_built, nccl_built

__all__ = ["is_version_greater_equal_than", "env", "mpi_built", "gloo_built", "nccl_built", "ddl_built",
           "ccl_built"]


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """``ver >= target`` (PEP 440 versions; ``target`` of the form X.Y.Z), as Horovod compares framework versions."""
    from packaging.version import Version   # a dependency of TensorFlow and pip, not of hpcvod itself
    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError(f"is_version_greater_equal_than() takes two strings, got {ver!r} and {target!r}")
    if len(target.split(".")) != 3:
        raise ValueError(f"target version {target!r}: expected the form X.Y.Z")
    return Version(ver) >= Version(target)


@contextmanager
def env(**variables: str | None) -> Iterator[None]:
    """Sets environment variables for the ``with`` block and restores the previous values afterwards (a
    None value leaves that variable as it is)."""
    variables = {name: value for name, value in variables.items() if value is not None}
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update({name: str(value) for name, value in variables.items()})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
