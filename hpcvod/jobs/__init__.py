"""Jobs: the request (``spec.JobSpec``), the resolved plan (``plan.resolve`` -> ``LaunchPlan``), the rendered
script (``render``), job folders (``jobdir``) and submission (``submission``).

``hpcvod.jobs.submit(fn, *args, site=..., nodes=..., ...)`` is the Python API (``python_api``): it runs a
callable on every rank; ``job.result()`` is rank 0's return value, ``hpcvod.jobs.run(...)`` waits for it. It is imported on first use, so the CLI never pays for
submitit.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("submit", "run", "HpcvodExecutor", "HpcvodJob"):
        from hpcvod.jobs import python_api

        return getattr(python_api, name)
    raise AttributeError(f"module 'hpcvod.jobs' has no attribute {name!r}")
