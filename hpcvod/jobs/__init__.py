"""Jobs: the request (``spec.JobSpec``), the resolved plan (``plan.resolve`` -> ``LaunchPlan``), the rendered
script (``render``), job folders (``jobdir``) and submission (``submission``).

``hpcvod.jobs.submit(fn, *args, site=..., nodes=..., ...)`` is the Python API (``python_api``): it runs a
callable on every rank and returns rank 0's result. It is imported on first use, so the CLI never pays for
submitit.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("submit", "HpcvodExecutor", "HpcvodJob"):
        from hpcvod.jobs import python_api

        return getattr(python_api, name)
    raise AttributeError(f"module 'hpcvod.jobs' has no attribute {name!r}")
