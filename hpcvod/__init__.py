"""hpcvod: Horovod-style distributed training that knows the batch scheduler.

Two halves that meet only in a rendered batch script and a few environment variables
(docs/contract.md): the submission side (``hpcvod.sites``, ``hpcvod.jobs``,
``hpcvod.schedulers``, ``hpcvod.launchers``, ``hpcvod.cli``) and the worker side
(``hpcvod.runtime`` and ``hpcvod.frameworks``). Importing this package imports neither.
"""

__version__ = "0.1.0"


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``hpcvod.run`` (Horovod's ``horovod.run``), loaded on first use so that ``import hpcvod`` stays light."""
    if name in ("run", "RunError"):
        from hpcvod import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'hpcvod' has no attribute {name!r}")
