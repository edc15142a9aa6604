"""What the sites-check unit tests share: a rank's record as sitecheck_worker.py writes it, the checks' statuses by
name (the sandbox profile is a fixture of conftest.py)."""

from __future__ import annotations


def record(launcher: int, host: str, size: int = 4, **extra) -> dict:
    rank = launcher
    base = {"hostname": host, "launcher_rank": launcher, "python": "/venv/bin/python", "python_version": "3.11",
            "env": {"NCCL_IB_DISABLE": "1"}, "launcher_env": {}, "frameworks": {},
            "hpcvod": {"file": "/x/hpcvod/__init__.py"}, "rank": rank, "size": size, "local_rank": rank % 2,
            "local_size": 2, "cross_rank": rank // 2, "cross_size": 2, "thread_level": "multiple",
            "mpi_library": "MPICH Version: 4", "mpi_flavour": "mpich", "hosts": ["n1", "n1", "n2", "n2"]}
    return {**base, **extra}


def statuses(checks) -> dict[str, str]:
    return {c.name: c.status for c in checks}
