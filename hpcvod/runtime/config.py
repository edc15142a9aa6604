"""Runtime settings from the environment.

Every setting is read from ``HPCVOD_<NAME>`` and, for drop-in use of Horovod job scripts, also from
``HOROVOD_<NAME>``; the ``HPCVOD_`` spelling wins when both are set. docs/contract.md and docs/runtime.md
list them. A malformed value raises :class:`~hpcvod.runtime.errors.HpcvodConfigError` naming the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, TypeVar

from .errors import HpcvodConfigError, first_of

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


def lookup(name: str, env: Optional[Mapping[str, str]] = None) -> tuple[Optional[str], Optional[str]]:
    """Return ``(variable, value)`` for setting ``name`` (``HPCVOD_<name>`` first, then ``HOROVOD_<name>``)."""
    env = os.environ if env is None else env
    for prefix in ("HPCVOD_", "HOROVOD_"):
        var = prefix + name
        if var in env:
            return var, env[var]
    return None, None


def _parse(name: str, default: T, convert: Callable[[str], T], expected: str,
           env: Optional[Mapping[str, str]]) -> T:
    var, raw = lookup(name, env)
    if var is None or raw is None:
        return default
    try:
        return convert(raw.strip())
    except (ValueError, TypeError):
        raise HpcvodConfigError(f"{var}={raw!r}: expected {expected}") from None


def _non_negative_int(raw: str) -> int:
    value = int(float(raw)) if raw.replace(".", "", 1).isdigit() else int(raw)
    if value < 0:
        raise ValueError(raw)
    return value


def _non_negative_float(raw: str) -> float:
    value = float(raw)
    if not value >= 0:  # also rejects NaN
        raise ValueError(raw)
    return value


def _bool(raw: str) -> bool:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(raw)


def _gpu_operations(raw: str) -> str:
    low = raw.lower() or "auto"
    if low not in ("auto", "nccl", "mpi"):
        raise ValueError(raw)
    return low


# Settings every rank's engine must share (field -> setting name): ranks that fuse, cache, time or route
# collectives differently pair the wrong data or wait for each other for ever. init() compares them.
SHARED_SETTINGS = {"fusion_threshold": "FUSION_THRESHOLD", "cycle_time_ms": "CYCLE_TIME",
                   "cache_capacity": "CACHE_CAPACITY", "hierarchical_allreduce": "HIERARCHICAL_ALLREDUCE",
                   "gpu_operations": "GPU_OPERATIONS", "watchdog": "WATCHDOG"}


def settings_disagreement(per_rank: list[tuple]) -> Optional[str]:
    """One line naming every shared setting whose value differs between ranks (``Settings.shared()`` of each
    rank, in rank order), or None when they agree."""
    problems = []
    for i, name in enumerate(SHARED_SETTINGS.values()):
        ranks_of: dict[object, list[int]] = {}
        for rank, values in enumerate(per_rank):
            ranks_of.setdefault(values[i], []).append(rank)
        if len(ranks_of) > 1:
            where = "; ".join(f"{value!r} on {_span(ranks)}" for value, ranks in ranks_of.items())
            problems.append(f"HPCVOD_{name} ({where})")
    if not problems:
        return None
    return ("runtime settings differ between ranks: " + ", ".join(problems) +
            "; every rank must run with the same value (set it in the job's environment, not per rank)")


def _span(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + first_of([str(r) for r in ranks], 8)


@dataclass(frozen=True)
class Settings:
    """The engine's knobs, resolved once at ``init()``."""

    fusion_threshold: int = 128 * 1024 * 1024
    cycle_time_ms: float = 0.0
    cache_capacity: int = 1024
    timeline: Optional[str] = None
    timeline_mark_cycles: bool = False
    stall_check_disable: bool = False
    stall_check_time_seconds: float = 60.0
    stall_shutdown_time_seconds: float = 0.0
    hierarchical_allreduce: bool = False
    gpu_operations: str = "auto"
    watchdog: bool = True
    heartbeat_timeout_seconds: float = 30.0
    init_timeout_seconds: float = 300.0

    def shared(self) -> tuple:
        """The values of SHARED_SETTINGS, for comparison across ranks."""
        return tuple(getattr(self, field) for field in SHARED_SETTINGS)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "Settings":
        d = cls()
        _, timeline = lookup("TIMELINE", env)
        return cls(
            fusion_threshold=_parse("FUSION_THRESHOLD", d.fusion_threshold, _non_negative_int,
                                    "a non-negative number of bytes (0 disables fusion)", env),
            cycle_time_ms=_parse("CYCLE_TIME", d.cycle_time_ms, _non_negative_float,
                                 "a non-negative number of milliseconds", env),
            cache_capacity=_parse("CACHE_CAPACITY", d.cache_capacity, _non_negative_int,
                                  "a non-negative number of entries (0 disables the response cache)", env),
            timeline=timeline or None,
            timeline_mark_cycles=_parse("TIMELINE_MARK_CYCLES", d.timeline_mark_cycles, _bool, "0 or 1", env),
            stall_check_disable=_parse("STALL_CHECK_DISABLE", d.stall_check_disable, _bool, "0 or 1", env),
            stall_check_time_seconds=_parse("STALL_CHECK_TIME_SECONDS", d.stall_check_time_seconds,
                                            _non_negative_float, "a non-negative number of seconds", env),
            stall_shutdown_time_seconds=_parse("STALL_SHUTDOWN_TIME_SECONDS", d.stall_shutdown_time_seconds,
                                               _non_negative_float,
                                               "a non-negative number of seconds (0 = never)", env),
            hierarchical_allreduce=_parse("HIERARCHICAL_ALLREDUCE", d.hierarchical_allreduce, _bool,
                                          "0 or 1", env),
            gpu_operations=_parse("GPU_OPERATIONS", d.gpu_operations, _gpu_operations,
                                  "one of auto, nccl, mpi", env),
            watchdog=_parse("WATCHDOG", d.watchdog, _bool, "0 or 1", env),
            heartbeat_timeout_seconds=_parse("HEARTBEAT_TIMEOUT_SECONDS", d.heartbeat_timeout_seconds,
                                             _non_negative_float, "a non-negative number of seconds", env),
            init_timeout_seconds=_parse("INIT_TIMEOUT", d.init_timeout_seconds, _non_negative_float,
                                        "a non-negative number of seconds (0 = wait for ever)", env),
        )
