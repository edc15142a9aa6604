"""hpcvod: Horovod-style distributed training that knows the batch scheduler.

Two halves that meet only in a rendered batch script and a few environment variables
(docs/contract.md): the submission side (``hpcvod.sites``, ``hpcvod.jobs``,
``hpcvod.schedulers``, ``hpcvod.launchers``, ``hpcvod.cli``) and the worker side
(``hpcvod.runtime`` and ``hpcvod.frameworks``). Importing this package imports neither.
"""

__version__ = "0.1.0"
